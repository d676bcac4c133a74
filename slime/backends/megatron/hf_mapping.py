"""Hugging Face <-> megatron-core parameter names and layouts (dense Qwen2 / Llama families).

One home for the mapping: conversion (both directions), the trainer's HF initialisation and the
weight export that weight sync sends all go through these functions.

Layouts (megatron-core local spec, full tensors, i.e. tensor-parallel size 1):
- ``linear_qkv``: per query group ``g`` the rows ``[q heads of g (q_per_group * d), k_g (d),
  v_g (d)]``, groups concatenated. Its bias follows the same order.
- ``linear_fc1``: ``cat([gate_proj, up_proj])`` (SwiGLU: ``silu(gate) * up``).
- ``input_layernorm`` / ``pre_mlp_layernorm`` are HF's ``input_layernorm`` /
  ``post_attention_layernorm``.
Tensor-parallel shards are produced and merged by :func:`shard_for_tp` / :func:`merge_tp`, which
know that qkv is split by query groups and fc1 by its gate and up halves.

MoE and MLA checkpoints are not mapped yet: :func:`require_dense` names what is missing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

import torch

from slime.backends.megatron.model_args import (ModelArgsError, _bool, _int, is_mla, is_moe, kv_channels,
                                                num_query_groups)


@dataclass(frozen=True)
class Dims:
    num_layers: int
    hidden: int
    heads: int
    groups: int
    head_dim: int
    vocab: int
    qkv_bias: bool
    tied: bool

    @property
    def q_per_group(self) -> int:
        return self.heads // self.groups


def dims_from_flags(flags: Mapping) -> Dims:
    return Dims(num_layers=_int(flags, "num_layers"), hidden=_int(flags, "hidden_size"),
                heads=_int(flags, "num_attention_heads"), groups=num_query_groups(flags),
                head_dim=kv_channels(flags), vocab=_int(flags, "vocab_size"),
                qkv_bias=_bool(flags, "add_qkv_bias") or not _bool(flags, "disable_bias_linear"),
                tied=not _bool(flags, "untie_embeddings_and_output_weights"))


def require_dense(flags: Mapping) -> None:
    missing = []
    if is_moe(flags):
        missing.append("MoE experts/router (--num-experts)")
    if is_mla(flags):
        missing.append("multi-latent attention (--multi-latent-attention)")
    if _bool(flags, "qk_layernorm"):
        missing.append("q/k layernorm (--qk-layernorm)")
    if _bool(flags, "attention_output_gate"):
        missing.append("the attention output gate (--attention-output-gate)")
    if (_int(flags, "mtp_num_layers", 0) or 0) > 0:
        missing.append("the MTP layer (--mtp-num-layers)")
    if missing:
        raise ModelArgsError("HF <-> Megatron weight mapping covers dense GQA (Qwen2/Llama) models; "
                             "not yet mapped: " + ", ".join(missing))


# --- qkv / fc1 layouts -------------------------------------------------------------------------


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, d: Dims) -> torch.Tensor:
    """HF q/k/v (weights ``[n*dh, h]`` or biases ``[n*dh]``) -> megatron's grouped linear_qkv."""
    tail = q.shape[1:]
    qg = q.reshape(d.groups, d.q_per_group * d.head_dim, *tail)
    kg = k.reshape(d.groups, d.head_dim, *tail)
    vg = v.reshape(d.groups, d.head_dim, *tail)
    return torch.cat([qg, kg, vg], dim=1).reshape(-1, *tail).contiguous()


def split_qkv(qkv: torch.Tensor, d: Dims, groups: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`fuse_qkv` (``groups`` < d.groups for one tensor-parallel shard)."""
    g = groups or d.groups
    tail = qkv.shape[1:]
    x = qkv.reshape(g, (d.q_per_group + 2) * d.head_dim, *tail)
    qn = d.q_per_group * d.head_dim
    q, k, v = x[:, :qn], x[:, qn:qn + d.head_dim], x[:, qn + d.head_dim:]
    return (q.reshape(-1, *tail).contiguous(), k.reshape(-1, *tail).contiguous(), v.reshape(-1, *tail).contiguous())


# --- names -------------------------------------------------------------------------------------

_LAYER = re.compile(r"^(?:module\.)*decoder\.layers\.(\d+)\.(.+)$")


def hf_names_for(mcore_name: str, d: Dims) -> list[str]:
    """HF names one megatron parameter (global layer number) maps to, in fusion order."""
    name = mcore_name
    while name.startswith("module."):
        name = name[len("module."):]
    if name == "embedding.word_embeddings.weight":
        return ["model.embed_tokens.weight"]
    if name == "decoder.final_layernorm.weight":
        return ["model.norm.weight"]
    if name == "output_layer.weight":
        return ["lm_head.weight"]
    m = _LAYER.match(name)
    if not m:
        raise KeyError(f"no HF name for megatron parameter {mcore_name!r}")
    i, rest = int(m.group(1)), m.group(2)
    p = f"model.layers.{i}."
    table = {
        "input_layernorm.weight": [p + "input_layernorm.weight"],
        "self_attention.linear_qkv.layer_norm_weight": [p + "input_layernorm.weight"],
        "pre_mlp_layernorm.weight": [p + "post_attention_layernorm.weight"],
        "mlp.linear_fc1.layer_norm_weight": [p + "post_attention_layernorm.weight"],
        "self_attention.linear_qkv.weight": [p + f"self_attn.{x}_proj.weight" for x in "qkv"],
        "self_attention.linear_qkv.bias": [p + f"self_attn.{x}_proj.bias" for x in "qkv"],
        "self_attention.linear_proj.weight": [p + "self_attn.o_proj.weight"],
        "mlp.linear_fc1.weight": [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"],
        "mlp.linear_fc2.weight": [p + "mlp.down_proj.weight"],
    }
    if rest not in table:
        raise KeyError(f"no HF name for megatron parameter {mcore_name!r}")
    return table[rest]


def mcore_to_hf(mcore_name: str, tensor: torch.Tensor, d: Dims) -> list[tuple[str, torch.Tensor]]:
    """One full (TP-merged) megatron tensor -> its HF (name, tensor) pairs.

    Padded vocabulary rows (megatron pads to a multiple of 128 * tp) are dropped.
    """
    names = hf_names_for(mcore_name, d)
    if names[0] in ("model.embed_tokens.weight", "lm_head.weight"):
        return [(names[0], tensor[: d.vocab])]
    if len(names) == 3:
        return list(zip(names, split_qkv(tensor, d)))
    if len(names) == 2:
        gate, up = torch.chunk(tensor, 2, dim=0)
        return [(names[0], gate.contiguous()), (names[1], up.contiguous())]
    return [(names[0], tensor)]


def hf_to_mcore(mcore_name: str, get: Callable[[str], torch.Tensor], d: Dims, padded_vocab: int | None = None) -> torch.Tensor:
    """The full megatron tensor for ``mcore_name`` built from HF tensors (``get(hf_name)``)."""
    names = hf_names_for(mcore_name, d)
    if names[0] in ("model.embed_tokens.weight", "lm_head.weight"):
        src = names[0]
        if src == "lm_head.weight" and d.tied:
            src = "model.embed_tokens.weight"
        t = get(src)
        if padded_vocab and padded_vocab > t.shape[0]:
            t = torch.cat([t, t.new_zeros(padded_vocab - t.shape[0], *t.shape[1:])])
        return t
    parts = [get(n) for n in names]
    if len(parts) == 3:
        return fuse_qkv(*parts, d)
    if len(parts) == 2:
        return torch.cat(parts, dim=0)
    return parts[0]


# --- tensor parallelism ------------------------------------------------------------------------

_COLUMN = ("linear_qkv.weight", "linear_qkv.bias", "linear_fc1.weight", "word_embeddings.weight",
           "output_layer.weight")
_ROW = ("linear_proj.weight", "linear_fc2.weight")


def tp_axis(mcore_name: str) -> int | None:
    if mcore_name.endswith(_COLUMN):
        return 0
    if mcore_name.endswith(_ROW):
        return 1
    return None  # replicated (norms)


def shard_for_tp(mcore_name: str, full: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    """This TP rank's shard of a full megatron tensor (qkv by query groups, fc1 by gate/up)."""
    axis = tp_axis(mcore_name)
    if tp == 1 or axis is None:
        return full
    if mcore_name.endswith("linear_fc1.weight"):
        gate, up = torch.chunk(full, 2, dim=0)
        return torch.cat([torch.chunk(gate, tp)[rank], torch.chunk(up, tp)[rank]]).contiguous()
    # qkv rows are grouped per query group, so contiguous chunks are whole groups.
    return torch.chunk(full, tp, dim=axis)[rank].contiguous()


def merge_tp(mcore_name: str, shards: list[torch.Tensor]) -> torch.Tensor:
    """Inverse of :func:`shard_for_tp`."""
    axis = tp_axis(mcore_name)
    if len(shards) == 1 or axis is None:
        return shards[0]
    if mcore_name.endswith("linear_fc1.weight"):
        halves = [torch.chunk(s, 2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    return torch.cat(shards, dim=axis)


def iter_hf_names(d: Dims) -> Iterator[str]:
    """Every HF tensor name of the dense model, in file order (used to check completeness)."""
    yield "model.embed_tokens.weight"
    for i in range(d.num_layers):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight"
        for x in "qkv":
            yield p + f"self_attn.{x}_proj.weight"
            if d.qkv_bias:
                yield p + f"self_attn.{x}_proj.bias"
        yield p + "self_attn.o_proj.weight"
        yield p + "post_attention_layernorm.weight"
        for x in ("gate", "up", "down"):
            yield p + f"mlp.{x}_proj.weight"
    yield "model.norm.weight"
    if not d.tied:
        yield "lm_head.weight"
