"""Synchronous GRPO/PPO loop: rollout -> reward -> batch -> train -> sync -> eval -> save.

    python3 train.py --hf-checkpoint ... --prompt-data ... --rollout-batch-size 16 ...
(see docs/en/runtime.md; `python3 train.py --help` lists every flag)
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    if "--dry-run" in argv:  # pre-flight and placement plan only: nothing is loaded or reserved
        from slime.dry_run import main as dry_run_main

        sys.exit(dry_run_main([a for a in argv if a != "--dry-run"]))

    from slime.args import UsageError, parse_args
    from slime.eval import eval_due
    from slime.metrics import MetricsLogger, dump_rollout
    from slime.ray.runtime import Runtime
    from slime.rollout.staleness import staleness_metrics
    from slime.timeline import book_rollout

    try:
        cfg = parse_args(argv)
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
        for rollout_id in range(rt.start_rollout_id, rt.num_rollout):
            clock.reset()
            with clock.phase("rollout"):
                samples, metrics = rt.generate(rollout_id)         # rollout + reward
            book_rollout(clock, metrics)
            if cfg.log.save_debug_rollout_data:
                dump_rollout(cfg.log.save_debug_rollout_data, rollout_id, samples)
            records = rt.build_records(samples)                    # group-normalized advantages
            metrics.update(staleness_metrics(samples, rt.version))  # > 0 only with --update-weights-interval > 1
            with clock.phase(None):                                # books the trainer's own sub-phases
                metrics.update(rt.train(records))                  # optimizer steps, version += 1
            rt.ack(rollout_id)                                     # straw queue: trained, drop it
            with clock.phase("sync"):                              # engines' onload, trainer's offload inside
                if rt.sync_due(rollout_id):                        # --update-weights-interval
                    metrics["perf/sync_time"] = rt.sync_weights()  # trainer -> engines
                else:                                              # colocated: hand the GPUs back, no push
                    rt.sync_weights(push=False)
            metrics.update({f"memory/{k}": v for k, v in rt.last_offload.items()})  # colocated: after offload
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
