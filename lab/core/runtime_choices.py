"""The choice lists the lab offers, read from the runtime's own registries (torch-free, Ray-free).

One source of truth: the estimators are the runtime's records (`slime.estimators`, which the
`--advantage-estimator` choices list too), the KL estimators the `choices` of the runtime's flag
(`slime.flags.describe()`, the flag table), the reward types the keys of `slime.rewards.REWARD_TYPES` less
the ones the runtime marks as test-only. When the runtime gains a choice, the lab offers it with
no lab change; when it drops one, the lab stops offering it.
"""
from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def _parser_choices() -> dict[str, tuple[str, ...]]:
    from slime.flags import describe

    return {f.name: f.choices for f in describe() if f.choices}


def flag_choices(flag: str) -> tuple[str, ...]:
    """The values the runtime's parser accepts for `flag` (empty when it takes any value)."""
    return _parser_choices().get(flag, ())


def advantage_estimators() -> tuple[str, ...]:
    """The runtime's estimator records (slime/estimators.py), in the order the parser offers them."""
    from slime import estimators

    return estimators.names()


def kl_estimators() -> tuple[str, ...]:
    return flag_choices("--kl-loss-type")


def reward_types() -> tuple[str, ...]:
    """Built-in rewards a user may choose: registered, and not marked as test-only."""
    import slime.rewards as rewards

    test_only: frozenset[str] = getattr(rewards, "TEST_ONLY_REWARDS", frozenset())
    return tuple(name for name in rewards.REWARD_TYPES if name not in test_only)
