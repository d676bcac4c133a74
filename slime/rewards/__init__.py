"""Built-in reward functions, by ``--rm-type`` name.

Every built-in is ``fn(response: str, label) -> RewardResult`` (pure, sync, cheap); the remote
reward model (``remote_rm``, :mod:`~slime.rewards.remote`) is built from ``--rm-url`` by
:func:`make_reward_fn`. ``boxed_<name>`` is any of them applied to the last ``\\boxed{}`` answer
only. Custom reward hooks (``--custom-rm-path``) are loaded and called through
:mod:`slime.rewards.hooks`. Graders: math (:mod:`~slime.rewards.math_reward`), deepscaler,
dapo, gpqa (:mod:`~slime.rewards.choice`); the two small ones (f1, random) are defined here.
Torch-free: the parser and the lab list these names.
"""

from __future__ import annotations

import hashlib
import re
import string
from collections import Counter
from typing import Callable

from slime.refusals import declare
from slime.rewards.answer import last_boxed, split_after_think
from slime.rewards.choice import gpqa
from slime.rewards.dapo import dapo
from slime.rewards.deepscaler import deepscaler, summarize_reward_results, think_block_warning
from slime.rewards.math_reward import RewardResult, boxed_math_reward, math_reward

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def _qa_tokens(text: str) -> list[str]:
    # SQuAD normalization: lower case, no punctuation or articles, single spaces.
    return _ARTICLES.sub(" ", text.lower().translate(_PUNCT)).split()


YES_NO_NO_ANSWER = ("yes", "no", "noanswer", "no answer")


def f1(response: str, label: object) -> RewardResult:
    """``--rm-type f1``: SQuAD-style token-overlap F1 between the answer and the label.

    Yes/no/no-answer rule (HotpotQA): when either side normalizes to ``yes``, ``no`` or
    ``noanswer`` the two must be equal, else 0 (``yes it is`` vs ``yes`` is wrong, not 0.5).
    """
    solution, has_think = split_after_think(response)
    gold = _qa_tokens("" if label is None else str(label))
    if not gold:
        return RewardResult(0.0, "no_label", has_think)
    pred = _qa_tokens(solution)
    if not pred:
        return RewardResult(0.0, "no_answer", has_think)
    norm_pred, norm_gold = " ".join(pred), " ".join(gold)
    if (norm_pred in YES_NO_NO_ANSWER or norm_gold in YES_NO_NO_ANSWER) and norm_pred != norm_gold:
        return RewardResult(0.0, "wrong", has_think)
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
    "dapo": dapo,
    "f1": f1,
    "gpqa": gpqa,
    "random": random_reward,  # tests only: ignores correctness
}
# Registered for tests; a user-facing list (the lab's choices) leaves them out.
TEST_ONLY_REWARDS = frozenset({"random"})
REMOTE_REWARD_TYPES = ("remote_rm",)  # built from --rm-url by make_reward_fn
BOXED_GRADERS = (deepscaler, boxed_math_reward)  # already grade only the last \\boxed{} answer
BOXED_PREFIX = "boxed_"


def reward_type_names() -> list[str]:
    """Every --rm-type name without the boxed_ prefix (any of them also takes it)."""
    return [*REWARD_TYPES, *REMOTE_REWARD_TYPES]


_R = declare("rewards", {
    "unknown_type": ("name", "known"),
    "needs_url": ("name",),
})


def reward_type_error(name: str) -> str | None:
    """None when ``name`` is a built-in --rm-type (or boxed_ + one), else the message."""
    base = name[len(BOXED_PREFIX):] if name.startswith(BOXED_PREFIX) and name not in REWARD_TYPES else name
    if base in REWARD_TYPES or base in REMOTE_REWARD_TYPES:
        return None
    known = ", ".join(sorted(reward_type_names()))
    return _R("unknown_type", name=name, known=known)


def boxed(fn: RewardFn) -> RewardFn:
    """``boxed_<name>``: grade only the last ``\\boxed{}`` after the reasoning block with ``fn``;
    a response without one scores 0 (``no_answer``). The reasoning block is kept in front of
    the boxed answer, so graders that require one (deepscaler) still see it."""

    def graded(response: str, label: object, sample: object = None) -> RewardResult:
        solution, has_think = split_after_think(response)
        answer = last_boxed(solution)
        if answer is None:
            return RewardResult(0.0, "no_answer", has_think)
        kwargs = {"sample": sample} if getattr(fn, "wants_sample", False) else {}
        if fn in BOXED_GRADERS:  # they read the last \\boxed{} themselves: same verdict, same reasons
            return fn(response, label, **kwargs)
        head = response[: len(response) - len(solution)]
        return fn(head + answer, label, **kwargs)

    graded.wants_sample = getattr(fn, "wants_sample", False)  # type: ignore[attr-defined]
    graded.__name__ = f"boxed_{getattr(fn, '__name__', 'reward')}"
    return graded


def make_reward_fn(name: str, rm_url: str | None = None, timeout: float = 60.0, max_retries: int = 3) -> RewardFn:
    """The reward for ``--rm-type name`` (remote_rm needs ``rm_url``); unknown names raise."""
    if name in REWARD_TYPES:
        return REWARD_TYPES[name]
    err = reward_type_error(name)
    if err:
        raise ValueError(err)
    if name.startswith(BOXED_PREFIX):
        return boxed(make_reward_fn(name[len(BOXED_PREFIX):], rm_url, timeout, max_retries))
    if not rm_url:
        raise ValueError(_R("needs_url", name=name))
    from slime.rewards.remote import RemoteRewardModel

    return RemoteRewardModel(rm_url, timeout, max_retries)


def get_reward_fn(name: str) -> RewardFn:
    """The built-in reward registered as ``name`` (boxed_ variants included; remote_rm needs
    :func:`make_reward_fn`); unknown names list the built-ins."""
    if name.removeprefix(BOXED_PREFIX) in REMOTE_REWARD_TYPES:
        raise ValueError(f"--rm-type {name} is built from --rm-url: use make_reward_fn")
    return make_reward_fn(name)


__all__ = [
    "REWARD_TYPES",
    "TEST_ONLY_REWARDS",
    "boxed",
    "dapo",
    "gpqa",
    "make_reward_fn",
    "reward_type_error",
    "reward_type_names",
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
