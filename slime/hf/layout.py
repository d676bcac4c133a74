"""Checkpoint tensor names -> the embedded engine's model tensors.

The engine runs transformers' own model class for a checkpoint, but transformers (v5) does not
keep the checkpoint's layout in memory: it fuses a MoE layer's per-expert matrices
(``mlp.experts.{e}.gate_proj/up_proj/down_proj.weight``) into ``mlp.experts.gate_up_proj`` /
``mlp.experts.down_proj``, serves Qwen3.5's composite checkpoint (``model.language_model.*``) with
its text-only class (``model.*``), and leaves out what it does not build (the MTP layer, the
vision tower). Weight sync sends the checkpoint's names (the Megatron exporter writes exactly the
published layout), so the engine must place each of those tensors itself, one bucket at a time:
a bucket may hold only some of a layer's experts, hence copies into slices of the fused tensor
rather than a fuse at the end.

Names the engine deliberately does not serve (MTP layers: EAGLE/MTP speculative decoding is not
run by the embedded engine; the vision tower: the engine is text-only) are skipped, and counted;
any other unknown name is an error, as before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

_EXPERT = re.compile(r"^(?P<mod>.+\.mlp\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")
_LAYER = re.compile(r"^model\.layers\.(?P<i>\d+)\.")
# Composite (vision-language) checkpoints whose text model transformers serves alone.
_TEXT_PREFIX = ("model.language_model.", "model.")
_NOT_SERVED = {"mtp": "MTP layer (the embedded engine runs no speculative decoding)",
               "vision": "vision tower (the embedded engine is text-only)"}


@dataclass(frozen=True)
class Target:
    """Where one checkpoint tensor goes: a model tensor, whole, or the slice ``[expert, rows]``."""

    name: str
    expert: int | None = None
    rows: tuple[int, int] | None = None  # gate / up halves of a fused gate_up_proj


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and persistent buffers (a router's expert bias is a buffer the checkpoint holds;
    rotary tables are non-persistent, derived state, and not named here). Tied weights appear once,
    under their first name, as in named_parameters() (a tied checkpoint holds embed_tokens only)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) not in seen:
            seen.add(id(t))
            out[name] = t
    return out


def _num_layers(model: torch.nn.Module) -> int | None:
    cfg = getattr(model, "config", None)
    return getattr(cfg, "num_hidden_layers", None)


def not_served(name: str, model: torch.nn.Module) -> str | None:
    """Why a checkpoint tensor has no place in the engine's model, or None when it should have one."""
    if name.startswith("mtp."):
        return "mtp"
    if name.startswith(("model.visual.", "visual.")):
        return "vision"
    m = _LAYER.match(name)
    n = _num_layers(model)
    if m and n is not None and int(m["i"]) >= n:  # DeepSeek-V3 / GLM: MTP as layer num_hidden_layers
        return "mtp"
    return None


def resolve(name: str, tensors: dict[str, torch.Tensor]) -> Target | None:
    """The model tensor a checkpoint name fills, or None when the model has none under any rule."""
    candidates = [name]
    if name.startswith(_TEXT_PREFIX[0]):
        candidates.append(_TEXT_PREFIX[1] + name[len(_TEXT_PREFIX[0]):])
    for cand in candidates:
        if cand in tensors:
            return Target(cand)
        m = _EXPERT.match(cand)
        if not m:
            continue
        e, proj = int(m["e"]), m["proj"]
        if proj == "down_proj" and f"{m['mod']}.down_proj" in tensors:
            return Target(f"{m['mod']}.down_proj", expert=e)
        fused = f"{m['mod']}.gate_up_proj"
        if proj != "down_proj" and fused in tensors:
            half = tensors[fused].shape[1] // 2
            return Target(fused, expert=e, rows=(0, half) if proj == "gate_proj" else (half, 2 * half))
    return None


def _pieces(t: Target, tensors: dict[str, torch.Tensor]) -> int:
    """How many checkpoint tensors fill a model tensor completely (for the strict check)."""
    if t.expert is None:
        return 1
    n_experts = tensors[t.name].shape[0]
    return n_experts * (2 if t.rows is not None else 1)


def load_checkpoint_tensors(model: torch.nn.Module, named: dict[str, torch.Tensor],
                            strict: bool = False) -> dict[str, int]:
    """Copy checkpoint-named tensors into the model in place (storage stays where it is, so a
    captured CUDA graph keeps reading the current weights). strict: every model tensor must be
    filled completely (a full update). Returns the count of skipped tensors per reason."""
    tensors = model_tensors(model)
    plan: list[tuple[Target, torch.Tensor]] = []
    skipped: dict[str, int] = {}
    unknown = []
    for name, t in named.items():
        target = resolve(name, tensors)
        if target is None:
            why = not_served(name, model)
            if why is None:
                unknown.append(name)
            else:
                skipped[why] = skipped.get(why, 0) + 1
            continue
        dst = tensors[target.name]
        if target.expert is not None:
            dst = dst[target.expert]
            if target.rows is not None:
                dst = dst[target.rows[0]:target.rows[1]]
        if dst.shape != t.shape:
            raise ValueError(f"{name}: shape {tuple(t.shape)} != the model's {target.name}"
                             f"{'' if target.expert is None else f'[{target.expert}]'} {tuple(dst.shape)}")
        plan.append((target, t))
    if unknown:
        raise KeyError(f"unknown weight names: {unknown[:5]}{'...' if len(unknown) > 5 else ''}")
    if strict:
        filled: dict[str, int] = {}
        for target, _ in plan:
            filled[target.name] = filled.get(target.name, 0) + 1
        missing = sorted(n for n in tensors if filled.get(n, 0) < _pieces(_probe(n, tensors), tensors))
        if missing:
            raise KeyError(f"missing weight names: {missing[:5]}{'...' if len(missing) > 5 else ''}")
    with torch.no_grad():
        for target, t in plan:
            dst = tensors[target.name]
            if target.expert is not None:
                dst = dst[target.expert]
                if target.rows is not None:
                    dst = dst[target.rows[0]:target.rows[1]]
            dst.copy_(t.to(device=dst.device, dtype=dst.dtype))
    return skipped


def _probe(name: str, tensors: dict[str, torch.Tensor]) -> Target:
    """The Target kind of a model tensor (fused gate_up, stacked down, or whole), for counting."""
    if name.endswith(".mlp.experts.gate_up_proj") and tensors[name].dim() == 3:
        return Target(name, expert=0, rows=(0, 0))
    if name.endswith(".mlp.experts.down_proj") and tensors[name].dim() == 3:
        return Target(name, expert=0)
    return Target(name)


def not_served_reasons() -> dict[str, str]:
    return dict(_NOT_SERVED)
