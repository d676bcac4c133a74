"""GET /api/grpo-example's arithmetic: the walkthrough's worked example, computed by the runtime's own
`slime.data.batch_builder.normalize_group_rewards`, and the tutorial's GRPO starting point."""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

# The tutorial's initial experiment, adopted by "Use this GRPO starting point" as one change.
GRPO_STARTING_POINT: dict[str, Any] = {
    "task.kind": "math",
    "task.input_key": "prompt",
    "task.label_key": "label",
    "task.apply_chat_template": True,
    "task.rm_type": "deepscaler",
    "task.advantage_estimator": "grpo",
    "task.n_samples_per_prompt": 8,
    "task.num_rollout": 3,
}
GRPO_EXAMPLE_REWARDS = [1, 1, 1, 1, 0, 0, 0, 0]


def worked_example() -> dict[str, Any]:
    """The walkthrough's group of rewards, their mean and sample std, and the advantages the runtime
    computes from them (`slime.data.batch_builder.normalize_group_rewards`)."""
    from slime.data.batch_builder import GRPO_EPS, normalize_group_rewards

    rewards = list(GRPO_EXAMPLE_REWARDS)
    n = len(rewards)
    mean = math.fsum(rewards) / n
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / (n - 1))
    advantages = normalize_group_rewards(rewards, n)
    return {
        "rewards": rewards,
        "n": n,
        "mean": mean,
        "std": std,
        "std_expr": _std_expr(rewards),
        "eps": GRPO_EPS,
        "advantages": advantages,
        "source": "slime.data.batch_builder.normalize_group_rewards",
        "starting_point": dict(GRPO_STARTING_POINT),
    }


def _std_expr(rewards: list[int]) -> str:
    """The exact sample std of 0/1 rewards as √(p/q): Σ(r−mean)² / (n−1) = k(n−k)/(n(n−1))."""
    n = len(rewards)
    k = sum(rewards)
    var = Fraction(k * (n - k), n * (n - 1))
    return f"√({var.numerator}/{var.denominator})"
