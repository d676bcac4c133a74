"""Batched sampling with a KV cache for a Hugging Face causal LM (the embedded engine's core).

Why our own loop instead of `generate`: per-row sampling params and seeds, abort between steps,
and log-probs of exactly the sampled token at the sampling temperature, taken from the same
logits the token was drawn from (what SGLang returns as output_token_logprobs).

Log-prob convention: log_softmax(logits / temperature) over the full vocabulary, i.e. before
top-k / top-p truncation; the trainer can recompute exactly this quantity.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

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


def _filter_logits(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask logits outside each row's top-k / nucleus (top-p); rows with k<=0 and p=1 untouched."""
    sorted_logits, idx = torch.sort(logits, dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device).expand_as(sorted_logits)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, logits.shape[-1])).unsqueeze(-1)
    drop = ranks >= k
    probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    before = probs.cumsum(-1) - probs  # mass strictly before this token
    drop |= before >= top_p.unsqueeze(-1)
    drop[:, 0] = False  # always keep the most likely token
    mask = torch.zeros_like(drop).scatter(-1, idx, drop)
    return logits.masked_fill(mask, float("-inf"))


def _cache_kwarg(model: torch.nn.Module) -> str:
    """transformers 5.x renames `past_key_values` to `cache`; accept both generations."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.no_grad()
def sample(
    model: torch.nn.Module,
    prompts: list[list[int]],
    params: list[RowParams],
    pad_id: int,
    eos_ids: tuple[int, ...],
    generator: torch.Generator,
    should_abort: Callable[[int], bool] = lambda row: False,
) -> list[RowResult]:
    device = next(model.parameters()).device
    b = len(prompts)
    width = max(len(p) for p in prompts)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    for i, p in enumerate(prompts):  # left padding: every row's next token is at column -1
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    ids, mask = ids.to(device), mask.to(device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    temps = torch.tensor([p.temperature for p in params], device=device).unsqueeze(-1)
    top_k = torch.tensor([p.top_k for p in params], device=device)
    top_p = torch.tensor([p.top_p for p in params], device=device)
    gens = [torch.Generator(device="cpu").manual_seed(p.seed) if p.seed is not None else generator
            for p in params]
    stops = [set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_ids)) for p in params]
    results = [RowResult() for _ in range(b)]
    done = [p.max_new_tokens <= 0 for p in params]
    past = None
    step_ids, step_pos = ids, pos
    for _ in range(max((p.max_new_tokens for p in params), default=0)):
        for i in range(b):
            if not done[i] and should_abort(i):
                results[i].finish_type, done[i] = "abort", True
        if all(done):
            break
        out = model(input_ids=step_ids, attention_mask=mask, position_ids=step_pos,
                    use_cache=True, **{_cache_kwarg(model): past})
        past = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        logits = out.logits[:, -1, :].float() / temps
        logprobs = torch.log_softmax(logits, dim=-1)
        probs = torch.softmax(_filter_logits(logits, top_k, top_p), dim=-1).cpu()
        nxt = torch.full((b,), pad_id, dtype=torch.long)
        for i in range(b):
            if done[i]:
                continue
            tok = int(torch.multinomial(probs[i], 1, generator=gens[i]))
            nxt[i] = tok
            r = results[i]
            r.output_ids.append(tok)
            r.logprobs.append(float(logprobs[i, tok]))
            if tok in stops[i]:
                r.finish_type, r.matched, done[i] = "stop", tok, True
            elif len(r.output_ids) >= params[i].max_new_tokens:
                r.finish_type, done[i] = "length", True
        step_ids = nxt.to(device).unsqueeze(-1)
        step_pos = step_pos[:, -1:] + 1
        mask = torch.cat([mask, torch.ones((b, 1), dtype=mask.dtype, device=device)], dim=-1)
    return results
