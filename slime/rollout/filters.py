"""Dynamic-sampling filters (--dynamic-sampling-filter-path): `fn(args, samples) -> bool`, called
with one finished, scored group of n samples; True keeps the group. `args` is the rollout's
GenerateContext (slime.rollout.generate). A filter may also return an object with a `keep` attribute
(slime's DynamicFilterOutput shape).
"""

from __future__ import annotations

from typing import Any


def nonzero_reward_std(args: Any, samples: list) -> bool:
    """Keep groups whose rewards differ: a group where every sample scored the same has zero
    advantage everywhere under group normalization and teaches nothing (DAPO's dynamic sampling)."""
    rewards = [float(s.reward or 0.0) for s in samples]
    if len(rewards) < 2:
        return False
    mean = sum(rewards) / len(rewards)
    return sum((r - mean) ** 2 for r in rewards) / len(rewards) > 1e-12


def keep_all(args: Any, samples: list) -> bool:
    return True


def filter_keeps(result: Any) -> bool:
    return bool(getattr(result, "keep", result))
