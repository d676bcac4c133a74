"""`train.py --dry-run`: the whole pre-flight and the Ray placement plan, with nothing started.

Parses the flags, runs validate() (and, on the cluster, the data / hook / checkpoint / engine
checks of slime.ray.runtime.preflight), then prints where each trainer rank and rollout engine
would be placed. Loads no model, imports neither torch nor Ray, reserves nothing.

`environment=False` judges the flags alone, as on the target cluster (no file or installed-package
checks): the lab and the contract test use it for scripts meant for another machine.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from slime.config import Config


@dataclass
class DryRun:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    plan: list = field(default_factory=list)  # slime.ray.placement.Slot
    layout: list = field(default_factory=list)  # slime.ray.placement.RankLayout (Megatron backend)
    cfg: Config | None = None

    @property
    def ok(self) -> bool:
        return not self.errors


def _problem(e: Exception) -> str:
    """The exception's message, keeping its refusal code (slime.refusals.Refusal) when it has one."""
    return e.args[0] if len(e.args) == 1 and isinstance(e.args[0], str) else str(e)


def server_groups(cfg: Config, environment: bool = True, given: list[dict] | None = None) -> list:
    """The policy's SGLang server groups: from --sglang-config (read on the cluster), from `given`
    (the groups of a sglang.yaml not written yet: the lab's), or the default layout of the flags."""
    from slime.rollout.engines.sglang import ServerGroup, canonical, default_groups, load_server_groups

    c = cfg.cluster
    if given is not None:
        return [ServerGroup(g["worker_type"], int(g["num_gpus"]), int(g["num_gpus_per_engine"]),
                            {canonical(k): v for k, v in (g.get("overrides") or {}).items()}) for g in given]
    if c.sglang_config:
        return load_server_groups(c.sglang_config, cfg.model.hf_checkpoint) if environment else []
    return default_groups(c.num_rollout_units, c.rollout_num_gpus_per_engine, c.prefill_num_servers)


def translation_errors(cfg: Config, groups: list) -> list[str]:
    """What the SGLang launcher would refuse in these groups and --sglang-* flags (SGL-1..7)."""
    from slime.rollout.engines.sglang import TranslationError, plan_engines

    policy = [g for g in groups if g.update_weights] or groups
    if any(g.num_gpus_per_engine < 1 for g in policy):
        return []  # validate() already names the engine size
    try:
        plan_engines(policy, cfg.sglang, server_concurrency=cfg.rollout.server_concurrency,
                     rollout_gpus=cfg.cluster.num_rollout_units)
    except TranslationError as e:
        return [_problem(e)]
    return []


def engine_roles(cfg: Config, environment: bool = True, groups: list | None = None) -> list[str]:
    """Each engine's group (regular / prefill / decode), as the SGLang launcher will plan them."""
    c = cfg.cluster
    embedded_pd = c.rollout_backend == "embedded" and bool(c.sglang_config or c.prefill_num_servers)  # ray/runtime.py
    if c.external or (c.rollout_backend != "sglang" and not embedded_pd) or c.rollout_num_gpus_per_engine < 1:
        return []
    from slime.rollout.engines.sglang import TranslationError

    try:
        groups = groups if groups is not None else server_groups(cfg, environment)
    except (TranslationError, OSError, ValueError):
        return []
    groups = [g for g in groups if g.update_weights] or groups
    roles: list[str] = []
    for g in groups:
        role = "engine" if g.worker_type == "regular" else g.worker_type
        roles += [role] * max(1, g.num_gpus // max(g.num_gpus_per_engine, 1))
    return roles


def dry_run(argv: Sequence[str], async_mode: bool = False, environment: bool = True,
            groups: list[dict] | None = None) -> DryRun:
    """`groups`: the server groups of a sglang.yaml that --sglang-config will name but that is not
    written yet (the lab judges before rendering); judged by the same SGLang translation."""
    from slime.args import UsageError, parse_args, validate, warnings
    from slime.ray.placement import placement_plan

    try:
        cfg = parse_args(argv, async_mode=async_mode)
    except UsageError as e:
        return DryRun(errors=list(e.problems))
    out = DryRun(cfg=cfg)
    if environment:
        from slime.ray.runtime import PreflightError, preflight

        try:
            # validate() + data, checkpoints, external engines, SGLang translation; hooks are located
            # by `check` on disk, never imported here (a dry run executes nothing of the user's)
            preflight(cfg, load_hooks=False)
        except PreflightError as e:
            out.errors = list(e.problems)
    else:
        out.errors = validate(cfg, environment=False)
    sglang = cfg.cluster.rollout_backend == "sglang" and not cfg.cluster.external
    parsed = None
    if sglang and cfg.cluster.rollout_num_gpus_per_engine >= 1 and (not environment or groups is not None):
        # (preflight() translates --sglang-config's file itself on the cluster)
        from slime.rollout.engines.sglang import TranslationError

        try:
            parsed = server_groups(cfg, environment, groups)
        except (TranslationError, ValueError) as e:
            out.errors.append(_problem(e))
        if parsed:  # every refusal at once, so the lab can show each at its fields
            out.errors.extend(translation_errors(cfg, parsed))
    out.warnings = warnings(cfg)
    use_gpu = cfg.cluster.train_backend != "embedded" or cfg.cluster.rollout_backend != "embedded"
    roles = engine_roles(cfg, environment, parsed)
    try:
        from slime.rollout.producers import producer_count

        out.plan = placement_plan(cfg.cluster, use_gpu=use_gpu, engine_roles=roles,
                                  producers=producer_count(cfg))
    except (ZeroDivisionError, ValueError):  # a layout validate() already refuses has no plan
        out.plan = []
    if cfg.cluster.train_backend == "megatron":
        from slime.ray.placement import parallel_layout

        try:
            out.layout = parallel_layout(cfg.megatron, cfg.cluster.num_trainer_ranks)
        except ValueError:  # refused by the capability check (dp_whole), which says why
            out.layout = []
    return out


def main(argv: Sequence[str], async_mode: bool = False) -> int:
    """Print the verdict and the placement plan; exit status 0 when the runtime accepts the flags."""
    from slime.ray.placement import format_plan

    result = dry_run(argv, async_mode=async_mode)
    entry = "train_async.py" if async_mode else "train.py"
    if result.cfg is not None:
        print(f"[slime] dry run of {entry}: nothing is loaded or reserved")
        print("[slime] Ray placement plan (training pool packed first, then the rollout pool):")
        for line in format_plan(result.plan):
            print(f"  {line}")
        from slime.args import cluster_packages

        for module, _, pip in cluster_packages(result.cfg):  # checked here; each node needs it too
            print(f"[slime] the cluster must have {module} installed on every node: pip install {pip}")
        if result.layout:
            from slime.ray.placement import format_layout

            print("[slime] Megatron process groups of the trainer ranks (global rank = trainer actor index):")
            for line in format_layout(result.layout):
                print(f"  {line}")
    for w in result.warnings:
        print(f"[slime] warning: {w}")
    if result.errors:
        print("slime: cannot start:\n  - " + "\n  - ".join(result.errors))
        return 1
    print("[slime] pre-flight passed")
    return 0
