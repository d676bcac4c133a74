"""Assemble a run: pre-flight checks (before Ray reserves anything), pools, trainer ranks,
engines, rollout manager, weight sync, checkpoints. train.py / train_async.py drive it."""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slime import estimators
from slime.config import Config
from slime.refusals import declare, message_of
from slime.timeline import PhaseClock, pop_phases

_R = declare("preflight", {
    "ref_load_unconverted": ("path", "marker"),
    "critic_load": ("error",),
    "no_gpu": ("backend",),
})


def trainer_bundle_share(cfg: Config) -> float:
    """The part of its bundle a trainer rank takes: half when the estimator needs a critic, whose
    rank of the same index takes the other half."""
    return 0.5 if estimators.of(cfg.loss).needs_critic else 1.0


class PreflightError(SystemExit):
    """Every problem found before start-up, one per line, each naming its flag / file / hook."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("slime: cannot start:\n  - " + "\n  - ".join(problems))


def preflight(cfg: Config, load_hooks: bool = True) -> dict[str, Any]:
    """Validate flags, data, hooks and checkpoints. Returns the resume state (or {}).

    `load_hooks=False` (the dry run behind `experiment.sh check`) imports no hook module: checking
    must execute nothing of the user's; `check` locates hook files on disk instead."""
    from slime.args import validate
    from slime.backends.embedded.capabilities import ignored_sglang_flags
    from slime.checkpoint import CheckpointError, resolve_checkpoint
    from slime.data.dataset import DataError, check_data

    problems = validate(cfg)
    if not problems:
        assert cfg.data.prompt_data is not None  # validate() refuses a missing --prompt-data
        try:
            check_data(cfg.data.prompt_data, cfg.data.input_key, cfg.data.label_key, "--prompt-data")
            for name, eval_path in cfg.eval.datasets:
                check_data(eval_path, cfg.data.input_key, cfg.data.label_key, f"--eval-prompt-data {name}")
        except DataError as e:
            problems.append(message_of(e))
    try:
        from slime.rewards.hooks import HookLoadError, load_function

        r = cfg.rollout
        if r.custom_rm_path:
            if load_hooks:
                load_function(r.custom_rm_path, kind="group_reward" if r.group_rm else "reward")
        elif r.rm_type:
            from slime.rewards import make_reward_fn

            make_reward_fn(r.rm_type, r.rm_url, r.rm_timeout, r.rm_max_retries)
        if r.custom_generate_function_path and load_hooks:
            load_function(r.custom_generate_function_path, kind="generate")
        if r.dynamic_sampling_filter_path and load_hooks:
            load_function(r.dynamic_sampling_filter_path, kind="dynamic_sampling_filter")
    except (HookLoadError, ValueError) as e:
        problems.append(message_of(e))
    state: dict[str, Any] = {}
    for flag, path in (("--load", cfg.model.load), ("--ref-load", cfg.model.ref_load)):
        if path and not problems and flag == "--ref-load" and cfg.cluster.train_backend == "megatron":
            from slime.checkpoint import MARKER

            if not (Path(path) / MARKER).exists():  # a torch_dist conversion: Megatron's tracker, no state
                problems.append(_R("ref_load_unconverted", path=str(path), marker=MARKER))
            continue
        if path and not problems:
            try:
                ckpt = resolve_checkpoint(path, flag)
                if flag == "--load":
                    state = ckpt.state
            except CheckpointError as e:
                problems.append(message_of(e))
    if not problems and estimators.of(cfg.loss).needs_critic:
        from slime.checkpoint import resolve_critic

        try:
            resolve_critic(cfg.model, cfg.critic)  # resuming the policy resumes its critic, or refuses
        except CheckpointError as e:
            problems.append(_R("critic_load", error=message_of(e)))
    if not problems and cfg.cluster.external:
        from slime.rollout.engines.external import check_external_engines
        from slime.sync.weight_sync import default_transport

        assert cfg.model.hf_checkpoint is not None  # validate() refuses a missing --hf-checkpoint
        problems.extend(check_external_engines(cfg.cluster.external_engine_addrs or [], cfg.model.hf_checkpoint,
                                               default_transport(cfg.sync, cfg.cluster.colocate)))
    c = cfg.cluster
    if not problems and not c.external and (c.rollout_backend == "sglang" or c.sglang_config or c.prefill_num_servers):
        from slime.rollout.engines.sglang import TranslationError

        try:
            engine_specs(cfg)
        except TranslationError as e:
            problems.append(message_of(e))
    if problems:
        raise PreflightError(problems)
    from slime.args import warnings

    for w in warnings(cfg):
        print(f"[slime] warning: {w}", flush=True)
    ignored = ignored_sglang_flags(cfg)
    if ignored:
        print(f"[slime] note: the embedded engine ignores {', '.join(ignored)}", flush=True)
    return state


def engine_specs(cfg: Config):
    """SGLang engines of this run (translation of --sglang-config / --sglang-* flags)."""
    from slime.rollout.engines.sglang import default_groups, load_server_groups, plan_engines

    c = cfg.cluster
    groups = (load_server_groups(c.sglang_config, cfg.model.hf_checkpoint) if c.sglang_config else
              default_groups(c.num_rollout_units, c.rollout_num_gpus_per_engine, c.prefill_num_servers))
    groups = [g for g in groups if g.update_weights] or groups  # the policy's engines
    return plan_engines(groups, cfg.sglang, server_concurrency=cfg.rollout.server_concurrency,
                        rollout_gpus=c.num_rollout_units)


def embedded_pd_specs(cfg: Config) -> list:
    """--rollout-backend embedded with prefill/decode groups (--sglang-config / --prefill-num-servers):
    each engine's spec (its worker_type and disaggregation fields); [] without PD."""
    c = cfg.cluster
    if c.rollout_backend != "embedded" or c.external or not (c.sglang_config or c.prefill_num_servers):
        return []
    return engine_specs(cfg)


def total_rollouts(cfg: Config) -> int:
    if cfg.run.num_rollout is not None:
        return cfg.run.num_rollout
    from slime.data.dataset import read_records

    # validate() asks for --num-rollout or --num-epoch, and for --prompt-data
    assert cfg.run.num_epoch is not None and cfg.data.prompt_data is not None
    return cfg.run.num_epoch * max(1, len(read_records(cfg.data.prompt_data)) // cfg.rollout.rollout_batch_size)


# bf16 matmul rate of one accelerator for perf/mfu: 790 TFLOP/s, measured on an H200 (the
# denominator docs/benchmarks.md uses); SLIME_GPU_PEAK_TFLOPS sets it for other chips.
PEAK_TFLOPS = float(os.environ.get("SLIME_GPU_PEAK_TFLOPS", "790"))


@dataclass
class Runtime:
    cfg: Config
    trainers: list
    engines: list  # EngineHandle per engine (shared with self.sync; replaced on restart)
    manager: Any
    sync: Any
    start_rollout_id: int
    num_rollout: int
    version: int
    steps_per_rollout: int
    pgs: list = field(default_factory=list)
    router: Any = None  # RouterActor
    router_url: str = ""
    rollout_pool: Any = None
    monitor: Any = None
    specs: list = field(default_factory=list)  # SGLang engine specs (rollout backend sglang)
    pd_specs: list = field(default_factory=list)  # embedded engines' prefill/decode groups (embedded_pd_specs)
    train_pending: bool = False  # trained weights not yet synced: a restarted engine waits for the sync
    engines_released: bool = False  # colocated: engines gave their GPU memory to the trainer
    trainer_offloaded: bool = False  # --offload-train: the trainer's GPU state is in host memory
    last_offload: dict = field(default_factory=dict)  # memory figures of the last offload (GiB)
    unregistered: set = field(default_factory=set)
    critics: list = field(default_factory=list)  # CriticActor per trainer rank (--advantage-estimator ppo)
    timeline: PhaseClock = field(default_factory=PhaseClock)  # this step's phases (slime/timeline.py)

    @classmethod
    def start(cls, cfg: Config) -> "Runtime":
        import ray

        from slime.args import steps_per_rollout
        from slime.ray.actors import CriticActor, RolloutManagerActor, RouterActor, SGLangRouterActor, TrainerActor
        from slime.ray.placement import create_pools
        from slime.rollout.client import RouterAdmin
        from slime.rollout.engines.external import normalize_addr
        from slime.sync.weight_sync import EngineHandle, WeightSync

        state = preflight(cfg)  # nothing is reserved before this passes
        if not ray.is_initialized():
            ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=True)
        c = cfg.cluster
        c.use_gpu = ray.cluster_resources().get("GPU", 0) > 0
        from slime.backends.registry import get_backend

        if get_backend(c.train_backend).needs_gpu and not c.use_gpu:
            raise PreflightError([_R("no_gpu", backend=c.train_backend)])
        train_pool, rollout_pool = create_pools(c)
        n = c.num_trainer_ranks
        share = trainer_bundle_share(cfg)
        trainers = [TrainerActor.options(**train_pool.options(i, share)).remote(i, n) for i in range(n)]  # type: ignore[attr-defined]  # @ray.remote made it an ActorClass; mypy skips class decorators
        critics = ([CriticActor.options(**train_pool.options(i, share)).remote(i, n) for i in range(n)]  # type: ignore[attr-defined]  # @ray.remote made it an ActorClass; mypy skips class decorators
                   if estimators.of(cfg.loss).needs_critic else [])
        master = ray.get(trainers[0].master_address.remote())
        cfg.optim.total_steps = total_rollouts(cfg) * steps_per_rollout(cfg)  # the LR schedule's length
        init = [t.init.remote(master, cfg) for t in trainers]  # the registry's backend, on every rank
        critic_init = []
        if critics:  # the critic ranks' own process group (rank 0 of the critics listens)
            critic_master = ray.get(critics[0].master_address.remote())
            critic_init = [a.init.remote(critic_master, cfg) for a in critics]
        sglang = c.rollout_backend == "sglang" and not c.external
        # sglang-router starts once the engines serve (its power_of_two policy wants its workers at launch)
        router = None if c.use_sglang_router else RouterActor.remote(cfg.rollout.server_concurrency, c.router_policy)  # type: ignore[attr-defined]  # @ray.remote made it an ActorClass; mypy skips class decorators
        rt = cls(cfg, trainers, [], None, None, int(state.get("next_rollout_id", 0)), total_rollouts(cfg),
                 int(state.get("weight_version", 0)), steps_per_rollout(cfg),
                 [p.pg for p in {id(p.pg): p for p in (train_pool, rollout_pool)}.values() if p.pg is not None],
                 router, "", rollout_pool, None, engine_specs(cfg) if sglang else [])
        rt.critics = critics
        rt.pd_specs = embedded_pd_specs(cfg)
        if router is not None:
            rt.router_url = ray.get(router.get_url.remote())
        if c.external:
            rt.engines = [EngineHandle(normalize_addr(a)) for a in c.external_engine_addrs or []]
        else:
            rt.engines = [rt._start_engine(j, wait=False) for j in range(len(rt.specs) or c.num_engines)]
        for h in rt.engines:
            h.client.wait_healthy(timeout=600.0)
        states = ray.get(init)
        state = states[0] or state
        ray.get(critic_init)
        disk = os.path.join(cfg.log.output_dir or tempfile.gettempdir(), f"slime-weights-{os.getpid()}")
        rt.sync = WeightSync(cfg.sync, c.colocate, trainers, rt.engines, disk, c.use_gpu, cfg.sync.check_tol,
                             cfg.rollout.sampling.temperature)
        rt.sync.version = rt.version
        rt.version += 1  # the start-up weights are the first version the engines get
        if state:
            print(f"[slime] resumed from --load {cfg.model.load}: next rollout id {rt.start_rollout_id}, "
                  f"data position {state.get('data_position')}", flush=True)
        rt.sync_weights()  # engines start from --hf-checkpoint; the trainer may hold other weights
        if c.use_sglang_router:  # health probes as often as our monitor's (it restarts; the router avoids)
            log = os.path.join(cfg.log.output_dir, "sglang-router.log") if cfg.log.output_dir else None
            workers = [(h.url, *rt._worker(j)) for j, h in enumerate(rt.engines)]
            regular = [u for u, kind, _ in workers if kind == "regular"]
            prefill = [(u, port) for u, kind, port in workers if kind == "prefill"]
            decode = [u for u, kind, _ in workers if kind == "decode"]
            rt.router = SGLangRouterActor.remote(c.router_policy, cfg.fault.health_check_interval,  # type: ignore[attr-defined]  # @ray.remote made it an ActorClass; mypy skips class decorators
                                                 cfg.fault.health_check_timeout, log, regular, prefill, decode)
            rt.router_url = ray.get(rt.router.get_url.remote())
        admin = RouterAdmin(rt.router_url)
        listed = {w["url"].rstrip("/") for w in admin.list_workers()}
        for j, h in enumerate(rt.engines):
            if h.url.rstrip("/") not in listed:
                admin.add_worker(h.url, *rt._worker(j))
        admin.wait_workers([h.url for h in rt.engines], timeout=600.0)  # sglang-router registers in background
        rt.manager = RolloutManagerActor.options(max_concurrency=2).remote(
            cfg.data, cfg.rollout, cfg.eval, cfg.model.hf_checkpoint, rt.router_url, state.get("data_position"),
            state.get("partial_buffer"), rt.start_rollout_id, not c.use_sglang_router, rt.producer_options())
        ray.get(rt.manager.engine_urls.remote())  # the manager waited for every engine to be healthy
        if cfg.fault.use_fault_tolerance:
            from slime.rollout.fault import HealthMonitor

            rt.monitor = HealthMonitor(cfg.fault, lambda: rt.engines, rt.restart_engine).start()
        return rt

    def producer_options(self) -> list[dict] | None:
        """straw + fully async: Ray options of each producer actor (placement.producer_actor_options);
        None when the rollout manager generates alone."""
        from slime.ray.placement import producer_actor_options
        from slime.rollout.producers import producer_count

        n = producer_count(self.cfg)
        return producer_actor_options(self.cfg.cluster, self.rollout_pool, n, len(self.engines)) if n >= 2 else None

    # -- engines ----------------------------------------------------------------------------------
    def _worker(self, j: int) -> tuple[str, int | None]:
        """Engine j's worker type for the router and, for a prefill engine, its bootstrap port."""
        spec = (self.specs or self.pd_specs or [None] * (j + 1))[j]
        if spec is None or spec.worker_type != "prefill":
            return (spec.worker_type if spec is not None else "regular"), None
        if self.specs:  # SGLang binds the port it was given
            return "prefill", int(spec.fields["disaggregation_bootstrap_port"])
        return "prefill", int(self.engines[j].client.server_info()["disaggregation_bootstrap_port"])

    def _start_engine(self, j: int, wait: bool = True):
        """Engine j in its bundle(s) of the rollout pool: an embedded engine, or SGLang (# UNTESTED on GPU)."""
        import ray

        from slime.ray.actors import EngineActor
        from slime.sync.weight_sync import EngineHandle

        cfg, c = self.cfg, self.cfg.cluster
        seed = cfg.rollout.seed + j
        if not self.specs:
            args = cfg.sglang
            if self.pd_specs:  # its group's role (slime/rollout/engines/pd.py)
                f = self.pd_specs[j].fields
                args = {**args, **{k: f[k] for k in ("disaggregation_mode", "disaggregation_transfer_backend",
                                                     "disaggregation_ib_device") if k in f}}
            actor = EngineActor.options(**self.rollout_pool.options(j)).remote(cfg.model.hf_checkpoint, seed, 1,  # type: ignore[attr-defined]  # @ray.remote made it an ActorClass; mypy skips class decorators
                                                                               args)
            h = EngineHandle(ray.get(actor.get_url.remote()), actor)
        else:  # UNTESTED on GPU
            from slime.ray.placement import engine_bundles
            from slime.rollout.engines.sglang import sglang_engine_actor_cls

            actor_cls = sglang_engine_actor_cls()
            spec = self.specs[j]
            bundles = engine_bundles(c, j)
            actors = [actor_cls.options(**{**self.rollout_pool.options(b), "num_gpus": min(spec.num_gpus,
                                                                                          c.num_gpus_per_node)})
                      .remote() for b in bundles]
            dist_init = ray.get(actors[0].free_addr.remote()) if len(actors) > 1 else None
            ray.get([a.start.remote(spec, cfg.model.hf_checkpoint, seed * 1000 + j, c.offload_rollout, r,
                                    len(actors), dist_init) for r, a in enumerate(actors)])
            h = EngineHandle(ray.get(actors[0].get_url.remote()), actors[0], spec.num_gpus, kind="sglang")
            h.others = actors[1:]
        if wait:
            h.client.wait_healthy(timeout=600.0)
        return h

    def restart_engine(self, j: int) -> None:
        """Replace a dead engine: new actor in the same bundle, current weights, registered again."""
        import ray

        from slime.rollout.client import RouterAdmin

        admin = RouterAdmin(self.router_url)
        with self.sync.lock:
            old = self.engines[j]
            admin.remove_worker(old.url)
            for a in [old.actor, *getattr(old, "others", [])]:
                try:
                    ray.kill(a)
                except Exception:  # noqa: BLE001 - already gone
                    pass
            new = self._start_engine(j)
            self.engines[j] = new  # the same list as self.sync.engines
            if self.cfg.cluster.colocate and self.train_pending:
                self.unregistered.add(j)  # the pool is the trainer's now; joins at the next sync
                new.client.release_memory()
                return
            if self.train_pending:
                self.unregistered.add(j)  # weights are mid-update: it joins with the next sync
                return
            self.sync.sync_one(new)
            admin.add_worker(new.url, *self._worker(j))
            admin.wait_workers([new.url], timeout=600.0)

    # -- the phases train.py calls ---------------------------------------------------------------
    def generate_async(self, rollout_id: int):
        return self.manager.generate.remote(rollout_id)

    def generate(self, rollout_id: int):
        import ray

        return ray.get(self.generate_async(rollout_id))

    def regenerate_stale(self, rollout_id: int, samples: list, metrics: dict) -> tuple[list, dict]:
        """--max-weight-staleness: drop (and count) groups older than the limit; refill the rollout
        with fresh groups generated on the trainer's current weights (nothing is in flight here)."""
        from slime.rollout.staleness import drop_stale_groups

        r = self.cfg.rollout
        n, target = r.n_samples_per_prompt, r.rollout_batch_size * r.n_samples_per_prompt
        kept, dropped = drop_stale_groups(samples, n, self.version, r.max_weight_staleness)
        while len(kept) < target:
            self.sync_weights()  # fresh groups must come from the weights being trained
            more, metrics = self.generate(rollout_id)  # the rollout/ and perf/ figures of what is trained
            kept.extend(more[:target - len(kept)])
        from slime.rollout.producers import sample_id

        for i, s in enumerate(kept):
            s.group_index, s.sample_id = i // n, sample_id(rollout_id, i // n, i % n)
        if r.max_weight_staleness is not None:
            metrics["rollout/stale_dropped_samples"] = float(dropped)
        return kept, metrics

    def build_records(self, samples) -> list:
        from slime.data.train_data import build_records

        r, loss = self.cfg.rollout, self.cfg.loss
        return build_records(samples, r.n_samples_per_prompt, r.rollout_batch_size, loss.advantage_estimator,
                             loss.normalize_rewards, loss.std_normalization)

    def train(self, records) -> dict[str, float]:
        """Colocated: the engines release their memory, the trainer takes the GPU back (onload),
        trains, and stays on the GPU until its weights are synced (sync_weights offloads it).
        GPU memory (GiB) of each phase goes into memory/*."""
        import ray

        t0 = time.monotonic()
        c = self.cfg.cluster
        mem: dict[str, float] = {}
        with self.sync.lock:
            self.train_pending = True
        if c.colocate and c.offload_rollout:  # the pool goes to the trainer: engines release memory
            mem.update(self._engine_memory("rollout"))
            with self.timeline.phase("offload"):
                self.sync.release_engines()
            self.engines_released = True
        if c.offload_train and self.trainer_offloaded:
            with self.timeline.phase("onload"):
                mem.update(ray.get([t.onload.remote() for t in [*self.trainers, *self.critics]])[0])
            self.trainer_offloaded = False
        ray.get([t.memory.remote(reset_peak=True) for t in self.trainers])
        ppo_metrics = self._set_ppo_targets(records) if self.critics else {}
        # The policy and the critic train at once, on the same steps (the critic ranks sit beside the trainer ranks).
        jobs = [t.train.remote(records, self.steps_per_rollout) for t in self.trainers]
        jobs += [a.train.remote(records, self.steps_per_rollout) for a in self.critics]
        results = ray.get(jobs)
        metrics = results[0]
        self.timeline.absorb(pop_phases(metrics))  # rank 0's sub-phases (ranks run them side by side)
        for other in results[1:]:
            pop_phases(other)
        if self.critics:
            metrics.update(results[len(self.trainers)])
            metrics.update(ppo_metrics)
        self.version += 1  # the trainer now holds the next policy version (engines get it at the next sync)
        mem.update({k.replace("train_", "train_step_"): v for k, v in ray.get(self.trainers[0].memory.remote()).items()})
        metrics.update({f"memory/{k}": v for k, v in mem.items()})
        metrics["perf/train_time"] = time.monotonic() - t0
        tokens = sum(len(r.tokens) for r in records) * self.steps_per_rollout / max(self.steps_per_rollout, 1)
        metrics["perf/train_tokens_per_s"] = tokens / max(metrics["perf/train_time"], 1e-9)
        flops = metrics.pop("perf/train_flops", None)
        if flops:  # per rank, over the trainer's own compute time (perf/train_seconds)
            metrics["perf/train_tflops_per_gpu"] = flops / max(metrics.get("perf/train_seconds", 0.0), 1e-9) / 1e12
            metrics["perf/mfu"] = metrics["perf/train_tflops_per_gpu"] / PEAK_TFLOPS
        return metrics

    def _set_ppo_targets(self, records) -> dict[str, float]:
        """--advantage-estimator ppo: the critic's values of this rollout (before its update), the
        KL in the reward from the trainer's policy and reference log-probs (--kl-coef), and GAE
        (slime/training/advantages.py) give every record its token advantages and returns."""
        import ray

        from slime.training.advantages import ppo_targets

        loss = self.cfg.loss
        values = ray.get(self.critics[0].values.remote(records))
        olds = refs = None
        if loss.kl_coef != 0.0:  # log-probs are collective steps: every trainer rank, rank 0's answer
            refs = ray.get([t.log_probs.remote(records, True) for t in self.trainers])[0]
            if loss.use_rollout_logprobs:  # the trainer's old policy is the engine's then, here too
                olds = [r.rollout_log_probs for r in records]
            else:
                olds = ray.get([t.log_probs.remote(records) for t in self.trainers])[0]
        masks = [r.response_mask for r in records]
        advantages, returns = ppo_targets([r.advantage for r in records], masks, values, olds, refs, loss.kl_coef,
                                          loss.kl_loss_type, loss.gamma, loss.lambd, loss.normalize_advantages)
        for r, v, a, g in zip(records, values, advantages, returns):
            r.values, r.token_advantages, r.returns = v, a, g

        def per_sample_mean(rows) -> float:  # each sample's token mean, then over samples (as train/*)
            means = [sum(x for x, k in zip(row, m) if k) / max(sum(m), 1) for row, m in zip(rows, masks)]
            return sum(means) / max(len(means), 1)
        return {"critic/returns_mean": per_sample_mean(returns), "critic/advantages_mean": per_sample_mean(advantages)}

    def _engine_memory(self, phase: str) -> dict[str, float]:
        import ray

        actors = [h.actor for h in self.engines if h.actor is not None and h.kind == "embedded"]
        if not actors or not self.cfg.cluster.use_gpu:
            return {}
        got = ray.get(actors[0].memory.remote(reset_peak=True))
        return {k.replace("engine_", f"{phase}_engine_"): v for k, v in got.items()}

    def ack(self, rollout_id: int) -> None:
        """Rollout `rollout_id` is trained: the straw queue may drop it (no-op without a queue)."""
        import ray

        if self.cfg.rollout.queue_dir:
            ray.get(self.manager.ack.remote(rollout_id))

    def sync_due(self, rollout_id: int) -> bool:
        """--update-weights-interval N: sync after every N-th trained rollout and after the last."""
        return (rollout_id + 1) % max(self.cfg.sync.interval, 1) == 0 or rollout_id == self.num_rollout - 1

    def sync_check_metrics(self) -> dict[str, float]:
        """The last post-sync check's largest |engine - trainer| log-prob over the engines
        (``sync/check_logp_max_diff``; nothing when --weight-sync-check-tol is off)."""
        checks = self.sync.last_check.values()
        return {"sync/check_logp_max_diff": float(max(checks))} if checks else {}

    def sync_weights(self, push: bool = True) -> float:
        """Push the trainer's current version to the engines (no-op when they already serve it, or
        when `push` is False: --update-weights-interval skips this rollout). Colocated: the engines
        take their memory back first; the trainer offloads after (its GPU copy is what the hand-over
        reads). Callers make sure no generation request is in flight, so no sample mixes versions."""
        import ray

        from slime.rollout.client import RouterAdmin

        c = self.cfg.cluster
        with self.sync.lock:
            if self.engines_released:
                with self.timeline.phase("onload"):
                    self.sync.resume_engines()
                self.engines_released = False
            if not push or self.sync.version == self.version:
                took = 0.0
            else:
                took = self.sync.sync(self.version)
                self.train_pending = False
            if self.unregistered:
                admin = RouterAdmin(self.router_url)
                for j in sorted(self.unregistered):
                    admin.add_worker(self.engines[j].url, *self._worker(j))
                admin.wait_workers([self.engines[j].url for j in self.unregistered], timeout=600.0)
                self.unregistered.clear()
        if c.offload_train and not self.trainer_offloaded:
            try:
                with self.timeline.phase("offload"):
                    got = ray.get([t.offload.remote() for t in [*self.trainers, *self.critics]])
                self.last_offload = {**got[0], **(got[len(self.trainers)] if self.critics else {})}
                self.trainer_offloaded = True
            except Exception as e:  # noqa: BLE001 - keep training resident, say so once
                print(f"[slime] warning: --offload-train failed ({e!r:.400}); the trainer stays on the GPU", flush=True)
                c.offload_train = False
                self.last_offload = {"offload_failed": 1.0}
        return took

    def evaluate(self, rollout_id: int) -> dict[str, float]:
        from slime.eval import run_eval

        t0 = time.monotonic()
        out = run_eval(self.manager, rollout_id)
        out["perf/eval_time"] = time.monotonic() - t0
        return out

    def save_due(self, rollout_id: int) -> bool:
        m = self.cfg.model
        return bool(m.save and m.save_interval) and (
            (rollout_id + 1) % (m.save_interval or 1) == 0 or rollout_id == self.num_rollout - 1)

    def save(self, rollout_id: int) -> str:
        import ray

        nxt = rollout_id + 1
        state = {"next_rollout_id": nxt, "rollout_id": rollout_id, "weight_version": self.version,
                 **ray.get(self.manager.state_for.remote(nxt))}  # data position + partial-rollout buffer
        offloaded = self.trainer_offloaded
        if offloaded:  # a sharded save reads the GPU state
            ray.get([t.onload.remote() for t in [*self.trainers, *self.critics]])
        try:
            if self.critics:  # first: the policy's marker, written last, makes the pair visible
                from slime.checkpoint import critic_roots

                _, critic_root = critic_roots(self.cfg.model, self.cfg.critic)
                ray.get([a.save.remote(critic_root, nxt, state) for a in self.critics])
            return ray.get([t.save.remote(self.cfg.model.save, nxt, state) for t in self.trainers])[0]
        finally:
            if offloaded:
                ray.get([t.offload.remote() for t in [*self.trainers, *self.critics]])

    def shutdown(self) -> None:
        import ray

        if self.monitor is not None:
            self.monitor.stop()
        if self.manager is not None:
            try:
                ray.get(self.manager.close.remote(), timeout=10)  # the straw queue's lock and files
            except Exception:  # noqa: BLE001 - best effort: the actor may already be gone
                pass
        owned = [a for h in self.engines for a in [h.actor, *getattr(h, "others", [])] if a is not None]
        for a in [*owned, self.router]:
            try:
                ray.get(a.shutdown.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - best effort: the actor may already be gone
                pass
        for a in [*owned, self.router, *self.trainers, *self.critics, self.manager]:
            if a is not None:
                ray.kill(a)
        from ray.util.placement_group import remove_placement_group

        for pg in self.pgs:
            remove_placement_group(pg)
