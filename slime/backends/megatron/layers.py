"""Layer specs for the seeded families, from megatron-core's own building blocks.

- every family: megatron-core's local decoder block spec (dense and MoE layers from
  ``--moe-layer-freq``; MLA from ``--multi-latent-attention``; shared experts, sigmoid router with
  expert bias and group-limited routing are MoE config fields), with core attention on PyTorch's
  fused kernels (attention.py);
- GLM-4 dense: the two sandwich norms megatron-core's TransformerLayer lacks, as thin subclasses
  of its SelfAttention and MLP that normalise their output before the residual add (HF's
  ``post_self_attn_layernorm`` / ``post_mlp_layernorm``), built with the layer's own norm class.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Mapping

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


def decoder_block_spec(flags: Mapping[str, Any], config, core_attention=None, vp_stage: int | None = None):
    """megatron-core's local decoder block spec for this pipeline stage (dense / MoE layers per
    ``--moe-layer-freq``), core attention swapped and GLM-4's sandwich norms added."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    from slime.model_spec import _bool

    block = get_gpt_decoder_block_spec(config, use_transformer_engine=False,
                                       normalization=str(flags.get("normalization", "LayerNorm")), vp_stage=vp_stage)
    seen: set[int] = set()
    for spec in block.layer_specs:
        if id(spec) in seen:  # the dense and the MoE spec are shared objects: patch each once
            continue
        seen.add(id(spec))
        if core_attention is not None:
            spec.submodules.self_attention.submodules.core_attention = core_attention
        if _bool(flags, "post_self_attn_layernorm") or _bool(flags, "post_mlp_layernorm"):
            _sandwich(spec)
    return block
