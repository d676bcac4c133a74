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
- MoE with ``--moe-grouped-gemm``: the routed experts run as grouped GEMMs
  (grouped_experts.GroupedSequentialMLP, PyTorch's ``torch._grouped_mm``; megatron-core's own
  grouped experts need Transformer Engine), same parameters as ``SequentialMLP``;
- sequence parallel: megatron-core's local norm (``WrappedTorchNorm``) refuses it, so every norm
  of the local spec is :class:`SPNorm` (the same torch RMSNorm/LayerNorm, its weights marked
  ``sequence_parallel`` so megatron-core sums their gradients over TP);
- MLA at TP > 1: :class:`MLASelfAttentionTP` sums the rotary key's gradient over TP, which
  megatron-core's MLA drops when its kv down projection is a column-parallel linear;
- GLM-5 (DSA): megatron-core's ``AbsorbedMLASelfAttention`` with its ``DSAttention`` core and
  ``DSAIndexer`` on the layers that compute the index top-k (the others reuse it), assembled from
  local linears for the same reason; the indexer's projections are replicated over TP
  (:class:`DuplicatedLinear`).
"""

from __future__ import annotations

import copy
from functools import partial
from typing import Any, Mapping, cast

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
    mlp_cls = cast(type[SandwichMLP], type("SandwichMLPWithNorm", (SandwichMLP,), {"post_norm_builder": norm}))
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
        self.weight.sequence_parallel = bool(config.sequence_parallel)  # type: ignore[attr-defined]  # megatron-core's mark

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


class TPReplicatedState:
    """A norm's checkpoint entries, replicated over TP: megatron-core's default for a plain torch
    module nested in its MLP or attention (GLM-4's sandwich norms) drops the TP group, so every TP
    rank claimed to hold the main copy and a checkpoint saved at TP 1 failed to load at TP 2."""

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None):
        from megatron.core import parallel_state as ps
        from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group, make_sharded_tensors_for_checkpoint

        metadata = ensure_metadata_has_dp_cp_group(metadata)
        module = cast(torch.nn.Module, self)  # mixed into torch norms only
        return make_sharded_tensors_for_checkpoint(module.state_dict(prefix="", keep_vars=True), prefix, {},
                                                   sharded_offsets, tp_group=ps.get_tensor_model_parallel_group(),
                                                   dp_cp_group=metadata["dp_cp_group"])


class _RMSNorm(TPReplicatedState, torch.nn.RMSNorm):
    pass


class _LayerNorm(TPReplicatedState, torch.nn.LayerNorm):
    pass


class SPNorm:
    """megatron-core's ``WrappedTorchNorm`` (torch's RMSNorm / LayerNorm, same parameter names and dtype)
    that also works with sequence parallel: each TP rank normalises its slice of the sequence, so
    each holds a partial gradient of the replicated weight; marking it ``sequence_parallel`` makes
    megatron-core's ``finalize_model_grads`` sum it over the TP group."""

    # A factory: megatron-core builds the spec's class by calling it; what it gets is a torch norm.
    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, **_unused) -> torch.nn.Module:  # type: ignore[misc]
        if config.layernorm_zero_centered_gamma:  # (1+w) norms are OnePlusRMSNorm, chosen by the spec
            raise ValueError("--apply-layernorm-1p: this layer spec's norm scales by w, not 1 + w")
        norm: torch.nn.Module
        if config.normalization == "RMSNorm":
            norm = _RMSNorm(hidden_size, eps=eps)
        elif config.normalization == "LayerNorm":
            norm = _LayerNorm(hidden_size, eps=eps)
        else:
            raise ValueError(f"--normalization {config.normalization}: expected RMSNorm or LayerNorm")
        for p in norm.parameters():
            p.sequence_parallel = bool(config.sequence_parallel)  # type: ignore[attr-defined]  # megatron-core's mark
        return norm


def _swap_norms(sub: Any) -> None:
    """Replace megatron-core's local norm by :class:`SPNorm` in a layer's submodules, nested specs
    included (MLA's q/kv norms, the qk norms)."""
    import dataclasses

    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    if sub is None or not dataclasses.is_dataclass(sub):
        return
    for f in dataclasses.fields(sub):
        v = getattr(sub, f.name)
        if v is WrappedTorchNorm:
            setattr(sub, f.name, SPNorm)
        elif isinstance(v, ModuleSpec):
            if v.module is WrappedTorchNorm:
                v.module = SPNorm
            _swap_norms(v.submodules)
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):
            _swap_norms(v)


class _SumRotaryKeyGrad(torch.autograd.Function):
    """Identity forward; backward sums the rotary-key columns of the gradient over TP.

    MLA's rotary key (the last ``qk_pos_emb_head_dim`` columns of the kv down projection) is shared
    by every head, and each TP rank holds only its heads: its gradient is partial per rank. The
    compressed-kv columns reach here already summed (through the up projection's input all-reduce)."""

    @staticmethod
    def forward(ctx, x, start: int, group):
        ctx.start, ctx.group = start, group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        import torch.distributed as dist

        grad = grad.clone()
        pos = grad[..., ctx.start:].contiguous()
        dist.all_reduce(pos, group=ctx.group)
        grad[..., ctx.start:] = pos
        return grad, None, None


def mla_self_attention_tp():
    """megatron-core's ``MLASelfAttention`` with the TP gradient of the rotary key made whole.

    With a column-parallel kv down projection, megatron-core gathers its output over TP and splits
    off the rotary key; the gather's backward keeps each rank's own column slice of a gradient
    that is, for the rotary key, only the sum over that rank's heads (TP 2 moved the embedding and
    kv down-projection gradients by up to 3e-3). Here the output is gathered first and:
    - with sequence parallel, scattered back to this rank's sequence slice, so that megatron-core
      gathers the rotary key over the sequence, whose backward (a reduce-scatter) sums it over TP;
    - without, passed through :class:`_SumRotaryKeyGrad`.
    Without sequence parallel the q norm's input is the whole (gathered) latent on every rank, so
    its gradient is already whole: it is averaged over TP, not summed (megatron-core sums every
    ``q_layernorm`` for per-head qk norms)."""
    from megatron.core.tensor_parallel.mappings import (
        gather_from_tensor_model_parallel_region,
        scatter_to_sequence_parallel_region,
    )
    from megatron.core.transformer.multi_latent_attention import MLASelfAttention

    class MLASelfAttentionTP(MLASelfAttention):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if not self.config.sequence_parallel and self.tp_group is not None and self.tp_group.size() > 1:
                for p in getattr(self, "q_layernorm", torch.nn.Identity()).parameters():
                    p.average_gradients_across_tp_domain = True

        def _qkv_down_projection(self, hidden_states):
            q_compressed, kv_combined = super()._qkv_down_projection(hidden_states)
            width = self.config.kv_lora_rank + self.config.qk_pos_emb_head_dim
            if kv_combined.size(-1) != width:  # column-parallel: this rank's slice of the columns
                kv_combined = gather_from_tensor_model_parallel_region(kv_combined, group=self.tp_group)
                if self.config.sequence_parallel:
                    kv_combined = scatter_to_sequence_parallel_region(kv_combined, group=self.tp_group)
                else:
                    kv_combined = _SumRotaryKeyGrad.apply(kv_combined, self.config.kv_lora_rank, self.tp_group)
            return q_compressed, kv_combined

    return MLASelfAttentionTP


_MLA_TP = None


def _mla_tp_class():
    global _MLA_TP
    if _MLA_TP is None:
        _MLA_TP = mla_self_attention_tp()
    return _MLA_TP


def _norm_class(flags: Mapping[str, Any]):
    from slime.model_spec import flag_bool

    return OnePlusRMSNorm if flag_bool(flags, "apply_layernorm_1p") else SPNorm


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

    from slime.model_spec import flag_bool

    if getattr(config, "experimental_attention_variant", None) == "gated_delta_net":
        return hybrid_block_spec(flags, config, core_attention, vp_stage)
    dsa = getattr(config, "experimental_attention_variant", None) == "dsa"
    if dsa:  # the block helper refuses attention variants; it only reads the layer pattern here
        config = copy.copy(config)
        config.experimental_attention_variant = None
    block = get_gpt_decoder_block_spec(config, use_transformer_engine=False,
                                       normalization=str(flags.get("normalization", "LayerNorm")), vp_stage=vp_stage)
    from megatron.core.transformer.multi_latent_attention import MLASelfAttention
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    if block.layer_norm is WrappedTorchNorm:
        block.layer_norm = SPNorm
    seen: set[int] = set()
    for spec in block.layer_specs:
        if id(spec) in seen:  # the dense and the MoE spec are shared objects: patch each once
            continue
        seen.add(id(spec))
        if not dsa:  # DSA's indexer keeps megatron-core's norm (its TP > 1 is not covered)
            _swap_norms(spec.submodules)
        if spec.submodules.self_attention.module is MLASelfAttention:
            spec.submodules.self_attention.module = _mla_tp_class()
        if dsa:
            spec.submodules.self_attention = dsa_attention_spec(config)  # its own (sparse) core attention
        elif core_attention is not None:
            spec.submodules.self_attention.submodules.core_attention = core_attention
        if flag_bool(flags, "post_self_attn_layernorm") or flag_bool(flags, "post_mlp_layernorm"):
            _sandwich(spec)
    if flag_bool(flags, "moe_grouped_gemm"):  # grouped GEMMs without Transformer Engine
        from slime.backends.megatron.grouped_experts import use_grouped_experts

        use_grouped_experts(block.layer_specs)
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
