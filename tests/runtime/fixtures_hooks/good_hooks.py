"""Hooks that follow the contracts in slime/rewards/hooks.py."""

from __future__ import annotations

from typing import Any

NOT_A_FUNCTION = 42


def sync_reward(sample: Any) -> float:
    return 1.0 if sample.response == sample.label else 0.0


async def async_reward(sample: Any) -> float:
    return 1.0 if sample.response == sample.label else 0.0


async def slime_style_reward(args: Any, sample: Any) -> float:
    return float(args["bonus"]) if sample.response == sample.label else 0.0


def simple_reward(response: str, label: str, metadata: dict) -> float:
    return float(response == label) + metadata.get("extra", 0.0)


def dict_reward(sample: Any) -> dict[str, float]:
    return {"score": 0.5, "acc": 1.0}


async def group_reward(samples: list) -> list[float]:
    return [float(i) for i, _ in enumerate(samples)]


def short_group_reward(samples: list) -> list[float]:
    return [1.0]


def raising_reward(sample: Any) -> float:
    raise RuntimeError("grader crashed")


def string_reward(sample: Any) -> str:
    return "1.0"


def too_many_params(a: Any, b: Any, c: Any, d: Any) -> float:
    return 0.0


def sync_generate(args: Any, sample: Any, sampling_params: dict) -> Any:
    return sample


async def async_generate(args: Any, sample: Any, sampling_params: dict) -> Any:
    return sample
