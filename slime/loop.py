"""The training loop's frame, written once for train.py (synchronous) and train_async.py (fully async).

run() does what both loops do: the dry run, parsing, starting the runtime (pre-flight checks run
before Ray reserves anything), the eval before training, and per rollout the common middle (staleness,
records, train, ack) and tail (eval, save, phase metrics, the metrics line), then the summary and the
shutdown. A loop supplies only what differs (Steps): how a rollout arrives, and how weights are synced.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    from slime.config import Config
    from slime.ray.runtime import Runtime


class Steps(Protocol):
    def rollout(self, rollout_id: int) -> tuple[list, dict[str, Any]]:
        """The rollout's samples and metrics; books its own phases on the runtime's timeline."""
        ...

    def sync(self, rollout_id: int, metrics: dict[str, Any]) -> None:
        """After training: the weight sync (and what it adds to the metrics)."""
        ...


def run(argv: list[str], make_steps: Callable[[Config, Runtime], Steps], async_mode: bool = False) -> None:
    if "--dry-run" in argv:  # pre-flight and placement plan only: nothing is loaded or reserved
        from slime.dry_run import main as dry_run_main

        sys.exit(dry_run_main([a for a in argv if a != "--dry-run"], async_mode=async_mode))

    from slime.args import UsageError, parse_args
    from slime.eval import eval_due
    from slime.metrics import MetricsLogger
    from slime.ray.runtime import Runtime

    try:
        cfg = parse_args(argv, async_mode=async_mode)  # async: validate() refuses --colocate
    except UsageError as e:
        sys.exit(f"slime: {e}")
    rt = Runtime.start(cfg)  # pre-flight checks run before Ray reserves anything
    log = MetricsLogger(cfg.log.output_dir, cfg.log.use_tensorboard, rt.num_rollout)
    clock = rt.timeline  # where each second of a step goes (slime/timeline.py): phase/* in metrics.jsonl
    try:
        last = rt.num_rollout - 1
        if rt.start_rollout_id == 0 and eval_due(cfg.eval, -1, last, before_train=True):
            clock.reset()
            with clock.phase("eval"):
                metrics = rt.evaluate(-1)
            log.log(0, -1, {**metrics, **clock.metrics()})
        steps = make_steps(cfg, rt)  # async: the first rollout goes in flight here
        for rollout_id in range(rt.start_rollout_id, rt.num_rollout):
            clock.reset()
            samples, metrics = steps.rollout(rollout_id)
            _train(cfg, rt, rollout_id, samples, metrics)
            steps.sync(rollout_id, metrics)
            if eval_due(cfg.eval, rollout_id, last):
                with clock.phase("eval"):
                    metrics.update(rt.evaluate(rollout_id))
            if rt.save_due(rollout_id):
                with clock.phase("checkpoint"):
                    rt.save(rollout_id)
            metrics.update(clock.metrics())                        # phase/* and perf/step_time
            log.log(rollout_id + 1, rollout_id, metrics)
        print(log.summary(), flush=True)                           # names the largest phase
    finally:
        log.close()
        rt.shutdown()


def _train(cfg: Config, rt: Runtime, rollout_id: int, samples: list, metrics: dict[str, Any]) -> None:
    from slime.metrics import dump_rollout
    from slime.rollout.staleness import staleness_metrics

    metrics.update(staleness_metrics(samples, rt.version))  # > 0 only when rollouts run ahead of training
    if cfg.log.save_debug_rollout_data:
        dump_rollout(cfg.log.save_debug_rollout_data, rollout_id, samples)
    records = rt.build_records(samples)                    # group-normalized advantages
    with rt.timeline.phase(None):                          # books the trainer's own sub-phases
        metrics.update(rt.train(records))                  # optimizer steps, version += 1
    rt.ack(rollout_id)                                     # straw queue: trained, drop it
