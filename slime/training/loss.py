"""The policy loss, shared by every trainer backend (embedded torch and Megatron).

Layout: padded ``[B, T]`` tensors with a float ``loss_mask`` (1 on response tokens the policy
generated, 0 on prompt, padding, tool output and removed samples). Position ``t`` holds the
log-prob of token ``t`` given tokens ``< t``: the caller shifts logits and tokens before
:func:`gather_log_probs`. Per-sample quantities (advantages) may be ``[B]`` and are broadcast.

Aggregation (``agg``):

- ``sample_mean`` (default): token mean within each sample, then mean over samples that have
  at least one loss token. Every sample weighs the same whatever its length.
- ``token_mean``: mean over all loss tokens of the batch; long responses weigh more.

Only ``log_probs`` (and the entropy, when given) carry gradients: old, reference and rollout
log-probs and advantages are detached here, whatever the caller passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Aggregation = Literal["sample_mean", "token_mean"]
KL_TYPES = ("k1", "k2", "k3", "low_var_kl")


def gather_log_probs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-prob of each token: ``log_softmax(logits / temperature)[tokens]`` in float32.

    ``logits`` ``[..., V]`` and ``tokens`` ``[...]``. Dividing by the rollout temperature is
    what makes these log-probs comparable with the engine's: without it every ratio is off.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    scaled = logits.float() / temperature
    picked = scaled.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(scaled, dim=-1)


def entropy_from_logits(
    logits: torch.Tensor, temperature: float = 1.0, chunk_size: int | None = None
) -> torch.Tensor:
    """Entropy of ``softmax(logits / temperature)`` per position, ``[..., V] -> [...]``.

    ``H = logsumexp(z) - sum softmax(z) * z``. With ``chunk_size``, rows are processed that many
    at a time so the float32 copy of a huge-vocabulary logits tensor never exists at once.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    step = chunk_size or flat.shape[0] or 1
    parts = []
    for start in range(0, flat.shape[0], step):
        z = flat[start : start + step].float() / temperature
        probs = torch.softmax(z, dim=-1)
        parts.append(torch.logsumexp(z, dim=-1) - (probs * z).sum(dim=-1))
    out = torch.cat(parts) if parts else flat.new_zeros(0, dtype=torch.float32)
    return out.reshape(logits.shape[:-1])


def aggregate(values: torch.Tensor, loss_mask: torch.Tensor, agg: Aggregation = "sample_mean") -> torch.Tensor:
    """Reduce per-token ``values`` ``[B, T]`` to a scalar under ``loss_mask`` (module docstring)."""
    mask = loss_mask.to(values.dtype)
    if agg == "token_mean":
        return (values * mask).sum() / mask.sum().clamp(min=1.0)
    if agg == "sample_mean":
        tokens_per_sample = mask.sum(dim=-1)
        per_sample = (values * mask).sum(dim=-1) / tokens_per_sample.clamp(min=1.0)
        has_tokens = (tokens_per_sample > 0).to(values.dtype)
        return (per_sample * has_tokens).sum() / has_tokens.sum().clamp(min=1.0)
    raise ValueError(f"unknown aggregation {agg!r}; known: sample_mean, token_mean")


def _masked_mean(values: torch.Tensor, loss_mask: torch.Tensor) -> float:
    mask = loss_mask.to(values.dtype)
    return float(((values * mask).sum() / mask.sum().clamp(min=1.0)).item())


def _per_token(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return x.unsqueeze(-1).expand_as(like) if x.dim() == like.dim() - 1 else x


def policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    eps_clip: float = 0.2,
    eps_clip_high: float | None = None,
    eps_clip_c: float | None = None,
    token_weights: torch.Tensor | None = None,
    agg: Aggregation = "sample_mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip loss with asymmetric clip ``[1 - eps_clip, 1 + eps_clip_high]`` and dual clip.

    Per token: ``max(-A r, -A clip(r))``; with ``eps_clip_c`` (> 1), negative-advantage tokens
    are further bounded by ``-A c`` so a huge ratio cannot blow the loss up. ``token_weights``
    (TIS / IcePop, detached) multiply the per-token loss before aggregation.
    Metrics: ``pg_clipfrac`` (share of tokens whose clipped term was taken), ``ppo_kl``
    (mean ``old - new``), ``ratio_mean/min/max`` over loss tokens.
    """
    high = eps_clip if eps_clip_high is None else eps_clip_high
    adv = _per_token(advantages.detach().to(log_probs.dtype), log_probs)
    log_ratio = log_probs - old_log_probs.detach()
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - eps_clip, 1.0 + high)
    losses = torch.maximum(unclipped, clipped)
    clip_taken = (clipped > unclipped).to(log_probs.dtype)
    if eps_clip_c is not None:
        if eps_clip_c <= 1.0:
            raise ValueError(f"eps_clip_c (dual clip) must be > 1, got {eps_clip_c}")
        dual = torch.minimum(losses, -adv * eps_clip_c)
        losses = torch.where(adv < 0, dual, losses)
    if token_weights is not None:
        losses = losses * token_weights.detach()
    loss = aggregate(losses, loss_mask, agg)
    mask = loss_mask > 0
    with torch.no_grad():
        ratios = ratio[mask] if mask.any() else ratio.new_ones(1)
        metrics = {
            "pg_clipfrac": _masked_mean(clip_taken, loss_mask),
            "ppo_kl": _masked_mean(-log_ratio.detach(), loss_mask),
            "ratio_mean": float(ratios.mean().item()),
            "ratio_min": float(ratios.min().item()),
            "ratio_max": float(ratios.max().item()),
        }
    return loss, metrics


def kl_penalty(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kl_type: str) -> torch.Tensor:
    """Per-token KL(pi || ref) estimate from samples of pi.

    With ``d = log pi - log ref``: ``k1 = d``; ``k2 = d^2 / 2``; ``k3 = exp(-d) - 1 + d``
    (unbiased, non-negative); ``low_var_kl`` = k3 with ``d`` clamped to [-20, 20] and the result
    clamped to [-10, 10], as in verl, so one outlier token cannot dominate.
    """
    d = log_probs - ref_log_probs.detach()
    if kl_type == "k1":
        return d
    if kl_type == "k2":
        return 0.5 * d.square()
    if kl_type == "k3":
        return torch.exp(-d) - 1.0 + d
    if kl_type == "low_var_kl":
        d = d.clamp(-20.0, 20.0)
        return (torch.exp(-d) - 1.0 + d).clamp(-10.0, 10.0)
    raise ValueError(f"unknown kl type {kl_type!r}; known: {', '.join(KL_TYPES)}")


def tis_weights(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    loss_mask: torch.Tensor,
    tis_clip: float = 2.0,
    tis_clip_low: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance sampling: ``clamp(exp(old - rollout), tis_clip_low, tis_clip)``.

    Corrects for the engine sampling from a slightly different distribution than the trainer
    computes. Detached. Metric ``tis_clipfrac``: share of loss tokens outside the bounds.
    """
    with torch.no_grad():
        w = torch.exp(old_log_probs.detach() - rollout_log_probs.detach())
        outside = ((w > tis_clip) | (w < tis_clip_low)).to(w.dtype)
        return w.clamp(min=tis_clip_low, max=tis_clip), {"tis_clipfrac": _masked_mean(outside, loss_mask)}


def icepop_weights(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    loss_mask: torch.Tensor,
    low: float = 0.5,
    high: float = 2.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """IcePop: the IS ratio where it lies in ``[low, high]``, 0 elsewhere (masked, not clipped).

    Masked tokens stay in the aggregation's denominator (their weight is 0), so a sample's scale
    does not jump when a few of its tokens are dropped. Metric ``icepop_mask_frac``.
    """
    with torch.no_grad():
        ratio = torch.exp(old_log_probs.detach() - rollout_log_probs.detach())
        keep = (ratio >= low) & (ratio <= high)
        return torch.where(keep, ratio, torch.zeros_like(ratio)), {
            "icepop_mask_frac": _masked_mean((~keep).to(ratio.dtype), loss_mask)
        }


def sc_advantages(rewards: torch.Tensor, seq_log_ratio: torch.Tensor, n: int, clip: float) -> torch.Tensor:
    """Score-centering advantages (glossary.md): ``A_i = s_i - mean_group(s)``, ``s_i = w_i r_i``.

    ``w_i = min(exp(seq_log_ratio_i), clip)`` with ``seq_log_ratio_i = sum_t (log pi_train -
    log pi_rollout)`` over sample i's response (detached). Samples of one prompt are n
    consecutive entries.

    Derivation: for y ~ pi_rollout, ``E[w(y) r(y) grad log pi(y)] = E_{pi}[r grad log pi]``, the
    on-policy gradient. Subtracting the group mean of s is a baseline. Assumptions: (1) the
    baseline is unbiased only when pi_train ~ pi_rollout, since ``E_rollout[grad log pi]`` is
    0 only then (the baseline is not importance-weighted); (2) the group mean includes y_i
    itself, which shrinks each advantage by (n-1)/n (an O(1/n) bias, like GRPO's); (3)
    truncating w at ``clip`` trades a downward bias on over-represented samples for bounded
    variance; a sequence-level ratio is a product of token ratios, so keep ``clip`` small.
    """
    if rewards.numel() % n != 0:
        raise ValueError(f"{rewards.numel()} rewards is not a multiple of n={n}")
    w = torch.exp(seq_log_ratio.detach().float()).clamp(max=clip)
    s = (w * rewards.detach().float()).reshape(-1, n)
    return (s - s.mean(dim=1, keepdim=True)).reshape(rewards.shape)


def reinforce_loss(
    log_probs: torch.Tensor, advantages: torch.Tensor, loss_mask: torch.Tensor, agg: Aggregation = "sample_mean"
) -> torch.Tensor:
    """Plain REINFORCE, ``-A_i * log pi(y_i)``, no ratio and no clipping (used with SC).

    With ``sample_mean`` this is ``-A_i`` times the token mean of ``log pi`` over sample i: the
    length normalization every other loss here uses, applied to ``sum_t log pi(y_i,t)``.
    """
    adv = _per_token(advantages.detach().to(log_probs.dtype), log_probs)
    return aggregate(-adv * log_probs, loss_mask, agg)


@dataclass(frozen=True)
class LossConfig:
    """The loss settings, by runtime flag."""

    eps_clip: float = 0.2  # --eps-clip: lower clip, ratio >= 1 - eps_clip
    eps_clip_high: float | None = None  # --eps-clip-high: upper clip (None: = eps_clip)
    eps_clip_c: float | None = None  # --eps-clip-c: dual-clip bound for negative advantages
    kl_loss_coef: float = 0.0  # --kl-loss-coef: weight of the KL term (needs ref log-probs)
    kl_loss_type: str = "low_var_kl"  # --kl-loss-type: k1, k2, k3 or low_var_kl
    entropy_coef: float = 0.0  # --entropy-coef: bonus, subtracted from the loss
    tis_mode: Literal["none", "tis", "icepop"] = "none"  # --use-tis (icepop masks instead)
    tis_clip: float = 2.0  # --tis-clip: TIS upper cap; IcePop upper bound
    tis_clip_low: float = 0.0  # --tis-clip-low: TIS lower clamp; IcePop lower bound
    agg: Aggregation = "sample_mean"  # aggregation over tokens and samples
    policy_loss: Literal["ppo", "reinforce"] = "ppo"  # reinforce: SC's unclipped REINFORCE


def compute_total_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: LossConfig,
    ref_log_probs: torch.Tensor | None = None,
    rollout_log_probs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``pg + kl_loss_coef * kl - entropy_coef * entropy``, and ``train/*`` metrics.

    Metrics always: ``train/pg_loss``, ``train/pg_clipfrac``, ``train/ppo_kl``; with
    ``ref_log_probs``: ``train/kl_loss``; with ``entropy``: ``train/entropy``; with
    ``rollout_log_probs``: ``train/train_rollout_logp_abs_diff``, ``train/train_rollout_kl``
    and, by ``tis_mode``, ``train/tis_clipfrac`` or ``train/icepop_mask_frac``.
    """
    metrics: dict[str, float] = {}
    weights = None
    if rollout_log_probs is not None:
        with torch.no_grad():
            d = rollout_log_probs.detach() - old_log_probs.detach()  # log(rollout / train)
            metrics["train/train_rollout_logp_abs_diff"] = _masked_mean(d.abs(), loss_mask)
            metrics["train/train_rollout_kl"] = _masked_mean(torch.exp(-d) - 1.0 + d, loss_mask)
        if config.tis_mode == "tis":
            weights, m = tis_weights(old_log_probs, rollout_log_probs, loss_mask, config.tis_clip, config.tis_clip_low)
            metrics["train/tis_clipfrac"] = m["tis_clipfrac"]
        elif config.tis_mode == "icepop":
            weights, m = icepop_weights(old_log_probs, rollout_log_probs, loss_mask, config.tis_clip_low, config.tis_clip)
            metrics["train/icepop_mask_frac"] = m["icepop_mask_frac"]
    elif config.tis_mode != "none":
        raise ValueError(f"tis_mode={config.tis_mode!r} needs rollout_log_probs")

    if config.policy_loss == "reinforce":
        pg = reinforce_loss(log_probs, advantages, loss_mask, config.agg)
        metrics.update({"train/pg_clipfrac": 0.0, "train/ppo_kl": _masked_mean(old_log_probs.detach() - log_probs.detach(), loss_mask)})
    else:
        pg, m = policy_loss(log_probs, old_log_probs, advantages, loss_mask, config.eps_clip,
                            config.eps_clip_high, config.eps_clip_c, weights, config.agg)
        metrics.update({"train/pg_clipfrac": m["pg_clipfrac"], "train/ppo_kl": m["ppo_kl"]})
    metrics["train/pg_loss"] = float(pg.detach().item())
    total = pg

    if config.kl_loss_coef != 0.0 and ref_log_probs is None:
        raise ValueError("kl_loss_coef is set but ref_log_probs is missing (needs --ref-load)")
    if ref_log_probs is not None:
        kl = aggregate(kl_penalty(log_probs, ref_log_probs, config.kl_loss_type), loss_mask, config.agg)
        metrics["train/kl_loss"] = float(kl.detach().item())
        if config.kl_loss_coef != 0.0:
            total = total + config.kl_loss_coef * kl

    if config.entropy_coef != 0.0 and entropy is None:
        raise ValueError("entropy_coef is set but no entropy was given (use entropy_from_logits)")
    if entropy is not None:
        ent = aggregate(entropy, loss_mask, config.agg)
        metrics["train/entropy"] = float(ent.detach().item())
        if config.entropy_coef != 0.0:
            total = total - config.entropy_coef * ent
    return total, metrics


def loss_config_from_runtime(loss) -> LossConfig:
    """The runtime's loss flags (``slime.config.LossConfig``) -> this module's ``LossConfig``.

    One translation for every trainer backend: ``--use-kl-loss`` gates the KL coefficient,
    ``--use-icepop`` takes the IcePop bounds, ``--use-tis`` the TIS clamp.
    """
    tis_mode = "tis" if loss.use_tis else "icepop" if loss.use_icepop else "none"
    low, high = ((loss.icepop_low, loss.icepop_high) if loss.use_icepop else (loss.tis_clip_low, loss.tis_clip))
    return LossConfig(eps_clip=loss.eps_clip, eps_clip_high=loss.eps_clip_high, eps_clip_c=loss.eps_clip_c,
                      kl_loss_coef=loss.kl_loss_coef if loss.use_kl_loss else 0.0,
                      kl_loss_type=loss.kl_loss_type, entropy_coef=loss.entropy_coef,
                      tis_mode=tis_mode, tis_clip=high, tis_clip_low=low)
