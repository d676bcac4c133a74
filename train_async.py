"""Fully async loop: rollout N+1 is in flight while rollout N trains (separate pools only).

Rollout N+1 is generated on the weights the engines hold while rollout N trains, so it is one
version stale when it is trained (--update-weights-interval k: up to k). Before a weight sync the
loop waits until the in-flight rollout has finished: no request ever runs across a sync, so every
token's weight version is the one its sample reports, and rollout/staleness_* (versions behind the
weights being trained) is the truth. --max-weight-staleness N drops groups staler than N versions
(counted in rollout/stale_dropped_samples) and refills the rollout with fresh ones.

With the straw queue (--rollout-queue-dir), producer actors generate each rollout's groups into the
queue, one beside each engine group unless --num-rollout-producers says otherwise; a producer killed
mid-rollout is restarted on its own queue and the rollout loses and repeats nothing
(slime/rollout/producers.py, docs/en/fully-async.md#distributed-producers).
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    if "--dry-run" in argv:  # pre-flight and placement plan only: nothing is loaded or reserved
        from slime.dry_run import main as dry_run_main

        sys.exit(dry_run_main([a for a in argv if a != "--dry-run"], async_mode=True))

    import ray

    from slime.args import UsageError, parse_args
    from slime.eval import eval_due
    from slime.metrics import MetricsLogger, dump_rollout
    from slime.ray.runtime import Runtime
    from slime.rollout.staleness import staleness_metrics

    try:
        cfg = parse_args(argv, async_mode=True)  # validate() refuses --colocate here
    except UsageError as e:
        sys.exit(f"slime: {e}")
    rt = Runtime.start(cfg)
    log = MetricsLogger(cfg.log.output_dir, cfg.log.use_tensorboard, rt.num_rollout)
    # The step's timeline (slime/timeline.py). Rollout and reward run during the previous step's
    # training here: phase/rollout is the time the loop waits for them, phase/reward stays 0.
    clock = rt.timeline
    try:
        last = rt.num_rollout - 1
        if rt.start_rollout_id == 0 and eval_due(cfg.eval, -1, last, before_train=True):
            clock.reset()
            with clock.phase("eval"):
                metrics = rt.evaluate(-1)
            log.log(0, -1, {**metrics, **clock.metrics()})
        in_flight = rt.generate_async(rt.start_rollout_id) if rt.num_rollout > rt.start_rollout_id else None
        for rollout_id in range(rt.start_rollout_id, rt.num_rollout):
            clock.reset()
            with clock.phase("rollout"):
                samples, metrics = ray.get(in_flight)
                in_flight = None
                if cfg.rollout.max_weight_staleness is not None:  # drop + count stale groups, refill fresh
                    samples, metrics = rt.regenerate_stale(rollout_id, samples, metrics)
            metrics.update(staleness_metrics(samples, rt.version))
            if rollout_id < last:
                in_flight = rt.generate_async(rollout_id + 1)      # next rollout runs during training
            if cfg.log.save_debug_rollout_data:
                dump_rollout(cfg.log.save_debug_rollout_data, rollout_id, samples)
            records = rt.build_records(samples)
            with clock.phase(None):                                # books the trainer's own sub-phases
                metrics.update(rt.train(records))                  # version += 1
            rt.ack(rollout_id)                                     # straw queue: trained, drop it
            if rt.sync_due(rollout_id):
                if in_flight is not None:
                    with clock.phase("rollout"):
                        ray.wait([in_flight])                      # no request may run across a sync
                with clock.phase("sync"):
                    metrics["perf/sync_time"] = rt.sync_weights()
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


if __name__ == "__main__":
    main(sys.argv[1:])
