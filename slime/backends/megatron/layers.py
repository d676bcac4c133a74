"""Layer specs for the seeded families, from megatron-core's own building blocks.

- every family: megatron-core's local decoder block spec (dense and MoE layers from
  ``--moe-layer-freq``; MLA from ``--multi-latent-attention``; shared experts, sigmoid router with
  expert bias and group-limited routing are MoE config fields), with core attention on PyTorch's
  fused kernels (attention.py);
- GLM-4 dense: the two sandwich norms megatron-core's TransformerLayer lacks, as thin subclasses
  of its SelfAttention and MLP that normalise their output before the residual add (HF's
  ``post_self_attn_layernorm`` / ``post_mlp_layernorm``), built with the layer's own norm class;
- Qwen3.5 hybrid: megatron-core's ``GatedDeltaNet`` for the linear-attention layers and its
  ``SelfAttention`` with ``attention_output_gate`` for the full-attention ones, placed by the
  per-layer pattern. Without Transformer Engine, megatron-core's own hybrid spec cannot be used
  (it asks for TE's fused norm+linear), so the same modules are assembled here from local
  linears; the (1+w) RMSNorm of these checkpoints is :class:`OnePlusRMSNorm` (megatron-core's
  local norm refuses ``layernorm_zero_centered_gamma``), and the GDN output norm keeps a plain
  weight (:class:`GatedOutputRMSNorm`), as the checkpoint's does;
- GLM-5 (DSA): megatron-core's ``AbsorbedMLASelfAttention`` with its ``DSAttention`` core and
  ``DSAIndexer`` on the layers that compute the index top-k (the others reuse it), assembled from
  local linears for the same reason; the indexer's projections are replicated over TP
  (:class:`DuplicatedLinear`).
"""

from __future__ import annotations

import copy
from functools import partial
from typing import Any, Mapping

import torch
from megatron.core.transformer.attention import SelfAttention
from megatron.core.transformer.mlp import MLP
from megatron.core.transformer.spec_utils import ModuleSpec, build_module


def _post_norm(builder, config):
    return build_module(builder, config=config, hidden_size=config.hidden_size, eps=config.layernorm_epsilon)


class SandwichSelfAttention(SelfAttention):
    """SelfAttention whose output goes through ``post_self_attn_layernorm`` (GLM-4)."""

    def __init__(self, *args, post_norm=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.post_self_attn_layernorm = _post_norm(post_norm, self.config)

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        return (self.post_self_attn_layernorm(out[0]), *out[1:])


class SandwichMLP(MLP):
    """MLP whose output goes through ``post_mlp_layernorm`` (GLM-4)."""

    post_norm_builder: Any = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.post_mlp_layernorm = _post_norm(type(self).post_norm_builder, self.config)

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        return (self.post_mlp_layernorm(out[0]), *out[1:])


def _sandwich(layer: ModuleSpec) -> None:
    sub = layer.submodules
    norm = sub.input_layernorm
    attn = sub.self_attention
    attn.module = SandwichSelfAttention
    attn.params = {**(attn.params or {}), "post_norm": norm}
    mlp_cls = type("SandwichMLPWithNorm", (SandwichMLP,), {"post_norm_builder": norm})
    mlp = sub.mlp
    sub.mlp = partial(mlp_cls.as_mlp_submodule, *mlp.args, **mlp.keywords)


class OnePlusRMSNorm(torch.nn.Module):
    """RMSNorm scaling by ``1 + weight`` (zero-centred gamma), computed in fp32 like Qwen3.5's
    ``Qwen3_5RMSNorm``: the checkpoint's weights load unchanged."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-6, **_unused):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.zeros(hidden_size, dtype=config.params_dtype))
        # replicated over TP; with sequence parallel its gradient is summed over the TP group
        self.weight.sequence_parallel = bool(config.sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


class GatedOutputRMSNorm(torch.nn.Module):
    """The norm inside a Gated DeltaNet layer, before the SiLU output gate (HF's
    ``Qwen3_5RMSNormGated`` minus the gate, which megatron-core's GatedDeltaNet applies): plain
    weight, normalised in fp32, scaled in the input dtype."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-6, **_unused):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def _norm_class(flags: Mapping[str, Any]):
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    from slime.model_spec import _bool

    return OnePlusRMSNorm if _bool(flags, "apply_layernorm_1p") else WrappedTorchNorm


def hybrid_block_spec(flags: Mapping[str, Any], config, core_attention=None, vp_stage: int | None = None):
    """Decoder block of a hybrid model: ``config.linear_attention_freq`` (1 = Gated DeltaNet,
    0 = full attention) decides each layer; this pipeline stage's slice of them."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.ssm.gated_delta_net import GatedDeltaNet, GatedDeltaNetSubmodules
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    norm = _norm_class(flags)

    def local_layer():
        spec = get_gpt_layer_local_spec(num_experts=None, qk_layernorm=config.qk_layernorm,
                                        normalization=config.normalization)
        sub = spec.submodules
        sub.input_layernorm = norm
        sub.pre_mlp_layernorm = norm
        return spec

    full = local_layer()
    attn = full.submodules.self_attention.submodules
    if config.qk_layernorm:
        attn.q_layernorm = attn.k_layernorm = norm
    if core_attention is not None:
        attn.core_attention = core_attention
    linear = local_layer()
    linear.submodules.self_attention = ModuleSpec(
        module=GatedDeltaNet,
        submodules=GatedDeltaNetSubmodules(in_proj=ColumnParallelLinear, out_norm=GatedOutputRMSNorm,
                                           out_proj=RowParallelLinear))
    pattern = list(config.linear_attention_freq)
    offset = get_transformer_layer_offset(config, vp_stage=vp_stage)
    count = get_num_layers_to_build(config, vp_stage=vp_stage)
    specs = [linear if pattern[i] else full for i in range(offset, offset + count)]
    return TransformerBlockSubmodules(layer_specs=specs, layer_norm=norm)


class DuplicatedLinear(torch.nn.Module):
    """A linear layer replicated on every TP rank, with megatron's ``(output, bias)`` return (what
    the DSA indexer asks of Transformer Engine's ``TELinear(parallel_mode="duplicated")``)."""

    def __init__(self, input_size: int, output_size: int, *, config, init_method=None, bias: bool = False,
                 **_unused):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(output_size, input_size, dtype=config.params_dtype))
        if config.perform_initialization and init_method is not None:
            init_method(self.weight)
        self.bias = torch.nn.Parameter(torch.zeros(output_size, dtype=config.params_dtype)) if bias else None

    def forward(self, x: torch.Tensor):
        return torch.nn.functional.linear(x, self.weight, self.bias), None


def dsa_attention_spec(config) -> ModuleSpec:
    """Absorbed MLA with DeepSeek sparse attention (megatron-core's modules, local linears)."""
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.experimental_attention_variant.absorbed_mla import (
        AbsorbedMLASelfAttention,
        AbsorbedMLASelfAttentionSubmodules,
    )
    from megatron.core.transformer.experimental_attention_variant.dsa import (
        DSAIndexer,
        DSAIndexerSubmodules,
        DSAttention,
        DSAttentionSubmodules,
    )
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    indexer = ModuleSpec(module=DSAIndexer, submodules=DSAIndexerSubmodules(
        linear_wq_b=DuplicatedLinear, linear_wk=DuplicatedLinear, k_norm=WrappedTorchNorm,
        linear_weights_proj=DuplicatedLinear))
    qk_norm = WrappedTorchNorm if config.qk_layernorm else IdentityOp
    return ModuleSpec(
        module=AbsorbedMLASelfAttention, params={"attn_mask_type": AttnMaskType.causal},
        submodules=AbsorbedMLASelfAttentionSubmodules(
            linear_q_proj=ColumnParallelLinear, linear_q_down_proj=ColumnParallelLinear,
            linear_q_up_proj=ColumnParallelLinear, linear_kv_down_proj=ColumnParallelLinear,
            linear_kv_up_proj=ColumnParallelLinear,
            core_attention=ModuleSpec(module=DSAttention, submodules=DSAttentionSubmodules(indexer=indexer)),
            linear_proj=RowParallelLinear, q_layernorm=qk_norm, kv_layernorm=qk_norm))


def decoder_block_spec(flags: Mapping[str, Any], config, core_attention=None, vp_stage: int | None = None):
    """megatron-core's local decoder block spec for this pipeline stage (dense / MoE layers per
    ``--moe-layer-freq``), core attention swapped and GLM-4's sandwich norms added; the hybrid
    block of :func:`hybrid_block_spec` for a spec with linear-attention layers."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    from slime.model_spec import _bool

    if getattr(config, "experimental_attention_variant", None) == "gated_delta_net":
        return hybrid_block_spec(flags, config, core_attention, vp_stage)
    dsa = getattr(config, "experimental_attention_variant", None) == "dsa"
    if dsa:  # the block helper refuses attention variants; it only reads the layer pattern here
        config = copy.copy(config)
        config.experimental_attention_variant = None
    block = get_gpt_decoder_block_spec(config, use_transformer_engine=False,
                                       normalization=str(flags.get("normalization", "LayerNorm")), vp_stage=vp_stage)
    seen: set[int] = set()
    for spec in block.layer_specs:
        if id(spec) in seen:  # the dense and the MoE spec are shared objects: patch each once
            continue
        seen.add(id(spec))
        if dsa:
            spec.submodules.self_attention = dsa_attention_spec(config)  # its own (sparse) core attention
        elif core_attention is not None:
            spec.submodules.self_attention.submodules.core_attention = core_attention
        if _bool(flags, "post_self_attn_layernorm") or _bool(flags, "post_mlp_layernorm"):
            _sandwich(spec)
    return block


def mtp_block_spec(flags: Mapping[str, Any], config, decoder_block, vp_stage: int | None = None):
    """megatron-core's multi-token-prediction block for this pipeline stage (None where the stage
    builds no MTP layer: megatron-core places them all on the last stage).

    Each MTP layer is megatron-core's ``MultiTokenPredictionLayer`` assembled from the same local
    parts as the decoder: ``enorm`` / ``hnorm`` / ``final_layernorm`` are the decoder's norm class
    ((1+w) for Qwen3.5), ``eh_proj`` a column-parallel linear, and the inner layer the decoder's
    last layer spec (a MoE layer with MLA for DeepSeek-V3 / GLM-4.7-Flash, a gated full-attention
    layer for Qwen3.5, whose MTP layer is never a Gated DeltaNet one). megatron-core's own helper
    (``get_gpt_mtp_block_spec``) would pick its global local norm, not the checkpoint's."""
    from megatron.core.tensor_parallel import ColumnParallelLinear
    from megatron.core.transformer.multi_token_prediction import (
        MultiTokenPredictionBlockSubmodules,
        MultiTokenPredictionLayer,
        MultiTokenPredictionLayerSubmodules,
        get_mtp_num_layers_to_build,
    )

    if not config.mtp_num_layers or get_mtp_num_layers_to_build(config, vp_stage=vp_stage) == 0:
        return None
    inner = decoder_block.layer_specs[-1] if decoder_block.layer_specs else None
    if inner is None:
        raise ValueError("the MTP layer copies the last decoder layer's spec; this stage builds none")
    attn = inner.submodules.self_attention
    if getattr(attn, "module", None) is not None and attn.module.__name__ == "GatedDeltaNet":
        raise ValueError("the last decoder layer is a Gated DeltaNet layer; the MTP layer of a hybrid model is a "
                         "full-attention layer (check --linear-attention-freq)")
    norm = decoder_block.layer_norm
    layer = ModuleSpec(module=MultiTokenPredictionLayer, submodules=MultiTokenPredictionLayerSubmodules(
        enorm=norm, hnorm=norm, eh_proj=ColumnParallelLinear, mtp_model_layer=inner, layer_norm=norm))
    return MultiTokenPredictionBlockSubmodules(layer_specs=[layer] * config.mtp_num_layers)
