"""Hugging Face <-> megatron-core parameter names and layouts, for every family this backend builds.

One home for the mapping: conversion (both directions), the trainer's HF initialisation and the
weight export that weight sync sends all go through these functions. Names are global (layer and
expert numbers of the whole model); tensors are full (tensor-parallel size 1) unless sharded with
:func:`shard_for_tp`.

Layouts (megatron-core local spec):
- ``linear_qkv`` (GQA): per query group ``g`` the rows ``[q heads of g, k_g, v_g]``, groups
  concatenated; its bias follows the same order. ``q_layernorm`` / ``k_layernorm`` are HF's
  per-head ``q_norm`` / ``k_norm``.
- ``linear_fc1`` (dense MLP, each expert, the shared expert): ``cat([gate_proj, up_proj])``;
  GLM-4 dense checkpoints store that concatenation already (``mlp.gate_up_proj``).
- MLA: ``linear_q_down_proj`` / ``q_layernorm`` / ``linear_q_up_proj`` are HF's ``q_a_proj`` /
  ``q_a_layernorm`` / ``q_b_proj``; ``linear_kv_down_proj`` / ``kv_layernorm`` /
  ``linear_kv_up_proj`` are ``kv_a_proj_with_mqa`` / ``kv_a_layernorm`` / ``kv_b_proj`` (same row
  order: per head [no-rope, rope] and [k no-rope, v]).
- MoE: ``router.weight`` / ``router.expert_bias`` are ``gate.weight`` /
  ``gate.e_score_correction_bias``; ``experts.local_experts.{e}`` is ``experts.{e}``;
  ``shared_experts`` keeps its name.
- GLM-4's sandwich norms: ``self_attention.post_self_attn_layernorm`` / ``mlp.post_mlp_layernorm``.
- Qwen3.5's composite checkpoint keeps the text model under ``model.language_model.``.
- Qwen3.5's gated attention: HF's ``q_proj`` holds, per head, the query rows then the output-gate
  rows; megatron's ``linear_qkv`` holds, per query group, ``[q heads, gate heads, k, v]``.
- GLM-5's DSA indexer (on the layers that compute the index top-k): ``self_attn.indexer.{wq_b, wk,
  k_norm, weights_proj}`` is ``self_attention.core_attention.indexer.{linear_wq_b, linear_wk,
  k_norm, linear_weights_proj}``; replicated over TP.
- Gated DeltaNet (megatron-core's ``GatedDeltaNet``): ``in_proj`` is
  ``cat([in_proj_qkv, in_proj_z, in_proj_b, in_proj_a])`` (sections q, k, v, z, beta, alpha);
  ``conv1d``, ``A_log``, ``dt_bias`` and ``out_proj`` keep their names, ``out_norm`` is ``norm``.
  Under tensor parallelism every section is split on its own (as megatron-core shards them).

- MTP (megatron-core's ``mtp.layers.{k}``: ``enorm``, ``hnorm``, ``eh_proj``, ``final_layernorm``
  and the inner layer ``mtp_model_layer``, shaped like the last decoder layer):
  DeepSeek-V3 / GLM-4.x publish depth ``k`` as decoder layer ``model.layers.{L+k}`` (``L`` decoder
  layers) with ``enorm``, ``hnorm``, ``eh_proj`` and ``shared_head.norm``, plus copies of the
  shared embedding and output head (``embed_tokens``, ``shared_head.head``: read from the main
  ones, written back as copies); Qwen3.5 publishes ``mtp.fc`` (``eh_proj``),
  ``mtp.pre_fc_norm_embedding`` / ``mtp.pre_fc_norm_hidden`` (``enorm`` / ``hnorm``), ``mtp.norm``
  and the inner layer as ``mtp.layers.0``.

HF tensors the Megatron model does not hold (a vision tower; a DSA model's MTP layer) are named by
:func:`carried_hf_names`: conversion carries them unchanged next to the torch_dist checkpoint and
writes them back on export, and says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

import torch

from slime.model_spec import ModelSpecError, spec_from_flags

ModelArgsError = ModelSpecError


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
    qk_norm: bool = False
    post_norms: bool = False
    mla: bool = False
    q_lora_rank: int = 0
    experts: int = 0
    moe_pattern: tuple[int, ...] = ()
    shared_expert: bool = False
    expert_bias: bool = False
    mtp_layers: int = 0
    mtp_built: bool = False  # the Megatron model holds the MTP layers (else they are carried)
    hf_prefix: str = "model."
    composite: bool = False
    fused_gate_up: bool = False  # GLM-4 dense checkpoints store mlp.gate_up_proj (gate rows, then up)
    gated_attention: bool = False  # q_proj carries the attention output gate (Qwen3.5)
    linear_pattern: tuple[int, ...] = ()  # 1 = Gated DeltaNet layer (hybrid models)
    linear_qk_dim: int = 0  # key heads x key head dim
    linear_v_dim: int = 0  # value heads x value head dim
    linear_v_heads: int = 0
    dsa_pattern: tuple[int, ...] = ()  # 1 = the layer computes the DSA index top-k (holds an indexer)

    @property
    def q_per_group(self) -> int:
        return self.heads // self.groups

    def is_moe_layer(self, i: int) -> bool:
        return bool(self.experts) and bool(self.moe_pattern[i])

    def has_indexer(self, i: int) -> bool:
        return bool(self.dsa_pattern) and bool(self.dsa_pattern[i])

    def is_linear_layer(self, i: int) -> bool:
        return bool(self.linear_pattern) and bool(self.linear_pattern[i])

    @property
    def in_proj_sections(self) -> tuple[int, ...]:
        """Rows of a Gated DeltaNet ``in_proj``: q, k, v, z (output gate), beta, alpha."""
        return (self.linear_qk_dim, self.linear_qk_dim, self.linear_v_dim, self.linear_v_dim,
                self.linear_v_heads, self.linear_v_heads)

    @property
    def conv_sections(self) -> tuple[int, ...]:
        return (self.linear_qk_dim, self.linear_qk_dim, self.linear_v_dim)


def dims_from_flags(flags: Mapping) -> Dims:
    from slime.backends.megatron.model_args import builds_mtp

    s = spec_from_flags(flags)
    return Dims(num_layers=s.layers, hidden=s.hidden, heads=s.heads, groups=s.kv_groups, head_dim=s.kv_channels,
                vocab=s.vocab, qkv_bias=s.qkv_bias, tied=s.tied_embeddings, qk_norm=s.qk_layernorm,
                post_norms=s.post_norms, mla=s.mla, q_lora_rank=s.q_lora_rank, experts=s.experts,
                moe_pattern=s.moe_layer_pattern, shared_expert=s.shared_ffn > 0, expert_bias=s.expert_bias,
                mtp_layers=s.mtp_layers, mtp_built=builds_mtp(flags), hf_prefix="model.language_model." if s.hybrid else "model.",
                composite=s.hybrid, fused_gate_up=s.post_norms, gated_attention=s.attention_output_gate,
                linear_pattern=s.linear_layer_pattern,
                linear_qk_dim=s.linear_num_key_heads * s.linear_key_head_dim,
                linear_v_dim=s.linear_num_value_heads * s.linear_value_head_dim,
                linear_v_heads=s.linear_num_value_heads,
                dsa_pattern=tuple(int(s.dsa_computes_index(i)) for i in range(s.layers)) if s.dsa else ())


def require_mapped(flags: Mapping) -> None:
    """Refuse, by name, a spec with a part this backend does not build (model_args.UNSUPPORTED)."""
    from slime.backends.megatron.model_args import unsupported_flags

    missing = unsupported_flags(flags)
    if missing:
        raise ModelArgsError("HF <-> Megatron covers GLM-4 dense, GLM-4.x MoE (GQA and MLA), DeepSeek-V3, GLM-5 "
                             "(DSA) and the Qwen3.5 hybrid (Gated DeltaNet); not built: " + "; ".join(missing))


require_dense = require_mapped  # the name earlier callers use


# --- qkv / fc1 layouts -------------------------------------------------------------------------


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, d: Dims) -> torch.Tensor:
    """HF q/k/v (weights ``[n*dh, h]`` or biases ``[n*dh]``) -> megatron's grouped linear_qkv.

    With the attention output gate, HF's q rows are ``[q_head, gate_head]`` per head and megatron's
    group is ``[q heads, gate heads, k, v]``."""
    tail = q.shape[1:]
    if d.gated_attention:
        qh = q.reshape(d.heads, 2, d.head_dim, *tail)
        parts = [qh[:, 0].reshape(d.groups, d.q_per_group * d.head_dim, *tail),
                 qh[:, 1].reshape(d.groups, d.q_per_group * d.head_dim, *tail)]
    else:
        parts = [q.reshape(d.groups, d.q_per_group * d.head_dim, *tail)]
    kg = k.reshape(d.groups, d.head_dim, *tail)
    vg = v.reshape(d.groups, d.head_dim, *tail)
    return torch.cat([*parts, kg, vg], dim=1).reshape(-1, *tail).contiguous()


def split_qkv(qkv: torch.Tensor, d: Dims, groups: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`fuse_qkv` (``groups`` < d.groups for one tensor-parallel shard)."""
    g = groups or d.groups
    tail = qkv.shape[1:]
    qn = d.q_per_group * d.head_dim
    gn = qn if d.gated_attention else 0
    x = qkv.reshape(g, qn + gn + 2 * d.head_dim, *tail)
    q, k, v = x[:, :qn], x[:, qn + gn:qn + gn + d.head_dim], x[:, qn + gn + d.head_dim:]
    if d.gated_attention:
        heads = g * d.q_per_group
        gate = x[:, qn:qn + gn]
        q = torch.stack([q.reshape(heads, d.head_dim, *tail), gate.reshape(heads, d.head_dim, *tail)], dim=1)
    return (q.reshape(-1, *tail).contiguous(), k.reshape(-1, *tail).contiguous(), v.reshape(-1, *tail).contiguous())


# --- names -------------------------------------------------------------------------------------

_LAYER = re.compile(r"^(?:module\.)*decoder\.layers\.(\d+)\.(.+)$")
_MTP = re.compile(r"^mtp\.layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)\.weight$")

_ATTN_GQA = {
    "self_attention.linear_qkv.weight": ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"],
    "self_attention.linear_qkv.bias": ["self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"],
    "self_attention.q_layernorm.weight": ["self_attn.q_norm.weight"],
    "self_attention.k_layernorm.weight": ["self_attn.k_norm.weight"],
    "self_attention.linear_proj.weight": ["self_attn.o_proj.weight"],
}
_ATTN_MLA = {
    "self_attention.linear_q_proj.weight": ["self_attn.q_proj.weight"],
    "self_attention.linear_q_down_proj.weight": ["self_attn.q_a_proj.weight"],
    "self_attention.q_layernorm.weight": ["self_attn.q_a_layernorm.weight"],
    "self_attention.linear_q_up_proj.weight": ["self_attn.q_b_proj.weight"],
    "self_attention.linear_kv_down_proj.weight": ["self_attn.kv_a_proj_with_mqa.weight"],
    "self_attention.kv_layernorm.weight": ["self_attn.kv_a_layernorm.weight"],
    "self_attention.linear_kv_up_proj.weight": ["self_attn.kv_b_proj.weight"],
    "self_attention.linear_proj.weight": ["self_attn.o_proj.weight"],
}
_ATTN_GDN = {
    "self_attention.in_proj.weight": ["linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight",
                                      "linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight"],
    "self_attention.conv1d.weight": ["linear_attn.conv1d.weight"],
    "self_attention.A_log": ["linear_attn.A_log"],
    "self_attention.dt_bias": ["linear_attn.dt_bias"],
    "self_attention.out_norm.weight": ["linear_attn.norm.weight"],
    "self_attention.out_proj.weight": ["linear_attn.out_proj.weight"],
}
_INDEXER = {
    "self_attention.core_attention.indexer.linear_wq_b.weight": ["self_attn.indexer.wq_b.weight"],
    "self_attention.core_attention.indexer.linear_wk.weight": ["self_attn.indexer.wk.weight"],
    "self_attention.core_attention.indexer.k_norm.weight": ["self_attn.indexer.k_norm.weight"],
    "self_attention.core_attention.indexer.k_norm.bias": ["self_attn.indexer.k_norm.bias"],
    "self_attention.core_attention.indexer.linear_weights_proj.weight": ["self_attn.indexer.weights_proj.weight"],
}
_COMMON = {
    "input_layernorm.weight": ["input_layernorm.weight"],
    "self_attention.linear_qkv.layer_norm_weight": ["input_layernorm.weight"],
    "pre_mlp_layernorm.weight": ["post_attention_layernorm.weight"],
    "mlp.linear_fc1.layer_norm_weight": ["post_attention_layernorm.weight"],
    "self_attention.post_self_attn_layernorm.weight": ["post_self_attn_layernorm.weight"],
    "mlp.post_mlp_layernorm.weight": ["post_mlp_layernorm.weight"],
    "mlp.linear_fc1.weight": ["mlp.gate_proj.weight", "mlp.up_proj.weight"],
    "mlp.linear_fc2.weight": ["mlp.down_proj.weight"],
    "mlp.router.weight": ["mlp.gate.weight"],
    "mlp.router.expert_bias": ["mlp.gate.e_score_correction_bias"],
    "mlp.shared_experts.linear_fc1.weight": ["mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight"],
    "mlp.shared_experts.linear_fc2.weight": ["mlp.shared_experts.down_proj.weight"],
}


def _strip(name: str) -> str:
    while name.startswith("module."):
        name = name[len("module."):]
    return name


def hf_names_for(mcore_name: str, d: Dims) -> list[str]:
    """HF names one megatron tensor (global layer and expert numbers) maps to, in fusion order."""
    name = _strip(mcore_name)
    pre = d.hf_prefix
    lm_head = "lm_head.weight"
    if name == "embedding.word_embeddings.weight":
        embeds, heads = _mtp_shared_copies(d)
        return [pre + "embed_tokens.weight", *embeds, *(heads if d.tied else [])]
    if name == "decoder.final_layernorm.weight":
        return [pre + "norm.weight"]
    if name == "output_layer.weight":
        return [lm_head, *_mtp_shared_copies(d)[1]]
    mtp = _MTP.match(name) if d.mtp_built else None
    if mtp:
        return _mtp_hf_names(int(mtp.group(1)), mtp.group(2), mcore_name, d)
    m = _LAYER.match(name)
    if not m:
        raise KeyError(f"no HF name for megatron parameter {mcore_name!r}")
    i, rest = int(m.group(1)), m.group(2)
    return _layer_hf_names(rest, i, f"{pre}layers.{i}.", mcore_name, d)


def _mtp_hf_prefix(k: int, d: Dims) -> str:
    return f"mtp.layers.{k}." if d.composite else f"{d.hf_prefix}layers.{d.num_layers + k}."


def _mtp_shared_copies(d: Dims) -> tuple[list[str], list[str]]:
    """The MTP depths' copies of the shared embedding and output head (DeepSeek-V3 / GLM-4.x)."""
    if not d.mtp_built or d.composite:
        return [], []
    pre = [_mtp_hf_prefix(k, d) for k in range(d.mtp_layers)]
    return [p + "embed_tokens.weight" for p in pre], [p + "shared_head.head.weight" for p in pre]


_MTP_OWN_DEEPSEEK = {"enorm.weight": "enorm.weight", "hnorm.weight": "hnorm.weight",
                     "eh_proj.weight": "eh_proj.weight", "final_layernorm.weight": "shared_head.norm.weight"}
_MTP_OWN_QWEN = {"enorm.weight": "pre_fc_norm_embedding.weight", "hnorm.weight": "pre_fc_norm_hidden.weight",
                 "eh_proj.weight": "fc.weight", "final_layernorm.weight": "norm.weight"}


def _mtp_hf_names(k: int, rest: str, mcore_name: str, d: Dims) -> list[str]:
    """MTP depth ``k``: its own norms and projection, and the inner layer (shaped like the last
    decoder layer, so mapped with that layer's attention / MLP kind)."""
    own = (_MTP_OWN_QWEN if d.composite else _MTP_OWN_DEEPSEEK).get(rest)
    if own is not None:
        return [("mtp." if d.composite else _mtp_hf_prefix(k, d)) + own]
    if not rest.startswith("mtp_model_layer."):
        raise KeyError(f"no HF name for megatron parameter {mcore_name!r}")
    return _layer_hf_names(rest[len("mtp_model_layer."):], d.num_layers - 1, _mtp_hf_prefix(k, d), mcore_name, d)


def _layer_hf_names(rest: str, i: int, p: str, mcore_name: str, d: Dims) -> list[str]:
    """HF names of one decoder-layer tensor: ``rest`` under HF prefix ``p``, the layer kind of layer ``i``."""
    e = _EXPERT.match(rest)
    if e:
        x = int(e.group(1))
        if e.group(2) == "linear_fc1":
            return [p + f"mlp.experts.{x}.gate_proj.weight", p + f"mlp.experts.{x}.up_proj.weight"]
        return [p + f"mlp.experts.{x}.down_proj.weight"]
    if d.fused_gate_up and rest == "mlp.linear_fc1.weight":
        return [p + "mlp.gate_up_proj.weight"]
    table = _ATTN_GDN if d.is_linear_layer(i) else _ATTN_MLA if d.mla else _ATTN_GQA
    hf = table.get(rest) or _COMMON.get(rest) or (_INDEXER.get(rest) if d.has_indexer(i) else None)
    if hf is None:
        raise KeyError(f"no HF name for megatron parameter {mcore_name!r}")
    return [p + x for x in hf]


def iter_mcore_names(d: Dims) -> Iterator[str]:
    """Every megatron tensor (parameters and the router's expert-bias buffer) of the model."""
    yield "embedding.word_embeddings.weight"
    for i in range(d.num_layers):
        yield from _layer_mcore_names(f"decoder.layers.{i}.", i, d)
    yield "decoder.final_layernorm.weight"
    if d.mtp_built:
        for k in range(d.mtp_layers):
            p = f"mtp.layers.{k}."
            yield from (p + n for n in _MTP_OWN_DEEPSEEK)
            yield from _layer_mcore_names(p + "mtp_model_layer.", d.num_layers - 1, d)
    if not d.tied:
        yield "output_layer.weight"


def _layer_mcore_names(p: str, i: int, d: Dims) -> Iterator[str]:
    """One layer's megatron tensors under prefix ``p``, with the structure of decoder layer ``i``."""
    yield p + "input_layernorm.weight"
    if d.is_linear_layer(i):
        yield from (p + n for n in _ATTN_GDN)
    elif d.mla:
        if d.q_lora_rank:
            yield from (p + "self_attention." + x for x in ("linear_q_down_proj.weight", "q_layernorm.weight",
                                                             "linear_q_up_proj.weight"))
        else:
            yield p + "self_attention.linear_q_proj.weight"
        yield from (p + "self_attention." + x for x in ("linear_kv_down_proj.weight", "kv_layernorm.weight",
                                                         "linear_kv_up_proj.weight"))
        if d.has_indexer(i):
            yield from (p + n for n in _INDEXER)
    if not d.is_linear_layer(i) and not d.mla:
        yield p + "self_attention.linear_qkv.weight"
        if d.qkv_bias:
            yield p + "self_attention.linear_qkv.bias"
        if d.qk_norm:
            yield p + "self_attention.q_layernorm.weight"
            yield p + "self_attention.k_layernorm.weight"
    if not d.is_linear_layer(i):
        yield p + "self_attention.linear_proj.weight"
    if d.post_norms:
        yield p + "self_attention.post_self_attn_layernorm.weight"
    yield p + "pre_mlp_layernorm.weight"
    if d.is_moe_layer(i):
        yield p + "mlp.router.weight"
        if d.expert_bias:
            yield p + "mlp.router.expert_bias"
        for x in range(d.experts):
            yield p + f"mlp.experts.local_experts.{x}.linear_fc1.weight"
            yield p + f"mlp.experts.local_experts.{x}.linear_fc2.weight"
        if d.shared_expert:
            yield p + "mlp.shared_experts.linear_fc1.weight"
            yield p + "mlp.shared_experts.linear_fc2.weight"
    else:
        yield p + "mlp.linear_fc1.weight"
        yield p + "mlp.linear_fc2.weight"
    if d.post_norms:
        yield p + "mlp.post_mlp_layernorm.weight"


def iter_hf_names(d: Dims) -> Iterator[str]:
    """Every HF tensor the Megatron model holds, in file order (used to check completeness)."""
    for n in iter_mcore_names(d):
        yield from hf_names_for(n, d)


_MTP_HF = re.compile(r"^model\.layers\.(\d+)\.")


def carried_hf_names(names: list[str] | set[str], d: Dims) -> list[str]:
    """HF tensors the Megatron model does not hold: the MTP layer(s) of a model whose MTP block is
    not built (GLM-5: ``model.layers.{L..}`` past the last decoder layer) and a composite
    checkpoint's vision tower (``model.visual.*``).
    Anything else unmapped is an error (returned by :func:`unmapped_hf_names`)."""
    out = []
    carry_mtp = d.mtp_layers and not d.mtp_built
    for n in names:
        m = _MTP_HF.match(n)
        if carry_mtp and ((m and int(m.group(1)) >= d.num_layers) or n.startswith("mtp.")):
            out.append(n)
        elif d.composite and n.startswith(("model.visual.", "visual.")):
            out.append(n)
    return sorted(out)


def unmapped_hf_names(names: list[str] | set[str], d: Dims) -> list[str]:
    """HF tensors neither mapped nor carried (a checkpoint that is not the spec's architecture)."""
    known = set(iter_hf_names(d)) | set(carried_hf_names(names, d))
    if d.tied:
        known.add("lm_head.weight")
    return sorted(set(names) - known)


def mcore_to_hf(mcore_name: str, tensor: torch.Tensor, d: Dims) -> list[tuple[str, torch.Tensor]]:
    """One full (TP-merged) megatron tensor -> its HF (name, tensor) pairs.

    Padded vocabulary rows (megatron pads to a multiple of 128 * tp) are dropped.
    """
    names = hf_names_for(mcore_name, d)
    if names[0].endswith(("embed_tokens.weight", "lm_head.weight")):
        # the MTP layers' copies are tensors of their own (safetensors refuses shared storage)
        return [(n, tensor[: d.vocab] if j == 0 else tensor[: d.vocab].clone()) for j, n in enumerate(names)]
    if mcore_name.endswith("self_attention.in_proj.weight"):  # Gated DeltaNet: q, k, v | z | beta | alpha
        qk, v, heads = d.linear_qk_dim, d.linear_v_dim, d.linear_v_heads
        parts = torch.split(tensor, [2 * qk + v, v, heads, heads], dim=0)
        return [(n, t.contiguous()) for n, t in zip(names, parts)]
    if len(names) == 3:
        return list(zip(names, split_qkv(tensor, d)))
    if len(names) == 2:
        gate, up = torch.chunk(tensor, 2, dim=0)
        return [(names[0], gate.contiguous()), (names[1], up.contiguous())]
    return [(names[0], tensor)]


def hf_to_mcore(mcore_name: str, get: Callable[[str], torch.Tensor], d: Dims, padded_vocab: int | None = None) -> torch.Tensor:
    """The full megatron tensor for ``mcore_name`` built from HF tensors (``get(hf_name)``)."""
    names = hf_names_for(mcore_name, d)
    if names[0].endswith(("embed_tokens.weight", "lm_head.weight")):
        src = names[0]
        if src == "lm_head.weight" and d.tied:
            src = d.hf_prefix + "embed_tokens.weight"
        t = get(src)
        if padded_vocab and padded_vocab > t.shape[0]:
            t = torch.cat([t, t.new_zeros(padded_vocab - t.shape[0], *t.shape[1:])])
        return t
    parts = [get(n) for n in names]
    if mcore_name.endswith("self_attention.in_proj.weight"):
        return torch.cat(parts, dim=0)
    if len(parts) == 3:
        return fuse_qkv(parts[0], parts[1], parts[2], d)
    if len(parts) == 2:
        return torch.cat(parts, dim=0)
    return parts[0]


# --- tensor parallelism ------------------------------------------------------------------------

_COLUMN = ("linear_qkv.weight", "eh_proj.weight", "linear_qkv.bias", "linear_fc1.weight", "word_embeddings.weight",
           "output_layer.weight", "linear_q_proj.weight", "linear_q_down_proj.weight", "linear_q_up_proj.weight",
           "linear_kv_down_proj.weight", "linear_kv_up_proj.weight",
           # Gated DeltaNet: projections, depthwise conv and per-value-head parameters split by head
           "self_attention.in_proj.weight", "self_attention.conv1d.weight", "self_attention.A_log",
           "self_attention.dt_bias")
_ROW = ("linear_proj.weight", "linear_fc2.weight", "self_attention.out_proj.weight")


def tp_axis(mcore_name: str) -> int | None:
    if mcore_name.endswith(_COLUMN):
        return 0
    if mcore_name.endswith(_ROW):
        return 1
    return None  # replicated (norms, router)


def _sections(mcore_name: str, d: Dims | None) -> tuple[int, ...] | None:
    """Row sections split separately over TP ranks (Gated DeltaNet's fused projections)."""
    if d is None or not d.linear_pattern:
        return None
    if mcore_name.endswith("self_attention.in_proj.weight"):
        return d.in_proj_sections
    if mcore_name.endswith("self_attention.conv1d.weight"):
        return d.conv_sections
    return None


def shard_for_tp(mcore_name: str, full: torch.Tensor, tp: int, rank: int, d: Dims | None = None) -> torch.Tensor:
    """This TP rank's shard of a full megatron tensor (qkv by query groups, fc1 by gate/up, a Gated
    DeltaNet projection section by section)."""
    axis = tp_axis(mcore_name)
    if tp == 1 or axis is None:
        return full
    sections = _sections(mcore_name, d)
    if sections:
        return torch.cat([torch.chunk(p, tp)[rank] for p in torch.split(full, list(sections))]).contiguous()
    if mcore_name.endswith("linear_fc1.weight"):
        gate, up = torch.chunk(full, 2, dim=0)
        return torch.cat([torch.chunk(gate, tp)[rank], torch.chunk(up, tp)[rank]]).contiguous()
    # qkv rows are grouped per query group, so contiguous chunks are whole groups.
    return torch.chunk(full, tp, dim=axis)[rank].contiguous()


def merge_tp(mcore_name: str, shards: list[torch.Tensor], d: Dims | None = None) -> torch.Tensor:
    """Inverse of :func:`shard_for_tp`."""
    axis = tp_axis(mcore_name)
    if len(shards) == 1 or axis is None:
        return shards[0]
    sections = _sections(mcore_name, d)
    if sections:
        tp = len(shards)
        local = [torch.split(s, [n // tp for n in sections]) for s in shards]
        return torch.cat([part[j] for j in range(len(sections)) for part in local])
    if mcore_name.endswith("linear_fc1.weight"):
        halves = [torch.chunk(s, 2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    return torch.cat(shards, dim=axis)
