"""The flags of an experiment's train command, grouped as experiment.sh writes them: the one mapping
from an experiment to the runtime's arguments.

Pure: reads the experiment and its recipe. Every user value stays a Python value here (rendering
quotes it); private values (paths, addresses, hook paths, device names) are shell variables (`Var`)
that experiment.sh sets at its top, so a reviewer edits one place. Three readers, one mapping:
the renderer prints the groups (lab/render/), the runtime's verdict judges them as an argument list
(lab/core/argv.py, lab/rules/runtime_verdict.py), and script import reads a script's flags back
into fields through the same tables (`SIMPLE_FLAG` of lab/core/experiment.py, `VALUE_FLAG` here).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from lab.core.experiment import SIMPLE_FLAG, Experiment, get_path
from lab.core.model_spec import kind_of
from lab.core.recipes import REPO_ROOT, Recipe
from lab.core.shell_var import Var

# path -> the flag whose value IS the field's value (a bool: the switch's presence), for fields the
# groups below write by hand (SIMPLE_FLAG's fields are written generically by `declared_line`).
# Rendering takes each flag's name from here; script import reads the table backwards.
VALUE_FLAG: dict[str, str] = {
    "placement.gpus_per_node": "--num-gpus-per-node",
    "placement.engine_gpus": "--rollout-num-gpus-per-engine",
    "task.rm_type": "--rm-type",
    "task.custom_reward_path": "--custom-rm-path",
    "task.custom_generate_path": "--custom-generate-function-path",
    "paths.hf_checkpoint": "--hf-checkpoint",
    "paths.ref_load": "--ref-load",
    "paths.prompt_data": "--prompt-data",
    "paths.save": "--save",
    "paths.load": "--load",
    "paths.output_dir": "--output-dir",
    "corrections.tis_clip": "--tis-clip",
    "corrections.icepop_low": "--icepop-low",
    "corrections.icepop_high": "--icepop-high",
    "corrections.r3": "--use-rollout-routing-replay",
    "corrections.deterministic": "--sglang-enable-deterministic-inference",
    "serving.mem_fraction_static": "--sglang-mem-fraction-static",
    "serving.concurrency": "--sglang-server-concurrency",
    "resources.tp": "--tensor-model-parallel-size",
    "resources.pp": "--pipeline-model-parallel-size",
    "resources.cp": "--context-parallel-size",
    "resources.ep": "--expert-model-parallel-size",
    "resources.cpu_adam": "--optimizer-cpu-offload",
    "resources.pp_first_stage_layers": "--decoder-first-pipeline-num-layers",
    "resources.pp_last_stage_layers": "--decoder-last-pipeline-num-layers",
    "evaluation.interval": "--eval-interval",
    "evaluation.n_samples": "--n-samples-per-eval-prompt",
    "rollout.queue_state_dir": "--rollout-queue-dir",
    "rollout.queue_run_id": "--rollout-queue-run-id",
    "precision.kv_cache_dtype": "--sglang-kv-cache-dtype",
    "precision.recurrent_state_dtype": "--sglang-mamba-ssm-dtype",
    "precision.state_kv_ratio": "--sglang-mamba-full-memory-ratio",
}
# flag -> the field it fills, for every flag whose value is one field's value (script import).
FIELD_OF_FLAG: dict[str, str] = {flag: path for path, flag in {**SIMPLE_FLAG, **VALUE_FLAG}.items()}


TINY_TRAIN_ARGS = "tools/tiny/TRAIN_ARGS.yaml"
# Flags of the tiny recipe's measured run that no experiment field controls: the renderer takes
# their values from tools/tiny/TRAIN_ARGS.yaml (one home). Flags the experiment controls (batch,
# samples, lengths, reward, paths, eval) keep the experiment's values.
TINY_TUNED = ("--cpus-per-bundle", "--micro-batch-size", "--lr", "--clip-grad", "--update-weight-transport",
              "--update-weight-disk-dir", "--eval-temperature")
_TINY_PLACEHOLDERS = {"${OUTPUT_DIR}": "OUTPUT_DIR", "${MODEL_DIR}": "HF_CHECKPOINT", "${REF_DIR}": "REF_LOAD"}


def shell_variables(exp: Experiment, recipe: Recipe) -> tuple[list[tuple[str, Any, str]], list[tuple[str, list[str], str]]]:
    """The variables block of experiment.sh: (scalars, arrays) as (NAME, value, comment)."""
    p = exp.paths
    fp8_dir = p.fp8_source or (f"{p.hf_checkpoint.rstrip('/')}-fp8-source" if recipe.conversion.fp8_source else "")
    serving_dir = p.serving_checkpoint or (
        f"{p.hf_checkpoint.rstrip('/')}-{exp.precision.rollout}" if exp.precision.rollout in ("fp8", "int4") else "")
    scalars = [
        ("HF_REPO", recipe.hf_repo or "", "Hugging Face repository of the weights"),
        ("HF_CHECKPOINT", p.hf_checkpoint, "BF16 Hugging Face checkpoint (tokenizer, config.json, weights)"),
        ("FP8_SOURCE", fp8_dir, "FP8-published source weights before BF16 conversion"),
        ("SERVING_CHECKPOINT", serving_dir, "quantized checkpoint the engines serve (FP8/INT4 rollout)"),
        ("REF_LOAD", p.ref_load, "reshardable torch_dist checkpoint (--ref-load), written by convert"),
        ("PROMPT_DATA", p.prompt_data, "training prompts (JSONL or parquet)"),
        ("EVAL_DATA", exp.evaluation.data_path, "held-out data set"),
        ("SAVE_DIR", p.save, "checkpoint directory (--save)"),
        ("LOAD_DIR", p.load or "", "checkpoint to resume from (--load); empty: a fresh run"),
        ("OUTPUT_DIR", p.output_dir, "run outputs: metrics.jsonl, logs"),
        ("CUSTOM_GENERATE_PATH", exp.task.custom_generate_path or "", "generate hook (module.function)"),
        ("CUSTOM_RM_PATH", exp.task.custom_reward_path or "", "reward hook (module.function)"),
        ("DRAFT_HEAD_PATH", exp.serving.eagle.draft_head_path or "", "separate EAGLE draft head"),
        ("QUEUE_STATE_DIR", exp.rollout.queue_state_dir or "", "straw queue state directory"),
    ]
    arrays = [
        ("EXTERNAL_ENGINE_ADDRS", list(exp.placement.external_engine_addrs), "external SGLang engines, host:port"),
        ("RDMA_DEVICES", list(exp.serving.pd.rdma_devices), "RDMA (InfiniBand) devices for Mooncake"),
    ]
    return scalars, arrays


def _tiny_cache_key() -> tuple[str, int]:
    path = REPO_ROOT / TINY_TRAIN_ARGS
    try:
        return str(path), path.stat().st_mtime_ns
    except FileNotFoundError:
        return str(path), -1


def tiny_tuned_flags() -> dict[str, list[Any]]:
    return _tiny_tuned_flags(*_tiny_cache_key())


@lru_cache(maxsize=4)
def _tiny_tuned_flags(path: str, mtime_ns: int) -> dict[str, list[Any]]:
    if mtime_ns < 0:
        return {}
    import yaml

    tokens = [str(t) for t in (yaml.safe_load(open(path, encoding="utf-8")) or {}).get("train_args", [])]
    out: dict[str, list[Any]] = {}
    for line in split_flag_lines(tokens):
        if line[0] not in TINY_TUNED:
            continue
        values: list[Any] = []
        for v in line[1:]:
            for placeholder, var in _TINY_PLACEHOLDERS.items():
                if v.startswith(placeholder):
                    v = Var(var, suffix=v[len(placeholder):])
                    break
            values.append(v)
        out[line[0]] = values
    return out


@dataclass
class FlagGroup:
    title: str
    lines: list[list[Any]] = field(default_factory=list)

    def add(self, *tokens: Any) -> None:
        self.lines.append(list(tokens))


def declared_line(exp: Experiment, path: str, data: dict[str, Any] | None = None) -> list[Any] | None:
    """`--flag value` of a simple field, from its declaration in lab/core/experiment.py.

    A bool is a switch (present when true), None leaves the flag out, a float gets its short spelling.
    """
    value = get_path(data if data is not None else exp.model_dump(), path)
    flag = SIMPLE_FLAG[path]
    if value is None or value is False:
        return None
    if value is True:
        return [flag]
    if isinstance(value, float):
        return [flag, fmt_num(value)]
    return [flag, value]


def _declared(g: "FlagGroup", exp: Experiment, data: dict[str, Any], *paths: str) -> None:
    for path in paths:
        line = declared_line(exp, path, data)
        if line:
            g.lines.append(line)


def fmt_num(x: float) -> str:
    """1e-06 -> 1e-6, 0.80 -> 0.8: short, stable spellings for floats."""
    s = repr(float(x))
    if "e" in s:
        mant, exp = s.split("e")
        mant = mant.rstrip("0").rstrip(".") if "." in mant else mant
        return f"{mant}e{int(exp)}"
    return s[:-2] if s.endswith(".0") else s


def actor_layout(exp: Experiment, tiny: bool) -> tuple[int, int]:
    """(--actor-num-nodes, --actor-num-gpus-per-node) for a training pool of placement.train_gpus."""
    p = exp.placement
    if tiny or p.gpus_per_node == 0:
        return 1, 1  # the embedded CPU backend: one trainer process
    n, gpn = p.train_gpus, p.gpus_per_node
    if n >= gpn and n % gpn == 0:
        return n // gpn, gpn
    if n < gpn:
        return 1, max(n, 1)
    nodes = max(p.nodes, 1)
    return nodes, max(n // nodes, 1)


def sglang_parallel(recipe: Recipe, engine_gpus: int) -> tuple[int | None, int | None]:
    """(DP-attention size, EP size) inside one engine, kept valid when the engine size changes."""
    dp = recipe.rollout.dp_attention
    ep = recipe.rollout.ep
    if engine_gpus <= 0:
        return None, None
    if dp:
        dp = math.gcd(dp, engine_gpus)
    if ep:
        ep = ep if ep <= engine_gpus and engine_gpus % ep == 0 else engine_gpus
    return (dp if dp and dp > 1 else None), (ep if ep and ep > 1 else None)


def needs_sglang_yaml(exp: Experiment, recipe: Recipe) -> bool:
    if exp.placement.ownership == "external" or recipe.backends.rollout != "sglang":
        return False
    return bool(recipe.rollout.server_groups or exp.serving.pd.enabled)


def eagle_settings(exp: Experiment, recipe: Recipe) -> dict[str, Any]:
    """SGLang ServerArgs field -> value for speculative decoding (empty when EAGLE is off)."""
    e = exp.serving.eagle
    if not e.enabled:
        return {}
    out: dict[str, Any] = {
        "speculative_algorithm": "EAGLE",
        "speculative_num_steps": e.steps,
        "speculative_eagle_topk": e.topk,
        "speculative_num_draft_tokens": e.draft_tokens,
    }
    backend = recipe.rollout.eagle.draft_attention_backend if recipe.rollout.eagle else None
    if backend:
        out["speculative_draft_attention_backend"] = backend
    # SGL-7: with speculation SGLang caps running requests at a small default; say it explicitly.
    out["max_running_requests"] = exp.serving.concurrency
    return out


def embedded_pd(exp: Experiment, recipe: Recipe) -> bool:
    """PD on the embedded engine (slime/rollout/engines/pd.py): the runtime starts prefill and decode
    engines from `--prefill-num-servers` and puts sglang-router in PD mode in front of them."""
    return recipe.backends.rollout == "embedded" and exp.serving.pd.enabled and exp.placement.ownership != "external"


def embedded_rollout_units(exp: Experiment, recipe: Recipe) -> int:
    """`--rollout-num-gpus` of an embedded engine pool: one engine (one model copy), or under PD one
    engine per prefill and decode engine (the runtime's default_groups splits the pool so)."""
    if embedded_pd(exp, recipe):
        return exp.serving.pd.prefill_engines + exp.serving.pd.decode_engines
    return 1


def _embedded_pd_lines(exp: Experiment) -> FlagGroup:
    pd = exp.serving.pd
    g = FlagGroup("Embedded engines: prefill/decode disaggregation (KV cache over Mooncake)")
    g.add("--prefill-num-servers", pd.prefill_engines)  # the rest of the pool decodes
    g.add("--use-sglang-router")  # sglang-router pairs prefill with decode; slime's router serves regular workers only
    if pd.rdma_devices:  # without them Mooncake moves the KV cache over TCP
        g.add("--sglang-disaggregation-ib-device", Var("RDMA_IB_DEVICES"))
    return g


def sglang_groups(exp: Experiment, recipe: Recipe, n_actor: int) -> list[dict[str, Any]]:
    """Server groups of the policy model for sglang.yaml: regular, or prefill + decode under PD."""
    p, s = exp.placement, exp.serving
    e = p.engine_gpus
    eagle = eagle_settings(exp, recipe)
    hicache = {"enable_hierarchical_cache": True, "hicache_size": s.hicache.host_memory_gb} if s.hicache.enabled else {}
    if s.pd.enabled:
        # The IB device names are private: they travel as --sglang-disaggregation-ib-device from
        # the variables block (one home, every group), never inside the quoted YAML heredoc.
        transfer: dict[str, Any] = {"disaggregation_transfer_backend": "mooncake"}
        prefill = {**transfer, **hicache, **eagle}  # HiCache on prefill only (decode runs without radix cache)
        decode = {**transfer, **eagle}
        return [
            {"worker_type": "prefill", "num_gpus": s.pd.prefill_engines * e, "num_gpus_per_engine": e, "overrides": prefill},
            {"worker_type": "decode", "num_gpus": s.pd.decode_engines * e, "num_gpus_per_engine": e, "overrides": decode},
        ]
    rollout = n_actor if p.ownership == "colocated" else p.rollout_gpus
    return [{"worker_type": "regular", "num_gpus": rollout, "num_gpus_per_engine": e, "overrides": {**hicache, **eagle}}]


def _sglang_flag_lines(exp: Experiment, recipe: Recipe, with_yaml: bool) -> FlagGroup:
    g = FlagGroup("SGLang (--sglang-* is passed to every engine)")
    s, pr, c = exp.serving, exp.precision, exp.corrections
    if exp.placement.ownership == "external":
        g.add(VALUE_FLAG["serving.concurrency"], s.concurrency)
        return g
    g.add(VALUE_FLAG["serving.mem_fraction_static"], fmt_num(s.mem_fraction_static))
    g.add(VALUE_FLAG["serving.concurrency"], s.concurrency)
    if pr.kv_cache_dtype != "auto":
        g.add(VALUE_FLAG["precision.kv_cache_dtype"], pr.kv_cache_dtype)
    if pr.recurrent_state_dtype and recipe.kind == "hybrid":
        g.add(VALUE_FLAG["precision.recurrent_state_dtype"], pr.recurrent_state_dtype)
    if pr.state_kv_ratio and recipe.kind == "hybrid":
        g.add(VALUE_FLAG["precision.state_kv_ratio"], fmt_num(pr.state_kv_ratio))
    dp, ep = sglang_parallel(recipe, exp.placement.engine_gpus)
    if dp:
        g.add("--sglang-enable-dp-attention")
        g.add("--sglang-dp-size", dp)
    if ep:
        g.add("--sglang-ep-size", ep)
    if c.r3:
        g.add("--sglang-enable-return-routed-experts")
    if c.deterministic:
        g.add(VALUE_FLAG["corrections.deterministic"])
    if not with_yaml:
        for key, value in eagle_settings(exp, recipe).items():
            g.add("--sglang-" + key.replace("_", "-"), value)
        if s.hicache.enabled:
            g.add("--sglang-enable-hierarchical-cache")
            g.add("--sglang-hicache-size", s.hicache.host_memory_gb)
    if s.eagle.enabled and s.eagle.head == "separate":
        g.add("--sglang-speculative-draft-model-path", Var("DRAFT_HEAD_PATH"))
    if s.pd.enabled:  # sglang-router pairs prefill with decode engines; slime's own router serves regular workers only
        g.add("--use-sglang-router")
    if s.pd.enabled and s.pd.rdma_devices:
        g.add("--sglang-disaggregation-ib-device", Var("RDMA_IB_DEVICES"))
    if s.hicache.enabled and exp.placement.ownership == "colocated":
        g.add("--sglang-release-hicache")  # SGL-6: free the host cache when the engine is offloaded
    if with_yaml:
        g.add("--sglang-config", Var("SGLANG_CONFIG"))
    return g


def train_flag_groups(exp: Experiment, recipe: Recipe, n_actor: int) -> list[FlagGroup]:
    """The flags of `train`, grouped as a reader looks for them (the runtime's flag names, docs/en/runtime.md)."""
    p, t, ro, r, pr, c, ev = (exp.placement, exp.task, exp.rollout, exp.resources, exp.precision,
                              exp.corrections, exp.evaluation)
    tiny = recipe.backends.train == "embedded"
    megatron = recipe.backends.train == "megatron"
    groups: list[FlagGroup] = []
    data = exp.model_dump()

    g = FlagGroup("Cluster: training and rollout GPUs")
    nodes, per_node = actor_layout(exp, tiny)
    g.add("--train-backend", recipe.backends.train)
    g.add("--rollout-backend", recipe.backends.rollout)
    g.add("--actor-num-nodes", nodes)
    g.add("--actor-num-gpus-per-node", per_node)
    if not tiny:
        g.add(VALUE_FLAG["placement.gpus_per_node"], p.gpus_per_node)
    if p.ownership == "colocated":
        g.add("--colocate")
    elif p.ownership == "disaggregated":
        g.add("--rollout-num-gpus", p.rollout_gpus if not tiny else embedded_rollout_units(exp, recipe))
    else:
        g.add("--rollout-external-engine-addrs", Var("EXTERNAL_ENGINE_ADDRS", array=True))
    if p.ownership != "external":
        g.add(VALUE_FLAG["placement.engine_gpus"], p.engine_gpus if not tiny else 1)
    groups.append(g)

    g = FlagGroup("Checkpoints")
    serving_ckpt = pr.rollout in ("fp8", "int4")
    g.add(VALUE_FLAG["paths.hf_checkpoint"], Var("SERVING_CHECKPOINT" if serving_ckpt else "HF_CHECKPOINT"))
    g.add(VALUE_FLAG["paths.ref_load"], Var("REF_LOAD"))
    # --load is appended after the array from LOAD_DIR (the template): a hand edit of LOAD_DIR resumes
    g.add(VALUE_FLAG["paths.save"], Var("SAVE_DIR"))
    _declared(g, exp, data, "paths.save_interval")
    g.add(VALUE_FLAG["paths.output_dir"], Var("OUTPUT_DIR"))
    groups.append(g)

    g = FlagGroup("Data")
    g.add(VALUE_FLAG["paths.prompt_data"], Var("PROMPT_DATA"))
    _declared(g, exp, data, "task.input_key", "task.label_key", "task.apply_chat_template")
    g.add("--rollout-shuffle")
    groups.append(g)

    g = FlagGroup("Rollout: run length, batch, sampling, reward")
    _declared(g, exp, data, "task.num_rollout", "task.rollout_batch_size", "task.n_samples_per_prompt",
              "task.num_steps_per_rollout", "rollout.max_response_len", "rollout.temperature")
    if t.custom_reward_path:
        g.add(VALUE_FLAG["task.custom_reward_path"], Var("CUSTOM_RM_PATH"))
    else:
        g.add(VALUE_FLAG["task.rm_type"], t.rm_type)
    if t.custom_generate_path:
        g.add(VALUE_FLAG["task.custom_generate_path"], Var("CUSTOM_GENERATE_PATH"))
    _declared(g, exp, data, "rollout.over_sampling_batch_size", "rollout.partial_rollout")
    if ro.queue:
        g.add(VALUE_FLAG["rollout.queue_state_dir"], Var("QUEUE_STATE_DIR"))
        g.add(VALUE_FLAG["rollout.queue_run_id"], ro.queue_run_id)
    _declared(g, exp, data, "rollout.producers")
    groups.append(g)

    g = FlagGroup("Algorithm, loss and optimizer")
    _declared(g, exp, data, "task.advantage_estimator")
    g.add("--eps-clip", "0.2")
    g.add("--eps-clip-high", "0.28")
    g.add("--use-kl-loss")
    g.add("--kl-loss-coef", "0")
    g.add("--kl-loss-type", "low_var_kl")
    g.add("--entropy-coef", "0")
    g.add("--use-dynamic-batch-size")
    _declared(g, exp, data, "resources.max_tokens_per_gpu")
    g.add("--lr", "1e-6")
    if megatron:
        g.add("--optimizer", "adam")
        g.add("--lr-decay-style", "constant")
    g.add("--weight-decay", "0.1")
    g.add("--adam-beta1", "0.9")
    g.add("--adam-beta2", "0.98")
    groups.append(g)

    g = FlagGroup("Train/rollout mismatch corrections")
    _declared(g, exp, data, "corrections.tis")
    if c.tis or c.sc:  # SC truncates its sequence ratio at --tis-clip too
        g.add(VALUE_FLAG["corrections.tis_clip"], fmt_num(c.tis_clip))
    _declared(g, exp, data, "corrections.icepop")
    if c.icepop:
        g.add(VALUE_FLAG["corrections.icepop_low"], fmt_num(c.icepop_low))
        g.add(VALUE_FLAG["corrections.icepop_high"], fmt_num(c.icepop_high))
    if c.r3:
        g.add(VALUE_FLAG["corrections.r3"])
    _declared(g, exp, data, "corrections.sc")
    if g.lines:
        groups.append(g)

    if ev.enabled:
        g = FlagGroup("Held-out evaluation")
        g.add(VALUE_FLAG["evaluation.interval"], ev.interval)
        g.add("--eval-prompt-data", ev.name, Var("EVAL_DATA"))
        g.add(VALUE_FLAG["evaluation.n_samples"], ev.n_samples)
        groups.append(g)

    if recipe.backends.rollout == "sglang":
        groups.append(_sglang_flag_lines(exp, recipe, needs_sglang_yaml(exp, recipe)))
    elif embedded_pd(exp, recipe):
        groups.append(_embedded_pd_lines(exp))

    if megatron:
        g = FlagGroup("Megatron: parallelism, memory")
        g.add(VALUE_FLAG["resources.tp"], r.tp)
        g.add(VALUE_FLAG["resources.pp"], r.pp)
        g.add(VALUE_FLAG["resources.cp"], r.cp)
        g.add(VALUE_FLAG["resources.ep"], r.ep)
        if kind_of(exp, recipe) == "moe":
            g.add("--expert-tensor-parallel-size", 1)
        if r.tp > 1:
            g.add("--sequence-parallel")
        if r.pp > 1 and r.pp_first_stage_layers:
            g.add(VALUE_FLAG["resources.pp_first_stage_layers"], r.pp_first_stage_layers)
        if r.pp > 1 and r.pp_last_stage_layers:
            g.add(VALUE_FLAG["resources.pp_last_stage_layers"], r.pp_last_stage_layers)
        if r.recompute == "full":
            g.add("--recompute-granularity", "full")
            g.add("--recompute-method", "uniform")
            g.add("--recompute-num-layers", 1)
        elif r.recompute == "selective":
            g.add("--recompute-granularity", "selective")
        if r.cpu_adam:
            g.add(VALUE_FLAG["resources.cpu_adam"])
            g.add("--overlap-cpu-optimizer-d2h-h2d")
            g.add("--use-precision-aware-optimizer")
        if pr.training == "fp8":
            g.add("--fp8-format", "e4m3")
            g.add("--fp8-recipe", "blockwise")
        groups.append(g)

    if tiny:
        tuned = tiny_tuned_flags()
        g = FlagGroup(f"Tiny recipe: measured flags from {TINY_TRAIN_ARGS}")
        for flag, values in tuned.items():
            if flag == "--eval-temperature" and not ev.enabled:
                continue
            replaced = False
            for group in groups:
                for line in group.lines:
                    if line[0] == flag:
                        line[1:] = values
                        replaced = True
            if not replaced:
                g.add(flag, *values)
        if g.lines:
            groups.append(g)

    if recipe.train_args:  # a flag the groups above already hold takes the recipe's value in place
        g = FlagGroup(f"Recipe {recipe.name}: its own tuned flags")
        for line in split_flag_lines(recipe.train_args):
            held = [old for group in groups for old in group.lines if old[0] == line[0]]
            for old in held:
                old[1:] = line[1:]
            if not held:
                g.lines.append(line)
        if g.lines:
            groups.append(g)
    unset = set(exp.advanced.unset_flags)
    if unset:  # an imported script did not pass these: the runtime's default applies
        for group in groups:
            group.lines = [line for line in group.lines if line[0] not in unset]
        groups = [group for group in groups if group.lines]
    extra = extra_flag_tokens(exp)
    if extra:
        g = FlagGroup("Additional runtime flags (advanced.extra_flags)")
        g.lines.extend(split_flag_lines(extra))
        groups.append(g)
    return groups


def extra_flag_tokens(exp: Experiment) -> list[str]:
    """advanced.extra_flags as shell words; unreadable text (an open quote) gives none and a finding."""
    import shlex

    try:
        return shlex.split(exp.advanced.extra_flags)
    except ValueError:
        return []


def split_flag_lines(tokens: list[str]) -> list[list[Any]]:
    lines: list[list[Any]] = []
    for tok in tokens:
        if tok.startswith("--") or not lines:
            lines.append([tok])
        else:
            lines[-1].append(tok)
    return lines
