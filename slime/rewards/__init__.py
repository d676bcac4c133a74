"""Built-in reward functions, by ``--rm-type`` name.

Every built-in is ``fn(response: str, label) -> RewardResult`` (pure, sync, cheap). Custom
reward hooks (``--custom-rm-path``) are loaded and called through :mod:`slime.rewards.hooks`.
The math graders live in :mod:`~slime.rewards.math_reward` and :mod:`~slime.rewards.deepscaler`;
the two small non-math ones (f1, random) are defined here.
"""

from __future__ import annotations

import hashlib
import re
import string
from collections import Counter
from typing import Callable

from slime.rewards.answer import split_after_think
from slime.rewards.deepscaler import deepscaler, summarize_reward_results, think_block_warning
from slime.rewards.math_reward import RewardResult, boxed_math_reward, math_reward

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def _qa_tokens(text: str) -> list[str]:
    # SQuAD normalization: lower case, no punctuation or articles, single spaces.
    return _ARTICLES.sub(" ", text.lower().translate(_PUNCT)).split()


def f1(response: str, label: object) -> RewardResult:
    """``--rm-type f1``: SQuAD-style token-overlap F1 between the answer and the label."""
    solution, has_think = split_after_think(response)
    gold = _qa_tokens("" if label is None else str(label))
    if not gold:
        return RewardResult(0.0, "no_label", has_think)
    pred = _qa_tokens(solution)
    if not pred:
        return RewardResult(0.0, "no_answer", has_think)
    common = sum((Counter(pred) & Counter(gold)).values())
    if common == 0:
        return RewardResult(0.0, "wrong", has_think)
    precision, recall = common / len(pred), common / len(gold)
    score = 2 * precision * recall / (precision + recall)
    return RewardResult(score, "correct" if score == 1.0 else "partial", has_think)


RANDOM_REWARD_SEED = 0


def random_reward(response: str, label: object, seed: int = RANDOM_REWARD_SEED) -> RewardResult:
    """``--rm-type random`` -- FOR TESTS ONLY: a 0/1 reward that ignores correctness.

    Deterministic in (seed, response, label), so a test run is reproducible across processes
    (Python's own ``hash`` is salted per process, hence sha256).
    """
    digest = hashlib.sha256(f"{seed}\x00{response}\x00{label}".encode()).digest()
    _, has_think = split_after_think(response)
    return RewardResult(float(digest[0] & 1), "random_test_only", has_think)


RewardFn = Callable[[str, object], RewardResult]

REWARD_TYPES: dict[str, RewardFn] = {
    "deepscaler": deepscaler,
    "math": math_reward,
    "boxed_math": boxed_math_reward,
    "f1": f1,
    "random": random_reward,  # tests only: ignores correctness
}
# Registered for tests; a user-facing list (the lab's choices) leaves them out.
TEST_ONLY_REWARDS = frozenset({"random"})


def get_reward_fn(name: str) -> RewardFn:
    """The built-in reward registered as ``name``; unknown names list the built-ins."""
    try:
        return REWARD_TYPES[name]
    except KeyError:
        known = ", ".join(sorted(REWARD_TYPES))
        raise ValueError(
            f"unknown --rm-type {name!r}; built-in reward types: {known} "
            "(or give a custom reward function with --custom-rm-path)"
        ) from None


__all__ = [
    "REWARD_TYPES",
    "TEST_ONLY_REWARDS",
    "boxed_math_reward",
    "deepscaler",
    "f1",
    "math_reward",
    "random_reward",
    "RewardFn",
    "RewardResult",
    "get_reward_fn",
    "summarize_reward_results",
    "think_block_warning",
]
