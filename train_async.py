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

The frame both loops share (parse, start, eval, train, save, log) is slime/loop.py; this file
says only how a rollout arrives (in flight during the previous step) and how weights are synced.
"""

from __future__ import annotations

import sys
from typing import Any


class AsyncSteps:
    """Rollout and reward run during the previous step's training: phase/rollout (slime/timeline.py)
    is the time the loop waits for them, phase/reward stays 0."""

    def __init__(self, cfg, rt):
        self.cfg, self.rt = cfg, rt
        self.in_flight = rt.generate_async(rt.start_rollout_id) if rt.num_rollout > rt.start_rollout_id else None

    def rollout(self, rollout_id: int) -> tuple[list, dict[str, Any]]:
        import ray

        rt = self.rt
        with rt.timeline.phase("rollout"):
            samples, metrics = ray.get(self.in_flight)
            self.in_flight = None
            if self.cfg.rollout.max_weight_staleness is not None:  # drop + count stale groups, refill fresh
                samples, metrics = rt.regenerate_stale(rollout_id, samples, metrics)
        if rollout_id < rt.num_rollout - 1:
            self.in_flight = rt.generate_async(rollout_id + 1)       # next rollout runs during training
        return samples, metrics

    def sync(self, rollout_id: int, metrics: dict[str, Any]) -> None:
        import ray

        rt = self.rt
        if rt.sync_due(rollout_id):
            if self.in_flight is not None:
                with rt.timeline.phase("rollout"):
                    ray.wait([self.in_flight])                       # no request may run across a sync
            with rt.timeline.phase("sync"):
                metrics["perf/sync_time"] = rt.sync_weights()
                metrics.update(rt.sync_check_metrics())


def main(argv: list[str]) -> None:
    from slime.loop import run

    run(argv, AsyncSteps, async_mode=True)


if __name__ == "__main__":
    main(sys.argv[1:])
