"""Held-out evaluation: when to run it, and logging it as eval/<name> (mean reward)."""

from __future__ import annotations

import ray

from slime.config import EvalConfig


def eval_due(cfg: EvalConfig, rollout_id: int, last_rollout_id: int, before_train: bool = False) -> bool:
    """Before training (unless --skip-eval-before-train), every --eval-interval rollouts, and
    after the last rollout so every run ends with a held-out number."""
    if not cfg.datasets or not cfg.interval:
        return False
    if before_train:
        return not cfg.skip_eval_before_train
    done = rollout_id + 1
    return done % cfg.interval == 0 or rollout_id == last_rollout_id


def run_eval(manager, rollout_id: int) -> dict[str, float]:
    return ray.get(manager.evaluate.remote(rollout_id))
