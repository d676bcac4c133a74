"""Rewards -> advantages -> token-level training inputs.

This module is imported by the lab's base install, which has no torch: everything here is plain
Python, and torch is imported lazily inside the tensor helpers only. The lab shows the GRPO worked
example by calling :func:`normalize_group_rewards`, and training uses the same function (or
:func:`normalize_group_rewards_tensor`, tested to agree with it), so the two cannot drift.

Samples are laid out the way the rollout manager produces them: the ``n`` samples of one prompt
are consecutive, so group ``g`` is ``rewards[g * n:(g + 1) * n]``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Sequence, Union

from slime import estimators

if TYPE_CHECKING:  # pragma: no cover - typing only, torch is optional here
    import torch

GRPO_EPS = 1e-6
"""Added to the (unbiased) group std, as in docs/en/corrections.md#grpo-normalisation: ``(r - mean) / (std + 1e-6)``."""


def _check_groups(num_rewards: int, n_samples_per_prompt: int) -> None:
    if n_samples_per_prompt < 1:
        raise ValueError(f"n_samples_per_prompt must be >= 1, got {n_samples_per_prompt}")
    if num_rewards % n_samples_per_prompt != 0:
        # slime silently falls back to one group spanning the whole batch here (REW-5); that
        # mixes prompts of different difficulty into one baseline, so we refuse instead.
        raise ValueError(
            f"got {num_rewards} rewards, which is not a multiple of n_samples_per_prompt="
            f"{n_samples_per_prompt}: every prompt group must hold exactly n samples. A custom "
            "rollout, generate or filter hook probably added or dropped samples."
        )


def _as_floats(rewards: Sequence[float]) -> list[float]:
    values = [float(r) for r in rewards]
    for i, value in enumerate(values):
        if not math.isfinite(value):
            # One NaN would silently turn its whole group's advantages into NaN.
            raise ValueError(f"reward {i} is not finite ({value}); fix the reward function")
    return values


def normalize_group_rewards(
    rewards: Sequence[float], n_samples_per_prompt: int, std_normalization: bool = True
) -> list[float]:
    """GRPO group normalization (docs/en/corrections.md#grpo-normalisation): per group of n, ``(r - mean) / (std + 1e-6)``.

    ``std`` is the unbiased (n - 1) sample standard deviation. ``std_normalization=False``
    keeps mean-centring only (``--disable-grpo-std-normalization``, Dr. GRPO); it is forced when
    n == 1, where the unbiased std is undefined. A group whose rewards are all equal gets exactly
    0.0 for every sample (no learning signal, and no float noise pretending there is one).

    >>> [round(a, 5) for a in normalize_group_rewards([1, 1, 1, 1, 0, 0, 0, 0], 8)]
    [0.93541, 0.93541, 0.93541, 0.93541, -0.93541, -0.93541, -0.93541, -0.93541]
    """
    n = n_samples_per_prompt
    _check_groups(len(rewards), n)
    values = _as_floats(rewards)
    divide_by_std = std_normalization and n > 1
    out: list[float] = []
    for start in range(0, len(values), n):
        group = values[start : start + n]
        if all(r == group[0] for r in group):
            out.extend([0.0] * n)
            continue
        mean = math.fsum(group) / n
        centred = [r - mean for r in group]
        if divide_by_std:
            std = math.sqrt(math.fsum(c * c for c in centred) / (n - 1))
            centred = [c / (std + GRPO_EPS) for c in centred]
        out.extend(centred)
    return out


# --- advantage estimators ---------------------------------------------------------------------
# Each estimator (slime/estimators.py) names the form of its per-sample advantages; this maps the
# form to the function. Token-level values that need the trainer's log-probs (KL in the reward)
# or the critic's values (ppo's GAE) are computed from these by slime/training/advantages.py.

AdvantageFn = Callable[[Sequence[float], int, bool, bool], list[float]]


def _group_norm(rewards: Sequence[float], n: int, normalize: bool, std_normalization: bool) -> list[float]:
    # GRPO (and GSPO / CISPO, which differ in the loss only): the group-relative numbers.
    _check_groups(len(rewards), n)
    if not normalize:  # --disable-rewards-normalization: raw rewards
        return _as_floats(rewards)
    return normalize_group_rewards(rewards, n, std_normalization)


def _group_centre(rewards: Sequence[float], n: int, normalize: bool, std_normalization: bool) -> list[float]:
    # Dr. GRPO (dividing by the group std up-weights near-uniform groups; its other half, the
    # constant length normalizer, is the loss's constant_norm aggregation) and REINFORCE++-baseline
    # (the group mean is the baseline; the KL in the reward and the batch whitening are token-level,
    # applied by the trainer: slime/training/advantages.py).
    return _group_norm(rewards, n, normalize, False)


def _raw(rewards: Sequence[float], n: int, normalize: bool, std_normalization: bool) -> list[float]:
    # REINFORCE++ (the sample's return, gamma = 1, no baseline) and PPO (the critic is the baseline;
    # the reward becomes GAE's reward at the last token): no group needed, so n may be 1.
    _check_groups(len(rewards), n)
    return _as_floats(rewards)


ADVANTAGE_FORMS: dict[str, AdvantageFn] = {"group_norm": _group_norm, "group_centre": _group_centre, "raw": _raw}


def get_advantage_estimator(name: str) -> AdvantageFn:
    """The advantage function of estimator ``name``; unknown names list the known ones."""
    return ADVANTAGE_FORMS[estimators.get(name).advantage]


def compute_advantages(
    rewards: Sequence[float],
    n: int,
    estimator: str = "grpo",
    normalize: bool = True,
    std_normalization: bool = True,
) -> list[float]:
    """Per-sample advantages for ``estimator`` (its record in slime/estimators.py).

    ``normalize=False`` is ``--disable-rewards-normalization`` (raw rewards);
    ``std_normalization=False`` is ``--disable-grpo-std-normalization`` (mean-centring only).
    """
    return get_advantage_estimator(estimator)(rewards, n, normalize, std_normalization)


# --- token-level helpers ----------------------------------------------------------------------


def expand_to_tokens(advantages: Sequence[float], response_lengths: Sequence[int]) -> list[list[float]]:
    """Give every response token of sample i that sample's advantage (one list per sample)."""
    if len(advantages) != len(response_lengths):
        raise ValueError(
            f"{len(advantages)} advantages but {len(response_lengths)} response lengths"
        )
    out: list[list[float]] = []
    for i, (adv, length) in enumerate(zip(advantages, response_lengths)):
        if length < 0:
            raise ValueError(f"sample {i} has a negative response length ({length})")
        out.append([float(adv)] * int(length))
    return out


def build_loss_mask(
    prompt_len: int,
    response_len: int,
    response_mask: Sequence[int] | None = None,
    remove_sample: bool = False,
) -> list[int]:
    """Loss mask aligned with the sample's tokens (``prompt + response``, length p + r).

    Prompt tokens are 0, response tokens 1. ``response_mask`` (length r) zeroes response tokens
    the policy did not generate, e.g. tool outputs in multi-turn rollouts. ``remove_sample``
    (a sample marked ``remove_sample``) zeroes the whole sample: it stays in the batch, so group
    sizes are kept, but contributes nothing to the loss.
    """
    if prompt_len < 0 or response_len < 0:
        raise ValueError(f"lengths must be >= 0, got prompt {prompt_len}, response {response_len}")
    if response_mask is not None:
        if len(response_mask) != response_len:
            raise ValueError(
                f"response_mask has {len(response_mask)} entries, response has {response_len} tokens"
            )
        response_part = [1 if int(m) else 0 for m in response_mask]
    else:
        response_part = [1] * response_len
    if remove_sample:
        response_part = [0] * response_len
    return [0] * prompt_len + response_part


def pack_samples(
    samples_token_lists: Sequence[Union[Sequence[int], int]], max_tokens_per_pack: int
) -> list[list[int]]:
    """Pack samples into micro-batches of at most ``max_tokens_per_pack`` tokens.

    Items are token lists (or plain lengths). Returns packs as lists of sample indices. First fit
    in input order: each sample goes to the first pack with room, so the result is deterministic
    and every index appears exactly once. A sample longer than the cap gets a pack of its own
    (it is never dropped; the trainer decides whether it fits in memory).
    """
    if max_tokens_per_pack < 1:
        raise ValueError(f"max_tokens_per_pack must be >= 1, got {max_tokens_per_pack}")
    packs: list[list[int]] = []
    used: list[int] = []
    for idx, item in enumerate(samples_token_lists):
        length = item if isinstance(item, int) else len(item)
        if length > max_tokens_per_pack:
            packs.append([idx])
            used.append(max_tokens_per_pack)  # full: nothing else joins an oversize pack
            continue
        for p, taken in enumerate(used):
            if taken + length <= max_tokens_per_pack:
                packs[p].append(idx)
                used[p] += length
                break
        else:
            packs.append([idx])
            used.append(length)
    return packs


# --- tensor path (training) -------------------------------------------------------------------


def normalize_group_rewards_tensor(
    rewards: torch.Tensor, n_samples_per_prompt: int, std_normalization: bool = True
) -> torch.Tensor:
    """Tensor version of :func:`normalize_group_rewards` (same numbers, tested to 1e-6).

    Computes in float64 and returns the input's floating dtype (float32 for integer input).
    """
    import torch  # lazy: the lab's base install has no torch

    n = n_samples_per_prompt
    flat = rewards.reshape(-1)
    _check_groups(flat.numel(), n)
    if flat.numel() == 0:
        return flat.to(torch.float32)
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    groups = flat.to(torch.float64).reshape(-1, n)
    if not torch.isfinite(groups).all():
        raise ValueError("rewards contain NaN or inf; fix the reward function")
    centred = groups - groups.mean(dim=1, keepdim=True)
    if std_normalization and n > 1:
        centred = centred / (groups.std(dim=1, unbiased=True, keepdim=True) + GRPO_EPS)
    all_equal = (groups == groups[:, :1]).all(dim=1, keepdim=True)
    centred = torch.where(all_equal, torch.zeros_like(centred), centred)
    return centred.reshape(rewards.shape).to(out_dtype)
