"""Assemble a run: pre-flight checks (before Ray reserves anything), pools, trainer ranks,
engines, rollout manager, weight sync, checkpoints. train.py / train_async.py drive it."""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from slime.config import Config


class PreflightError(SystemExit):
    """Every problem found before start-up, one per line, each naming its flag / file / hook."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("slime: cannot start:\n  - " + "\n  - ".join(problems))


def preflight(cfg: Config) -> dict[str, Any]:
    """Validate flags, data, hooks and checkpoints. Returns the resume state (or {})."""
    from slime.args import validate
    from slime.backends.embedded.capabilities import ignored_sglang_flags
    from slime.checkpoint import CheckpointError, resolve_checkpoint
    from slime.data.dataset import DataError, check_data

    problems = validate(cfg)
    if not problems:
        try:
            check_data(cfg.data.prompt_data, cfg.data.input_key, cfg.data.label_key, "--prompt-data")
            for name, path in cfg.eval.datasets:
                check_data(path, cfg.data.input_key, cfg.data.label_key, f"--eval-prompt-data {name}")
        except DataError as e:
            problems.append(str(e))
    try:
        from slime.rewards.hooks import HookLoadError, load_function

        r = cfg.rollout
        if r.custom_rm_path:
            load_function(r.custom_rm_path, kind="group_reward" if r.group_rm else "reward")
        elif r.rm_type:
            from slime.rewards import get_reward_fn

            get_reward_fn(r.rm_type)
        if r.custom_generate_function_path:
            load_function(r.custom_generate_function_path, kind="generate")
    except (HookLoadError, ValueError) as e:
        problems.append(str(e))
    state: dict[str, Any] = {}
    for flag, path in (("--load", cfg.model.load), ("--ref-load", cfg.model.ref_load)):
        if path and not problems:
            try:
                ckpt = resolve_checkpoint(path, flag)
                if flag == "--load":
                    state = ckpt.state
            except CheckpointError as e:
                problems.append(str(e))
    if problems:
        raise PreflightError(problems)
    ignored = ignored_sglang_flags(cfg)
    if ignored:
        print(f"[slime] note: the embedded engine ignores {', '.join(ignored)}", flush=True)
    return state


def total_rollouts(cfg: Config) -> int:
    if cfg.run.num_rollout is not None:
        return cfg.run.num_rollout
    from slime.data.dataset import read_records

    return cfg.run.num_epoch * max(1, len(read_records(cfg.data.prompt_data)) // cfg.rollout.rollout_batch_size)


@dataclass
class Runtime:
    cfg: Config
    trainers: list
    engines: list
    manager: Any
    sync: Any
    start_rollout_id: int
    num_rollout: int
    version: int
    steps_per_rollout: int
    pgs: list = field(default_factory=list)

    @classmethod
    def start(cls, cfg: Config) -> "Runtime":
        import ray

        from slime.args import steps_per_rollout
        from slime.ray.actors import EngineActor, RolloutManagerActor, TrainerActor
        from slime.ray.placement import create_pools
        from slime.sync.weight_sync import WeightSync

        state = preflight(cfg)  # nothing is reserved before this passes
        if not ray.is_initialized():
            ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=True)
        cfg.cluster.use_gpu = ray.cluster_resources().get("GPU", 0) > 0
        train_pool, rollout_pool = create_pools(cfg.cluster)
        n = cfg.cluster.num_trainer_ranks
        trainers = [TrainerActor.options(**train_pool.options(i)).remote(i, n) for i in range(n)]
        master = ray.get(trainers[0].master_address.remote())
        weights_from = cfg.model.load or cfg.model.ref_load
        init = [t.init.remote(master, cfg.model.hf_checkpoint, weights_from, cfg.model.ref_load,
                              cfg.optim, cfg.loss, cfg.batch, cfg.run.seed, cfg.model.load) for t in trainers]
        engines = [EngineActor.options(**rollout_pool.options(j)).remote(cfg.model.hf_checkpoint, cfg.rollout.seed + j,
                                                                       1, cfg.sglang)
                   for j in range(cfg.cluster.num_engines)]
        urls = ray.get([e.get_url.remote() for e in engines])
        ray.get(init)
        manager = RolloutManagerActor.options(max_concurrency=2).remote(
            cfg.data, cfg.rollout, cfg.eval, cfg.model.hf_checkpoint, urls, state.get("data_position"))
        disk = os.path.join(cfg.log.output_dir or tempfile.gettempdir(), f"slime-weights-{os.getpid()}")
        sync = WeightSync(cfg.sync, cfg.cluster.colocate, trainers[0], engines, urls, disk)
        rt = cls(cfg, trainers, engines, manager, sync, int(state.get("next_rollout_id", 0)),
                 total_rollouts(cfg), int(state.get("weight_version", 0)), steps_per_rollout(cfg),
                 list({id(p.pg): p.pg for p in (train_pool, rollout_pool)}.values()))
        if state:
            print(f"[slime] resumed from --load {cfg.model.load}: next rollout id {rt.start_rollout_id}, "
                  f"data position {state.get('data_position')}", flush=True)
        ray.get(manager.engine_urls.remote())  # the manager waited for every engine to be healthy
        rt.sync_weights()  # engines start from --hf-checkpoint; the trainer may hold other weights
        return rt

    # -- the phases train.py calls ---------------------------------------------------------------
    def generate_async(self, rollout_id: int):
        return self.manager.generate.remote(rollout_id)

    def generate(self, rollout_id: int):
        import ray

        return ray.get(self.generate_async(rollout_id))

    def build_records(self, samples) -> list:
        from slime.data.train_data import build_records

        r, l = self.cfg.rollout, self.cfg.loss
        return build_records(samples, r.n_samples_per_prompt, r.rollout_batch_size, l.advantage_estimator,
                             l.normalize_rewards, l.std_normalization)

    def train(self, records) -> dict[str, float]:
        import ray

        t0 = time.monotonic()
        if self.cfg.cluster.colocate:  # the pool goes to the trainer: engines release memory
            self.sync.release_engines()
            ray.get([t.onload.remote() for t in self.trainers])
        metrics = ray.get([t.train.remote(records, self.steps_per_rollout) for t in self.trainers])[0]
        if self.cfg.cluster.colocate:
            ray.get([t.offload.remote() for t in self.trainers])
            self.sync.resume_engines()
        metrics["perf/train_time"] = time.monotonic() - t0
        tokens = sum(len(r.tokens) for r in records) * self.steps_per_rollout / max(self.steps_per_rollout, 1)
        metrics["perf/train_tokens_per_s"] = tokens / max(metrics["perf/train_time"], 1e-9)
        return metrics

    def sync_weights(self) -> float:
        self.version += 1
        return self.sync.sync(self.version)

    def evaluate(self, rollout_id: int) -> dict[str, float]:
        from slime.eval import run_eval

        t0 = time.monotonic()
        out = run_eval(self.manager, rollout_id)
        out["perf/eval_time"] = time.monotonic() - t0
        return out

    def save_due(self, rollout_id: int) -> bool:
        m = self.cfg.model
        return bool(m.save and m.save_interval) and (
            (rollout_id + 1) % m.save_interval == 0 or rollout_id == self.num_rollout - 1)

    def save(self, rollout_id: int) -> str:
        import ray

        nxt = rollout_id + 1
        state = {"next_rollout_id": nxt, "rollout_id": rollout_id, "weight_version": self.version,
                 "data_position": ray.get(self.manager.position_for.remote(nxt))}
        return ray.get(self.trainers[0].save.remote(self.cfg.model.save, nxt, state))

    def shutdown(self) -> None:
        import ray

        for e in self.engines:
            try:
                ray.get(e.shutdown.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - best effort: the actor may already be gone
                pass
        for a in [*self.engines, *self.trainers, self.manager]:
            ray.kill(a)
        from ray.util.placement_group import remove_placement_group

        for pg in self.pgs:
            remove_placement_group(pg)
