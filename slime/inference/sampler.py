"""Choosing each row's next token from its logits, on the device the logits live on.

Why our own sampler instead of `generate`: per-row sampling params and seeds, and log-probs of
exactly the sampled token at the sampling temperature, taken from the same logits the token was
drawn from (what SGLang returns as output_token_logprobs).

Log-prob convention: log_softmax(logits / temperature) over the full vocabulary, i.e. before
top-k / top-p truncation; the trainer can recompute exactly this quantity.

Randomness is counter-based: a row's draw at step t is a hash of (seed, t), so a row's tokens do
not depend on which other rows share its batch, and nothing is drawn from a stateful generator
on the device. The draw picks the token by inverse CDF (a float64 running sum over the kept
probabilities), which needs one uniform per row and no sort of the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class RowParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None


@dataclass
class RowResult:
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_type: str = "length"  # "stop" | "length" | "abort"
    matched: int | None = None
    kv: tuple | None = None  # prefill role: (the prompt's KV, its last logits); see kv_transfer.py


_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def row_uniforms(seeds: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """One uniform in [0, 1) per row from (seed, step): splitmix64's finaliser over a counter.
    Pure and vectorised; the same (seed, step) gives the same number on every machine."""
    with np.errstate(over="ignore"):
        z = seeds.astype(np.uint64) + (steps.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


@dataclass
class TruncationPlan:
    """Which rows need top-k / top-p, decided on the host from the rows' params (no device sync).
    rows: indices into the batch; k: the widest top-k among them (vocab size: a full sort)."""

    rows: list[int]
    k: int

    @staticmethod
    def of(top_k: np.ndarray, top_p: np.ndarray, vocab: int) -> TruncationPlan:
        k_on = (top_k > 0) & (top_k < vocab)
        need = np.flatnonzero(k_on | (top_p < 1.0))
        if need.size == 0:
            return TruncationPlan([], 0)
        # top-p without top-k on any such row needs every token ranked: sort those rows fully
        k = vocab if not k_on[need].all() else int(top_k[need].max())
        return TruncationPlan(need.tolist(), k)


def _kept(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, k: int) -> torch.Tensor:
    """Bool mask of the tokens each row keeps after its top-k, then its nucleus (top-p) over
    what top-k left; only the k best tokens are ranked (topk, not a full sort, when k < V)."""
    vocab = scaled.shape[-1]
    if k < vocab:
        vals, idx = torch.topk(scaled, k, dim=-1)
    else:
        vals, idx = torch.sort(scaled, dim=-1, descending=True)
    ranks = torch.arange(vals.shape[-1], device=scaled.device)
    k_row = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab)).unsqueeze(-1)
    drop = ranks >= k_row
    probs = torch.softmax(vals.masked_fill(drop, float("-inf")), dim=-1)
    before = probs.cumsum(-1) - probs  # mass strictly before this token
    drop |= before >= top_p.unsqueeze(-1)
    drop[:, 0] = False  # always keep the most likely token
    return torch.zeros_like(scaled, dtype=torch.bool).scatter_(-1, idx, ~drop)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host to device without a synchronisation: a copy from pageable memory waits for the
    device's queue, one from pinned memory does not."""
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def choose_tokens(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                  uniforms: torch.Tensor, plan: TruncationPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """Token and log-prob per row, all on logits' device; no host synchronisation.
    temperature/top_p/uniforms: float rows; top_k: long rows; plan: rows needing truncation."""
    scaled = logits.float() / temperature.unsqueeze(-1)
    lse = torch.logsumexp(scaled, dim=-1, keepdim=True)
    weights = torch.exp(scaled - lse)
    if plan.rows:
        rows = to_device(torch.tensor(plan.rows), logits.device)
        keep = _kept(scaled[rows], top_k[rows], top_p[rows], plan.k)
        weights[rows] = weights[rows] * keep
    cdf = torch.cumsum(weights, dim=-1, dtype=torch.float64)
    total = cdf[:, -1:]
    target = torch.minimum(uniforms.double().unsqueeze(-1) * total, torch.nextafter(total, torch.zeros_like(total)))
    tok = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=logits.shape[-1] - 1)
    # A token of zero weight can only come from rounding in a parallel scan: take the best kept one.
    tok = torch.where(weights.gather(1, tok.unsqueeze(-1)).squeeze(-1) > 0, tok, weights.argmax(-1))
    logprob = scaled.gather(1, tok.unsqueeze(-1)).squeeze(-1) - lse.squeeze(-1)
    return tok, logprob
