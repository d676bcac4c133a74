"""Advantages that need the trainer's log-probs: SC (``--use-sc``), KL in the reward
(``--kl-coef``) and ``--normalize-advantages``.

Sample-level advantages come from :mod:`slime.data.batch_builder` (group normalization, the
numbers the lab shows). Two things need token-level values that only the trainer can compute,
because they need the trainer's old and reference log-probs:

- ``--kl-coef`` puts ``-kl_coef * KL_t`` into the per-token reward, with ``KL_t`` the
  ``--kl-loss-type`` estimate of ``log pi_old - log pi_ref`` at token t, as the estimator's record
  says (``token_kl`` in slime/estimators.py):
  * ``return_to_go`` (``reinforce_plus_plus``): return-to-go ``G_t = sum_{t' >= t} r_t'`` (gamma = 1) where
    ``r_t' = -kl_coef * KL_t'`` on loss tokens (0 on loss-masked ones such as tool output) and
    the sample's reward is added at its last loss token;
  * ``per_token`` (``reinforce_plus_plus_baseline``): ``A_t = (r - group mean) - kl_coef * KL_t``.
  Group-relative estimators (``group_relative``: grpo, dr_grpo, gspo, cispo) take no KL in the reward: their
  baseline is the group, and ``validate()`` refuses ``--kl-coef`` with them (use
  ``--use-kl-loss``).
- ``--use-sc`` (score centering, docs/en/corrections.md#sc-score-centering-with-reinforce)
  replaces each sample's advantage by ``A_i = s_i - mean_group(s)`` with ``s_i = w_i r_i`` and
  ``w_i = min(exp(sum_t (log pi_old - log pi_rollout)), C)`` over the sample's loss tokens, the
  sequence ratio truncated at ``C = --tis-clip``; the loss is then plain REINFORCE
  (``slime.training.loss``, policy loss ``reinforce``). Group sums add over data-parallel ranks.
- ``--normalize-advantages`` whitens every loss token's advantage over the whole rollout (all
  data-parallel ranks): ``(a - mean) / sqrt(var + 1e-8)``, mean and unbiased variance taken over
  loss tokens.
- ``ppo`` (with a critic): :func:`ppo_targets` turns the sample's reward, the KL in the reward and
  the critic's values into GAE advantages and value targets (returns), per loss token. The Ray
  runtime calls it once per rollout over all records (it holds the critic's values and asks the
  trainer for the log-probs), so its whitening needs no cross-rank sums.

Plain Python over lists (no torch): both trainers call it with per-record log-prob lists, and
ranks combine their partial sums through ``reduce_sums``.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from slime import estimators
from slime.flags import KL_TYPES

WHITEN_EPS = 1e-8


def kl_value(d: float, kl_type: str) -> float:
    """One token's KL estimate from ``d = log pi - log ref`` (same as loss.kl_penalty)."""
    if kl_type == "k1":
        return d
    if kl_type == "k2":
        return 0.5 * d * d
    if kl_type == "k3":
        return math.exp(-d) - 1.0 + d
    if kl_type == "low_var_kl":
        d = min(max(d, -20.0), 20.0)
        return min(max(math.exp(-d) - 1.0 + d, -10.0), 10.0)
    raise ValueError(f"unknown kl type {kl_type!r}; known: {', '.join(KL_TYPES)}")


def sc_advantages(rewards: Sequence[float], groups: Sequence[int], num_groups: int,
                  masks: Sequence[Sequence[float]], olds: Sequence[Sequence[float]],
                  rollouts: Sequence[Sequence[float]], clip: float,
                  reduce_sums: Callable[[list[float]], list[float]] | None = None) -> list[float]:
    """SC advantages of this rank's samples (module docstring). ``groups[i]`` is sample i's group
    in the rollout (``0 <= g < num_groups``); ``reduce_sums`` adds the per-group sums of ``s`` and
    the counts over data-parallel ranks, so a group split over ranks gets one mean.

    Derivation: for y ~ pi_rollout, ``E[w(y) r(y) grad log pi(y)] = E_pi[r grad log pi]``, the
    on-policy gradient; subtracting the group mean of s is a baseline. Assumptions: (1) the
    baseline is unbiased only when pi_old ~ pi_rollout (it is not importance-weighted itself);
    (2) the group mean includes y_i, which shrinks each advantage by (n-1)/n, like GRPO; (3) the
    truncation at C trades a downward bias on over-represented samples for bounded variance; a
    sequence ratio is a product of token ratios, so keep C small.
    """
    if clip <= 0:
        raise ValueError(f"--use-sc truncates the sequence ratio at --tis-clip {clip}, which must be > 0")
    log_clip = math.log(clip)
    scores = []
    for reward, mask, old, rollout in zip(rewards, masks, olds, rollouts):
        log_ratio = math.fsum(o - r for o, r, m in zip(old, rollout, mask) if m)
        scores.append(math.exp(min(log_ratio, log_clip)) * float(reward))  # min(exp(x), C) without overflow
    sums = [0.0] * (2 * num_groups)  # [sum of s per group..., count per group...]
    for g, s in zip(groups, scores):
        sums[g] += s
        sums[num_groups + g] += 1.0
    if reduce_sums is not None:
        sums = reduce_sums(sums)
    return [s - sums[g] / sums[num_groups + g] for g, s in zip(groups, scores)]


def needs_token_advantages(estimator: str, kl_coef: float, normalize_advantages: bool) -> bool:
    return normalize_advantages or (kl_coef != 0.0 and estimators.get(estimator).token_kl is not None)


def kl_shaped(advantage: float, mask: Sequence[float], old: Sequence[float] | None, ref: Sequence[float] | None,
              estimator: str, kl_coef: float, kl_type: str) -> list[float]:
    """One sample's per-token advantages before whitening (module docstring)."""
    n = len(mask)
    form = estimators.get(estimator).token_kl
    if kl_coef == 0.0 or form is None:
        return [float(advantage)] * n
    if old is None or ref is None:
        raise ValueError("--kl-coef needs the trainer's old and reference log-probs (--ref-load)")
    kl = [kl_value(o - r, kl_type) for o, r in zip(old, ref)]
    if form == "per_token":
        return [float(advantage) - kl_coef * k for k in kl]
    # Loss-masked tokens (tool output, observations) are not the policy's actions: no KL in
    # their reward, as in THUDM/slime's get_reinforce_plus_plus_returns and ppo_token_rewards.
    rewards = [-kl_coef * k if m else 0.0 for k, m in zip(kl, mask)]
    last = max((i for i, m in enumerate(mask) if m), default=None)
    if last is not None:  # the sequence reward arrives with the last token the policy generated
        rewards[last] += float(advantage)
    out, running = [0.0] * n, 0.0
    for t in range(n - 1, -1, -1):
        running += rewards[t]
        out[t] = running
    return out


def whiten_stats(advantages: Sequence[Sequence[float]], masks: Sequence[Sequence[float]]) -> list[float]:
    """Partial sums ``[sum, sum of squares, count]`` over loss tokens (add them over ranks)."""
    s = sq = c = 0.0
    for adv, mask in zip(advantages, masks):
        for a, m in zip(adv, mask):
            if m:
                s += a
                sq += a * a
                c += 1.0
    return [s, sq, c]


def whiten(advantages: list[list[float]], stats: Sequence[float]) -> list[list[float]]:
    s, sq, c = stats
    if c == 0:
        raise ValueError("--normalize-advantages: the rollout has no loss tokens to whiten over")
    mean = s / c
    var = max(sq / c - mean * mean, 0.0)
    if c >= 2:
        var *= c / (c - 1)  # unbiased
    scale = 1.0 / math.sqrt(var + WHITEN_EPS)
    return [[(a - mean) * scale for a in adv] for adv in advantages]


def token_advantages(advantages: Sequence[float], masks: Sequence[Sequence[float]],
                     olds: Sequence[Sequence[float]] | None, refs: Sequence[Sequence[float]] | None,
                     estimator: str, kl_coef: float, kl_type: str, normalize: bool,
                     reduce_sums: Callable[[list[float]], list[float]] | None = None) -> list[list[float]]:
    """Per-token advantages of this rank's records; ``reduce_sums`` adds the whitening sums over
    data-parallel ranks (identity on one rank), so every rank whitens with the rollout's stats."""
    shaped = [kl_shaped(a, m, olds[i] if olds is not None else None, refs[i] if refs is not None else None,
                        estimator, kl_coef, kl_type) for i, (a, m) in enumerate(zip(advantages, masks))]
    if not normalize:
        return shaped
    stats = whiten_stats(shaped, masks)
    if reduce_sums is not None:
        stats = reduce_sums(stats)
    return whiten(shaped, stats)


# --- PPO with a critic: token rewards, GAE, returns ---------------------------------------------


def ppo_token_rewards(reward: float, mask: Sequence[float], old: Sequence[float] | None,
                      ref: Sequence[float] | None, kl_coef: float, kl_type: str) -> list[float]:
    """One sample's per-token rewards: ``-kl_coef * KL_t`` on every loss token, and the sample's
    reward added at its last loss token (the sequence is scored once it is finished).

    Tokens outside the loss mask (prompt, tool output) are not actions of the policy: they get no
    reward and no KL. A sample without loss tokens has no rewards at all.
    """
    n = len(mask)
    rewards = [0.0] * n
    if kl_coef != 0.0:
        if old is None or ref is None:
            raise ValueError("--kl-coef needs the trainer's old and reference log-probs (--ref-load)")
        for t in range(n):
            if mask[t]:
                rewards[t] = -kl_coef * kl_value(old[t] - ref[t], kl_type)
    last = max((i for i, m in enumerate(mask) if m), default=None)
    if last is not None:
        rewards[last] += float(reward)
    return rewards


def gae(rewards: Sequence[float], values: Sequence[float], mask: Sequence[float], gamma: float,
        lambd: float) -> tuple[list[float], list[float]]:
    """Generalized advantage estimation over one sample's loss tokens; returns (advantages, returns).

    Walking the loss tokens backwards, with ``V_next = 0`` after the last one (the episode ends):
    ``delta_t = r_t + gamma * V_next - V_t``; ``A_t = delta_t + gamma * lambd * A_next``;
    ``R_t = A_t + V_t`` (the critic's target). Tokens outside the mask are skipped, so a tool
    output between two generated spans does not count as a step; they get 0 in both lists.
    """
    n = len(mask)
    if len(rewards) != n or len(values) != n:
        raise ValueError(f"gae: {len(rewards)} rewards and {len(values)} values for {n} tokens")
    adv, ret = [0.0] * n, [0.0] * n
    running, next_value = 0.0, 0.0
    for t in range(n - 1, -1, -1):
        if not mask[t]:
            continue
        delta = rewards[t] + gamma * next_value - values[t]
        running = delta + gamma * lambd * running
        adv[t], ret[t] = running, running + values[t]
        next_value = values[t]
    return adv, ret


def ppo_targets(rewards: Sequence[float], masks: Sequence[Sequence[float]], values: Sequence[Sequence[float]],
                olds: Sequence[Sequence[float]] | None, refs: Sequence[Sequence[float]] | None,
                kl_coef: float, kl_type: str, gamma: float, lambd: float, normalize: bool,
                reduce_sums: Callable[[list[float]], list[float]] | None = None
                ) -> tuple[list[list[float]], list[list[float]]]:
    """Per-token (advantages, returns) of records for ``--advantage-estimator ppo``.

    ``rewards`` are the samples' rewards (batch_builder's ppo estimator passes them through raw),
    ``values`` the critic's per-token values before this rollout's update. ``--normalize-advantages``
    whitens the advantages over the rollout (as for every estimator); the returns, the critic's
    targets, are never whitened.
    """
    advantages, returns = [], []
    for i, (reward, mask) in enumerate(zip(rewards, masks)):
        token_rewards = ppo_token_rewards(reward, mask, olds[i] if olds is not None else None,
                                          refs[i] if refs is not None else None, kl_coef, kl_type)
        a, r = gae(token_rewards, values[i], mask, gamma, lambd)
        advantages.append(a)
        returns.append(r)
    if normalize:
        stats = whiten_stats(advantages, masks)
        if reduce_sums is not None:
            stats = reduce_sums(stats)
        advantages = whiten(advantages, stats)
    return advantages, returns
