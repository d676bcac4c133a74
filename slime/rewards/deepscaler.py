"""``--rm-type deepscaler``: grade only the text after the reasoning block.

DeepScaleR-style data expects a reasoning model: the answer is the last ``\\boxed{}`` after the
last ``</think>`` (or after a ``###Response`` marker). A response without either marker scores 0
with ``reason="no_think_block"`` instead of a silent 0: on a model that never emits ``</think>``
every reward is 0, every advantage is 0 and nothing is learned (REW-3), so the rollout manager
logs ``rollout/no_think_block_ratio`` and warns (:func:`think_block_warning`).
"""

from __future__ import annotations

from typing import Iterable

from slime.rewards.answer import split_after_think
from slime.rewards.math_reward import RewardResult, grade

NO_THINK_BLOCK_WARN_RATIO = 0.5
"""Above this share of responses without a think block, the run is probably misconfigured."""


def deepscaler(response: str, label: object) -> RewardResult:
    """1.0 when the last boxed answer after ``</think>`` / ``###Response`` matches ``label``."""
    solution, has_think = split_after_think(response)
    if not has_think:
        return RewardResult(0.0, "no_think_block", False)
    return grade(solution, label, has_think_block=True, boxed_only=True)


def summarize_reward_results(results: Iterable[RewardResult]) -> dict[str, float]:
    """Rollout metrics: mean score and the share of each failure reason.

    Keys: ``rollout/reward_mean``, ``rollout/no_think_block_ratio``, ``rollout/no_answer_ratio``,
    ``rollout/no_label_ratio``. An empty input gives zeros.
    """
    items = list(results)
    total = len(items)
    if total == 0:
        return {
            "rollout/reward_mean": 0.0,
            "rollout/no_think_block_ratio": 0.0,
            "rollout/no_answer_ratio": 0.0,
            "rollout/no_label_ratio": 0.0,
        }
    return {
        "rollout/reward_mean": sum(r.score for r in items) / total,
        "rollout/no_think_block_ratio": sum(not r.has_think_block for r in items) / total,
        "rollout/no_answer_ratio": sum(r.reason == "no_answer" for r in items) / total,
        "rollout/no_label_ratio": sum(r.reason == "no_label" for r in items) / total,
    }


def think_block_warning(metrics: dict[str, float], threshold: float = NO_THINK_BLOCK_WARN_RATIO) -> str | None:
    """A warning for the rollout log when most responses lack a think block, else None."""
    ratio = metrics.get("rollout/no_think_block_ratio", 0.0)
    if ratio <= threshold:
        return None
    return (
        f"{ratio:.0%} of responses have no </think> or ###Response marker, and deepscaler scores "
        "them 0: rewards are all equal and nothing is learned. Use a reasoning model, or "
        "--rm-type math / boxed_math for non-reasoning models."
    )
