"""Fully async loop: rollout N+1 is in flight while rollout N trains (separate pools only).

Samples of rollout N+1 come from the weights before step N's update (one version stale);
rollout/staleness_mean reports it. Weights sync after the in-flight rollout has finished.
"""

from __future__ import annotations

import sys
import time


def main(argv: list[str]) -> None:
    if "--dry-run" in argv:  # pre-flight and placement plan only: nothing is loaded or reserved
        from slime.dry_run import main as dry_run_main

        sys.exit(dry_run_main([a for a in argv if a != "--dry-run"], async_mode=True))

    import ray

    from slime.args import UsageError, parse_args
    from slime.eval import eval_due
    from slime.metrics import MetricsLogger, dump_rollout
    from slime.ray.runtime import Runtime

    try:
        cfg = parse_args(argv, async_mode=True)  # validate() refuses --colocate here
    except UsageError as e:
        sys.exit(f"slime: {e}")
    rt = Runtime.start(cfg)
    log = MetricsLogger(cfg.log.output_dir, cfg.log.use_tensorboard, rt.num_rollout)
    try:
        last = rt.num_rollout - 1
        if rt.start_rollout_id == 0 and eval_due(cfg.eval, -1, last, before_train=True):
            log.log(0, -1, rt.evaluate(-1))
        in_flight = rt.generate_async(rt.start_rollout_id) if rt.num_rollout > rt.start_rollout_id else None
        for rollout_id in range(rt.start_rollout_id, rt.num_rollout):
            t0 = time.monotonic()
            samples, metrics = ray.get(in_flight)
            if rollout_id < last:
                in_flight = rt.generate_async(rollout_id + 1)      # next rollout runs during training
            if cfg.log.save_debug_rollout_data:
                dump_rollout(cfg.log.save_debug_rollout_data, rollout_id, samples)
            records = rt.build_records(samples)
            metrics.update(rt.train(records))
            rt.ack(rollout_id)                                     # straw queue: trained, drop it
            metrics["rollout/staleness_mean"] = sum(rt.version - int(s.weight_version or 0)
                                                    for s in samples) / len(samples)
            metrics["perf/sync_time"] = rt.sync_weights()          # waits for the in-flight batch
            if eval_due(cfg.eval, rollout_id, last):
                metrics.update(rt.evaluate(rollout_id))
            if rt.save_due(rollout_id):
                rt.save(rollout_id)
            metrics["perf/step_time"] = time.monotonic() - t0
            log.log(rollout_id + 1, rollout_id, metrics)
    finally:
        log.close()
        rt.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
