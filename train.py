"""Synchronous GRPO/PPO loop: rollout -> reward -> batch -> train -> sync -> eval -> save.

    python3 train.py --hf-checkpoint ... --prompt-data ... --rollout-batch-size 16 ...
(see docs/en/runtime.md; `python3 train.py --help` lists every flag)

The frame both loops share (parse, start, eval, train, save, log) is slime/loop.py; this file
says only how a rollout arrives (generated now, the loop waits) and how weights are synced.
"""

from __future__ import annotations

import sys
from typing import Any


class SyncSteps:
    def __init__(self, cfg, rt):
        self.rt = rt

    def rollout(self, rollout_id: int) -> tuple[list, dict[str, Any]]:
        from slime.timeline import book_rollout

        with self.rt.timeline.phase("rollout"):
            samples, metrics = self.rt.generate(rollout_id)  # rollout + reward
        book_rollout(self.rt.timeline, metrics)
        return samples, metrics

    def sync(self, rollout_id: int, metrics: dict[str, Any]) -> None:
        rt = self.rt
        with rt.timeline.phase("sync"):                        # engines' onload, trainer's offload inside
            if rt.sync_due(rollout_id):                        # --update-weights-interval
                metrics["perf/sync_time"] = rt.sync_weights()  # trainer -> engines
                metrics.update(rt.sync_check_metrics())        # the post-sync log-prob check's figure
            else:                                              # colocated: hand the GPUs back, no push
                rt.sync_weights(push=False)
        metrics.update({f"memory/{k}": v for k, v in rt.last_offload.items()})  # colocated: after offload


def main(argv: list[str]) -> None:
    from slime.loop import run

    run(argv, SyncSteps)


if __name__ == "__main__":
    main(sys.argv[1:])
