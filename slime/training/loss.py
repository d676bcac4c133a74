"""The policy loss, shared by every trainer backend (embedded torch and Megatron).

Layout: padded ``[B, T]`` tensors with a float ``loss_mask`` (1 on response tokens the policy
generated, 0 on prompt, padding, tool output and removed samples). Position ``t`` holds the
log-prob of token ``t`` given tokens ``< t``: the caller shifts logits and tokens before
:func:`gather_log_probs`. Per-sample quantities (advantages) may be ``[B]`` and are broadcast;
token-level advantages (REINFORCE++, KL in the reward) are ``[B, T]``.

Aggregation is defined over one optimizer step's whole batch (every micro-batch of every
data-parallel rank), never over a micro-batch, so the loss and its gradient do not depend on
micro-batching, packing or the number of ranks:

- ``sample_mean`` (default): each sample's token mean, summed over samples, divided by the number
  of samples in the step. Every sample weighs the same whatever its length.
- ``token_mean`` (``--calculate-per-token-loss``): the sum over all loss tokens of the step divided
  by the number of loss tokens of the step; long responses weigh more.
- ``constant_norm`` (Dr. GRPO): the sum over all loss tokens divided by ``samples x
  --rollout-max-response-len``, a constant that favours neither short nor long answers.

The trainer computes the step's denominator once with :func:`step_denominator` (plain Python over
the step's loss masks) and passes it to every micro-batch; each micro-batch returns its share of
the step's loss, and the shares add up.

A sample without loss tokens (removed by a filter, or every token masked as off-policy) has no
token mean; it contributes exactly zero and still counts in the ``sample_mean`` denominator. The
denominator is then the step's sample count, known before anything is computed and identical
on every rank, instead of a count of non-empty samples that would change every other sample's
weight whenever one sample is masked (and that the reference runtime does not use either).

Metrics (``train/*``) use the same aggregation and denominator, so they are per sample first,
then averaged, and they too add up over micro-batches and ranks.

Only ``log_probs`` (and the entropy, when given) carry gradients: old, reference and rollout
log-probs and advantages are detached here, whatever the caller passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import torch

from slime import estimators
from slime.flags import KL_TYPES, default_of

Aggregation = Literal["sample_mean", "token_mean", "constant_norm"]
AGGREGATIONS = ("sample_mean", "token_mean", "constant_norm")
POLICY_LOSSES = ("ppo", "gspo", "cispo", "reinforce")


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


def step_denominator(loss_masks: Sequence[Sequence[float]], agg: Aggregation = "sample_mean",
                     max_response_len: int | None = None) -> float:
    """The denominator of one optimizer step's loss, from the loss masks of ALL its samples
    (every micro-batch, every data-parallel rank). Plain Python: call it on the step's records.

    ``sample_mean``: the number of samples (empty ones included, see the module docstring);
    ``token_mean``: the number of loss tokens; ``constant_norm``: samples x ``max_response_len``.
    """
    if agg == "sample_mean":
        return float(max(len(loss_masks), 1))
    if agg == "token_mean":
        return float(max(sum(float(sum(m)) for m in loss_masks), 1.0))
    if agg == "constant_norm":
        if not max_response_len or max_response_len < 1:
            raise ValueError("constant_norm (Dr. GRPO) aggregation needs max_response_len >= 1")
        return float(max(len(loss_masks), 1) * max_response_len)
    raise ValueError(f"unknown aggregation {agg!r}; known: {', '.join(AGGREGATIONS)}")


def _token_weights(loss_mask: torch.Tensor, agg: Aggregation, dtype: torch.dtype) -> torch.Tensor:
    mask = loss_mask.to(dtype)
    if agg == "sample_mean":  # 1 / (the sample's loss tokens): each sample's token mean
        return mask / mask.sum(dim=-1, keepdim=True).clamp(min=1.0)
    if agg in ("token_mean", "constant_norm"):
        return mask
    raise ValueError(f"unknown aggregation {agg!r}; known: {', '.join(AGGREGATIONS)}")


def aggregate(values: torch.Tensor, loss_mask: torch.Tensor, agg: Aggregation = "sample_mean",
              denominator: float | None = None) -> torch.Tensor:
    """This batch's share of the step's aggregate of per-token ``values`` ``[B, T]``.

    ``denominator`` comes from :func:`step_denominator` over the whole step; without it the
    rows given here are the whole step (``B`` samples, their tokens, or ``B x T``).
    """
    weights = _token_weights(loss_mask, agg, values.dtype)
    if denominator is None:
        if agg == "sample_mean":
            denominator = float(max(loss_mask.shape[0], 1))
        elif agg == "token_mean":
            denominator = float(loss_mask.to(values.dtype).sum().clamp(min=1.0).item())
        else:
            denominator = float(max(loss_mask.numel(), 1))
    return (values * weights).sum() / denominator


def _masked_mean(values: torch.Tensor, loss_mask: torch.Tensor) -> float:
    mask = loss_mask.to(values.dtype)
    return float(((values * mask).sum() / mask.sum().clamp(min=1.0)).item())


def _per_token(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return x.unsqueeze(-1).expand_as(like) if x.dim() == like.dim() - 1 else x


def sequence_log_ratio(log_probs: torch.Tensor, old_log_probs: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """GSPO's per-sample ``log s_i = mean_t (log pi - log pi_old)`` over loss tokens, ``[B]``.

    ``s_i = (pi(y_i) / pi_old(y_i)) ** (1 / |y_i|)``, the length-normalized sequence ratio; the
    gradient flows through every token of the mean. A sample without loss tokens gets 0.
    """
    mask = loss_mask.to(log_probs.dtype)
    d = (log_probs - old_log_probs.detach()) * mask
    return d.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1.0)


def _clipped_surrogate(log_ratio: torch.Tensor, adv: torch.Tensor, eps_clip: float, high: float,
                       eps_clip_c: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per token ``max(-A r, -A clip(r))`` (and dual clip); returns (losses, clip taken, ratio)."""
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - eps_clip, 1.0 + high)
    losses = torch.maximum(unclipped, clipped)
    clip_taken = (clipped > unclipped).to(log_ratio.dtype)
    if eps_clip_c is not None:
        if eps_clip_c <= 1.0:
            raise ValueError(f"eps_clip_c (dual clip) must be > 1, got {eps_clip_c}")
        dual = torch.minimum(losses, -adv * eps_clip_c)
        losses = torch.where(adv < 0, dual, losses)
    return losses, clip_taken, ratio


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
    kind: str = "ppo",
    denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The policy-gradient term, by ``kind``; returns (loss, metrics).

    - ``ppo`` (GRPO, REINFORCE++...): per token ``max(-A r_t, -A clip(r_t, 1 - eps_clip,
      1 + eps_clip_high))`` with ``r_t = pi / pi_old`` of that token; with ``eps_clip_c`` (> 1)
      negative-advantage tokens are further bounded by ``-A c`` (dual clip).
    - ``gspo``: the same clipped surrogate with GSPO's sequence ratio ``s_i``
      (:func:`sequence_log_ratio`) in place of ``r_t``: one ratio, one clip decision per sample.
    - ``cispo``: ``-sg(clip(r_t, 1 - eps_clip, 1 + eps_clip_high)) A log pi_t``: the clipped
      ratio is a detached weight, so clipped tokens keep their gradient (MiniMax-M1).
    - ``reinforce``: ``-A log pi_t``, no ratio (score centering).

    ``token_weights`` (TIS / IcePop, detached) multiply the per-token loss before aggregation.
    Metrics (same aggregation): ``pg_clipfrac``, ``ppo_kl`` (``-log ratio``; GSPO: the
    sequence's), and ``ratio_mean/min/max`` over loss tokens (not additive: diagnostics).
    """
    high = eps_clip if eps_clip_high is None else eps_clip_high
    adv = _per_token(advantages.detach().to(log_probs.dtype), log_probs)
    old = old_log_probs.detach()
    if kind == "ppo":
        log_ratio = log_probs - old
        losses, clip_taken, ratio = _clipped_surrogate(log_ratio, adv, eps_clip, high, eps_clip_c)
    elif kind == "gspo":
        log_ratio = _per_token(sequence_log_ratio(log_probs, old, loss_mask), log_probs)
        losses, clip_taken, ratio = _clipped_surrogate(log_ratio, adv, eps_clip, high, eps_clip_c)
    elif kind == "cispo":
        log_ratio = log_probs - old
        ratio = torch.exp(log_ratio.detach())
        weight = ratio.clamp(1.0 - eps_clip, 1.0 + high)
        losses = -adv * weight * log_probs
        clip_taken = (weight != ratio).to(log_probs.dtype)
    elif kind == "reinforce":
        log_ratio = log_probs - old
        ratio = torch.exp(log_ratio.detach())
        losses = -adv * log_probs
        clip_taken = torch.zeros_like(log_probs)
    else:
        raise ValueError(f"unknown policy loss {kind!r}; known: {', '.join(POLICY_LOSSES)}")
    if token_weights is not None:
        losses = losses * token_weights.detach()
    loss = aggregate(losses, loss_mask, agg, denominator)
    mask = loss_mask > 0
    with torch.no_grad():
        ratios = ratio.detach()[mask] if mask.any() else ratio.new_ones(1)
        metrics = {
            "pg_clipfrac": float(aggregate(clip_taken, loss_mask, agg, denominator).item()),
            "ppo_kl": float(aggregate(-log_ratio.detach(), loss_mask, agg, denominator).item()),
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


def reinforce_loss(
    log_probs: torch.Tensor, advantages: torch.Tensor, loss_mask: torch.Tensor, agg: Aggregation = "sample_mean",
    denominator: float | None = None,
) -> torch.Tensor:
    """Plain REINFORCE, ``-A_i * log pi(y_i)``, no ratio and no clipping (``--use-sc`` trains with
    ``policy_loss(kind="reinforce")``, the same term; SC's advantages: slime.training.advantages).

    With ``sample_mean`` this is ``-A_i`` times the token mean of ``log pi`` over sample i: the
    length normalization every other loss here uses, applied to ``sum_t log pi(y_i,t)``.
    """
    adv = _per_token(advantages.detach().to(log_probs.dtype), log_probs)
    return aggregate(-adv * log_probs, loss_mask, agg, denominator)


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, loss_mask: torch.Tensor,
               value_clip: float | None = 0.2, agg: Aggregation = "sample_mean",
               denominator: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The critic's clipped value loss (PPO), aggregated like the policy loss; returns (loss, metrics).

    Per token ``0.5 * max((V - R)^2, (V_clip - R)^2)`` with ``V_clip = V_old + clip(V - V_old,
    -value_clip, value_clip)``: ``V_old`` are the values the advantages were computed with, ``R``
    the GAE returns. The clip keeps one rollout from moving a value further than ``value_clip``
    from where it started; ``value_clip=None`` is the plain squared error. Only ``values`` carries
    gradients. Metrics (same aggregation, additive): ``value_loss``, ``value_clipfrac`` (share of
    tokens where the clipped term is the larger one) and ``values`` (the mean prediction).
    """
    old = old_values.detach().to(values.dtype)
    ret = returns.detach().to(values.dtype)
    unclipped = (values - ret).square()
    if value_clip is None:
        losses, clip_taken = 0.5 * unclipped, torch.zeros_like(values)
    else:
        if value_clip <= 0:
            raise ValueError(f"value_clip must be > 0, got {value_clip}")
        clipped = (old + (values - old).clamp(-value_clip, value_clip) - ret).square()
        losses = 0.5 * torch.maximum(unclipped, clipped)
        clip_taken = (clipped > unclipped).to(values.dtype)
    loss = aggregate(losses, loss_mask, agg, denominator)
    with torch.no_grad():
        metrics = {"value_loss": float(loss.detach().item()),
                   "value_clipfrac": float(aggregate(clip_taken, loss_mask, agg, denominator).item()),
                   "values": float(aggregate(values.detach(), loss_mask, agg, denominator).item())}
    return loss, metrics


@dataclass(frozen=True)
class LossFnConfig:
    """The loss function's settings, by runtime flag (from_runtime translates slime.config.LossConfig)."""

    eps_clip: float = default_of("--eps-clip")  # --eps-clip: lower clip, ratio >= 1 - eps_clip
    eps_clip_high: float | None = default_of("--eps-clip-high")  # --eps-clip-high: upper clip (None: = eps_clip)
    eps_clip_c: float | None = default_of("--eps-clip-c")  # --eps-clip-c: dual-clip bound for negative advantages
    kl_loss_coef: float = default_of("--kl-loss-coef")  # --kl-loss-coef: weight of the KL term (needs ref log-probs)
    kl_loss_type: str = default_of("--kl-loss-type")  # --kl-loss-type: one of KL_TYPES
    entropy_coef: float = default_of("--entropy-coef")  # --entropy-coef: bonus, subtracted from the loss
    tis_mode: Literal["none", "tis", "icepop"] = "none"  # --use-tis (icepop masks instead)
    tis_clip: float = default_of("--tis-clip")  # --tis-clip: TIS upper cap; IcePop upper bound
    tis_clip_low: float = default_of("--tis-clip-low")  # --tis-clip-low: TIS lower clamp; IcePop lower bound
    agg: Aggregation = "sample_mean"  # --calculate-per-token-loss: token_mean; dr_grpo: constant_norm
    policy_loss: Literal["ppo", "gspo", "cispo", "reinforce"] = "ppo"  # by --advantage-estimator
    max_response_len: int | None = None  # constant_norm's length constant (--rollout-max-response-len)


def from_runtime(loss, max_response_len: int | None = None) -> LossFnConfig:
    """The runtime's ``slime.config.LossConfig`` (parsed flags) -> this module's config.

    One rule for every trainer backend: the estimator's record (slime/estimators.py) -> policy loss
    (``--use-sc``: plain REINFORCE) and aggregation; TIS / IcePop.
    """
    tis_mode: Literal["none", "tis", "icepop"] = "tis" if loss.use_tis else "icepop" if loss.use_icepop else "none"
    low, high = ((loss.icepop_low, loss.icepop_high) if loss.use_icepop else (loss.tis_clip_low, loss.tis_clip))
    est = estimators.of(loss)
    agg: Aggregation = "constant_norm" if est.aggregation == "constant_norm" else \
        "token_mean" if getattr(loss, "calculate_per_token_loss", False) else "sample_mean"
    if agg == "constant_norm" and not max_response_len:
        max_response_len = getattr(loss, "max_response_len", None)
    return LossFnConfig(eps_clip=loss.eps_clip, eps_clip_high=loss.eps_clip_high, eps_clip_c=loss.eps_clip_c,
                      kl_loss_coef=loss.kl_loss_coef if loss.use_kl_loss else 0.0,
                      kl_loss_type=loss.kl_loss_type, entropy_coef=loss.entropy_coef,
                      tis_mode=tis_mode, tis_clip=high, tis_clip_low=low, agg=agg,
                      policy_loss="reinforce" if getattr(loss, "use_sc", False)
                      else est.policy_loss,
                      max_response_len=max_response_len if agg == "constant_norm" else None)


def compute_total_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: LossFnConfig,
    ref_log_probs: torch.Tensor | None = None,
    rollout_log_probs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``pg + kl_loss_coef * kl - entropy_coef * entropy`` (this batch's share of the step, see
    the module docstring), and ``train/*`` metrics aggregated the same way (additive).

    Metrics always: ``train/loss``, ``train/pg_loss``, ``train/pg_clipfrac``, ``train/ppo_kl``;
    with ``ref_log_probs``: ``train/kl_loss``; with ``entropy``: ``train/entropy``; with
    ``rollout_log_probs``: ``train/train_rollout_logp_abs_diff``, ``train/train_rollout_kl`` and,
    by ``tis_mode``, ``train/tis_clipfrac`` or ``train/icepop_mask_frac``.
    """
    agg = config.agg
    if denominator is None and agg == "constant_norm":
        denominator = step_denominator([[0]] * loss_mask.shape[0], agg, config.max_response_len)

    def agg_metric(x: torch.Tensor) -> float:
        return float(aggregate(x.detach().float(), loss_mask, agg, denominator).item())

    metrics: dict[str, float] = {}
    weights = None
    if rollout_log_probs is not None:
        with torch.no_grad():
            d = rollout_log_probs.detach() - old_log_probs.detach()  # log(rollout / train)
            metrics["train/train_rollout_logp_abs_diff"] = agg_metric(d.abs())
            metrics["train/train_rollout_kl"] = agg_metric(torch.exp(-d) - 1.0 + d)
            is_ratio = torch.exp(-d)
        if config.tis_mode == "tis":
            weights, _ = tis_weights(old_log_probs, rollout_log_probs, loss_mask, config.tis_clip, config.tis_clip_low)
            metrics["train/tis_clipfrac"] = agg_metric((weights != is_ratio).float())
        elif config.tis_mode == "icepop":
            weights, _ = icepop_weights(old_log_probs, rollout_log_probs, loss_mask, config.tis_clip_low, config.tis_clip)
            metrics["train/icepop_mask_frac"] = agg_metric((weights != is_ratio).float())
    elif config.tis_mode != "none":
        raise ValueError(f"tis_mode={config.tis_mode!r} needs rollout_log_probs")

    pg, m = policy_loss(log_probs, old_log_probs, advantages, loss_mask, config.eps_clip, config.eps_clip_high,
                        config.eps_clip_c, weights, agg, config.policy_loss, denominator)
    metrics.update({"train/pg_clipfrac": m["pg_clipfrac"], "train/ppo_kl": m["ppo_kl"]})
    metrics["train/pg_loss"] = float(pg.detach().item())
    total = pg

    if config.kl_loss_coef != 0.0 and ref_log_probs is None:
        raise ValueError("kl_loss_coef is set but ref_log_probs is missing (needs --ref-load)")
    if ref_log_probs is not None:
        kl_values = kl_penalty(log_probs if config.kl_loss_coef != 0.0 else log_probs.detach(), ref_log_probs,
                               config.kl_loss_type)
        kl = aggregate(kl_values, loss_mask, agg, denominator)
        metrics["train/kl_loss"] = float(kl.detach().item())
        if config.kl_loss_coef != 0.0:
            total = total + config.kl_loss_coef * kl

    if config.entropy_coef != 0.0 and entropy is None:
        raise ValueError("entropy_coef is set but no entropy was given (use entropy_from_logits)")
    if entropy is not None:
        ent = aggregate(entropy, loss_mask, agg, denominator)
        metrics["train/entropy"] = float(ent.detach().item())
        if config.entropy_coef != 0.0:
            total = total - config.entropy_coef * ent
    metrics["train/loss"] = float(total.detach().item())
    return total, metrics

