"""MODEL_ARGS (``scripts/models/*.sh``) and Megatron pass-through flags -> megatron-core kwargs.

Pure Python: nothing here imports torch or megatron-core, so the mapping is unit-tested on a CPU
machine (tests/runtime/test_megatron_cpu_parts.py) and the conversion tool can refuse a mismatched
checkpoint before any library or weight is loaded.

Flags use the key convention of ``slime.args`` (``--num-query-groups 2`` -> ``num_query_groups:
"2"``, a switch -> ``True``), so ``cfg.megatron`` (the pass-through dict the runtime parser fills
from ``${MODEL_ARGS[@]}``) and a spec file read here give the same dict.

Spec files are read by :mod:`slime.model_spec` (torch-free, bash-free), the one reader the lab,
the converters, ``experiment.sh check`` and both trainers share.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

# The spec reader, the typed spec and the config.json comparison live in slime.model_spec (one
# home for model facts); the names below stay importable from here for the backend's callers.
from slime.model_spec import (  # noqa: E402,F401
    ConfigMismatchError,  # noqa: E402,F401
    expand_layer_pattern,
    flag_bool,
    flag_float,
    flag_int,
    flags_from_argv,
    load_flags,
    model_args_from_text,
    parse_layer_pattern,
    read_model_args,
)
from slime.model_spec import ModelSpecError as ModelArgsError  # noqa: E402
from slime.refusals import declare  # noqa: E402

# --- typed accessors ---------------------------------------------------------------------------


def _require(flags: Mapping[str, Any], *keys: str) -> None:
    missing = [k for k in keys if flags.get(k) in (None, False)]
    if missing:
        raise ModelArgsError(_S("lacks", flags=", ".join("--" + k.replace("_", "-") for k in missing)))


def _dim(flags: Mapping[str, Any], key: str) -> int:
    """A dimension the spec must give (refused when it lacks it)."""
    _require(flags, key)
    return flag_int(flags, key, 0)  # present: the default is never taken


# --- what this backend builds ------------------------------------------------------------------

# Flags the spec files use that this backend does not build yet. Refused with the reason rather
# than silently building a different network (empty today: every seeded family is built). Each is
# the code megatron.unsupported.<flag>, worded (the reason) in slime/locales/refusals.*.json.
UNSUPPORTED: tuple[str, ...] = ()

# The linear-attention variants this backend builds (megatron-core's experimental_attention_variant).
LINEAR_ATTENTION_VARIANTS = ("gated_delta_net",)


_R = declare("megatron.unsupported", {
    **{k: () for k in UNSUPPORTED},
    "linear_attention_variant": ("variant", "built"),
    "hybrid_mtp_depths": ("n",),
})


_S = declare("megatron.spec", {
    "lacks": ("flags",),
    "cannot_build": ("reasons",),
    "recompute": ("granularity",),
})


def unsupported_flags(flags: Mapping[str, Any]) -> list[str]:
    out: list[str] = [_R(k) for k in UNSUPPORTED if flag_bool(flags, k)]
    variant = flags.get("hybrid_linear_attention")
    if variant not in (None, False) and linear_attention_variant(flags) not in LINEAR_ATTENTION_VARIANTS:
        out.append(_R("linear_attention_variant", variant=linear_attention_variant(flags),
                      built=", ".join(LINEAR_ATTENTION_VARIANTS)))
    if is_hybrid(flags) and (flag_int(flags, "mtp_num_layers", 0) or 0) > 1:
        out.append(_R("hybrid_mtp_depths", n=flag_int(flags, "mtp_num_layers")))
    return out


def is_hybrid(flags: Mapping[str, Any]) -> bool:
    return "hybrid_linear_attention" in flags or "linear_attention_freq" in flags


def linear_attention_variant(flags: Mapping[str, Any]) -> str:
    """``--hybrid-linear-attention gated_delta_net`` (a bare switch means Gated DeltaNet)."""
    v = flags.get("hybrid_linear_attention", "gated_delta_net")
    return "gated_delta_net" if v is True else str(v)


MTP_LOSS_SCALING_DEFAULT = 0.1  # megatron-core's default weight of the MTP loss


def builds_mtp(flags: Mapping[str, Any]) -> bool:
    """Whether the Megatron model holds the spec's MTP layers (megatron-core's MTP block).

    Not for a DSA model (GLM-5): its MTP layer's indexer placement is not mapped, so those
    tensors are carried unchanged next to the checkpoint (hf_mapping.carried_hf_names)."""
    return (flag_int(flags, "mtp_num_layers", 0) or 0) > 0 and not flag_bool(flags, "enable_dsa_indexer")


def is_moe(flags: Mapping[str, Any]) -> bool:
    return (flag_int(flags, "num_experts", 0) or 0) > 0


def is_mla(flags: Mapping[str, Any]) -> bool:
    return flag_bool(flags, "multi_latent_attention")


def num_query_groups(flags: Mapping[str, Any]) -> int:
    heads = _dim(flags, "num_attention_heads")
    if flag_bool(flags, "group_query_attention") or "num_query_groups" in flags:
        return flag_int(flags, "num_query_groups", heads)
    return heads


def kv_channels(flags: Mapping[str, Any]) -> int:
    return flag_int(flags, "kv_channels") or _dim(flags, "hidden_size") // _dim(flags, "num_attention_heads")


def padded_vocab_size(flags: Mapping[str, Any], tp: int = 1) -> int:
    """Megatron pads the vocabulary to a multiple of ``make_vocab_size_divisible_by * tp``.

    The padded rows are zeros on conversion, dropped on export, and masked out of the softmax by
    the trainer, so log-probs equal the HF model's.
    """
    vocab = flag_int(flags, "vocab_size")
    if vocab is None:
        raise ModelArgsError(_S("lacks", flags="--vocab-size"))
    div = (flag_int(flags, "make_vocab_size_divisible_by", 128) or 1) * tp
    return int(math.ceil(vocab / div) * div)


def transformer_config_kwargs(flags: Mapping[str, Any], parallel: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """kwargs for ``TransformerConfig`` (or ``MLATransformerConfig`` when ``is_mla``).

    Values that are callables in megatron-core (the activation) are given by name here
    (``activation_func: 'silu'``) and resolved by :func:`slime.backends.megatron.model.make_config`,
    so this stays importable without torch.
    """
    bad = unsupported_flags(flags)
    if bad:
        raise ModelArgsError(_S("cannot_build", reasons="; ".join(bad)))
    _require(flags, "num_layers", "hidden_size", "num_attention_heads")
    num_layers = _dim(flags, "num_layers")
    hidden = _dim(flags, "hidden_size")
    kw: dict[str, Any] = {
        "num_layers": num_layers,
        "hidden_size": hidden,
        "ffn_hidden_size": flag_int(flags, "ffn_hidden_size", 4 * hidden),
        "num_attention_heads": flag_int(flags, "num_attention_heads"),
        "num_query_groups": num_query_groups(flags),
        "kv_channels": kv_channels(flags),
        "normalization": str(flags.get("normalization", "LayerNorm")),
        "layernorm_epsilon": flag_float(flags, "norm_epsilon", 1e-5),
        "layernorm_zero_centered_gamma": flag_bool(flags, "apply_layernorm_1p"),
        "gated_linear_unit": flag_bool(flags, "swiglu"),
        "activation_func": "silu" if flag_bool(flags, "swiglu") else "gelu",
        "add_bias_linear": not flag_bool(flags, "disable_bias_linear"),
        "add_qkv_bias": flag_bool(flags, "add_qkv_bias") or not flag_bool(flags, "disable_bias_linear"),
        "qk_layernorm": flag_bool(flags, "qk_layernorm"),
        "attention_output_gate": flag_bool(flags, "attention_output_gate"),
        "rotary_interleaved": flag_bool(flags, "rotary_interleaved"),
        # RL fine-tuning runs without dropout unless the spec asks for it (Megatron-LM's 0.1
        # default would make the train/rollout log-probs disagree by construction).
        "attention_dropout": flag_float(flags, "attention_dropout", 0.0),
        "hidden_dropout": flag_float(flags, "hidden_dropout", 0.0),
        "attention_softmax_in_fp32": True,
        "bf16": not flag_bool(flags, "fp16"),
        "fp16": flag_bool(flags, "fp16"),
        "params_dtype": "float16" if flag_bool(flags, "fp16") else "bfloat16",
        "bias_activation_fusion": flag_bool(flags, "swiglu"),
        "masked_softmax_fusion": False,
        "apply_rope_fusion": False,  # the fused rope kernel is Transformer Engine's
        "gradient_accumulation_fusion": False,  # needs apex / TE's fused wgrad kernel
        "persist_layer_norm": False,
        "variable_seq_lengths": True,  # packs have different lengths (dynamic batching)
        # megatron-core refuses variable lengths with its default allgather dispatcher, even for
        # dense models; alltoall is also what the MoE specs ask for.
        "moe_token_dispatcher_type": str(flags.get("moe_token_dispatcher_type", "alltoall")),
    }
    if is_moe(flags):
        kw["num_moe_experts"] = flag_int(flags, "num_experts")
        kw["moe_layer_freq"] = parse_layer_pattern(flags.get("moe_layer_freq", 1), num_layers)
        for key, conv in (("moe_router_topk", flag_int), ("moe_ffn_hidden_size", flag_int),
                          ("moe_shared_expert_intermediate_size", flag_int), ("moe_router_topk_scaling_factor", flag_float),
                          ("moe_router_num_groups", flag_int), ("moe_router_group_topk", flag_int),
                          ("moe_aux_loss_coeff", flag_float), ("moe_router_bias_update_rate", flag_float)):
            if key in flags:
                kw[key] = conv(flags, key)
        # Routing in fp32 (the HF models route in fp32) and no auxiliary balancing loss in RL unless
        # the spec asks: both change which experts a token meets.
        kw["moe_router_dtype"] = "fp32"
        kw["moe_router_load_balancing_type"] = "none"
        for key in ("moe_router_score_function", "moe_router_load_balancing_type",
                    "moe_router_dtype"):
            if key in flags:
                kw[key] = str(flags[key])
        for key in ("moe_router_enable_expert_bias", "moe_grouped_gemm", "moe_permute_fusion"):
            if key in flags:
                kw[key] = flag_bool(flags, key)
    if builds_mtp(flags):
        # megatron-core's MTP block (layers.mtp_block_spec). Its loss trains the MTP layer only
        # (detached heads: the policy's hidden states, embedding and output layer get no gradient
        # from it), and only with --enable-mtp-training; the trainer skips the block otherwise.
        kw["mtp_num_layers"] = flag_int(flags, "mtp_num_layers")
        kw["mtp_loss_scaling_factor"] = flag_float(flags, "mtp_loss_scaling_factor", MTP_LOSS_SCALING_DEFAULT)
        kw["mtp_detach_heads"] = True
    if is_hybrid(flags):
        # Gated DeltaNet layers between full-attention layers: megatron-core's own GatedDeltaNet,
        # placed by the per-layer pattern (a list, so dist-checkpointing treats the layers as
        # non-homogeneous and the pattern is explicit, whatever the spec's shorthand).
        _require(flags, "linear_attention_freq", "linear_conv_kernel_dim", "linear_key_head_dim",
                 "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads")
        kw["experimental_attention_variant"] = linear_attention_variant(flags)
        kw["linear_attention_freq"] = list(expand_layer_pattern(flags["linear_attention_freq"], num_layers,
                                                                "--linear-attention-freq"))
        for key in ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
                    "linear_num_key_heads", "linear_num_value_heads"):
            kw[key] = flag_int(flags, key)
    if flag_bool(flags, "enable_dsa_indexer"):
        # GLM-5's sparse attention: megatron-core's DSA indexer on absorbed MLA. The published
        # indexer scores with ReLU, ropes its first dims interleaved and has no Hadamard rotation;
        # its key norm is a LayerNorm with eps 1e-6. No indexer loss in RL (the indexer is not
        # trained by the policy loss, as in the reference recipes), no fused kernels.
        _require(flags, "multi_latent_attention", "index_n_heads", "index_head_dim", "index_topk")
        kw["experimental_attention_variant"] = "dsa"
        kw["dsa_indexer_n_heads"] = flag_int(flags, "index_n_heads")
        kw["dsa_indexer_head_dim"] = flag_int(flags, "index_head_dim")
        kw["dsa_indexer_topk"] = flag_int(flags, "index_topk")
        kw["dsa_indexer_topk_freq"] = flag_int(flags, "index_topk_freq", 1)
        kw["dsa_indexer_skip_topk_offset"] = flag_int(flags, "index_skip_topk_offset", 0)
        kw["dsa_indexer_rope_interleaved"] = True
        kw["dsa_indexer_rotate_activation"] = False
        kw["dsa_indexer_scoring_relu"] = True
        kw["dsa_indexer_k_norm_epsilon"] = 1e-6
        kw["dsa_kernel_backend"] = "none"
    if is_mla(flags):
        _require(flags, "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
        kw["q_lora_rank"] = flag_int(flags, "q_lora_rank")  # None: no q compression
        for key in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"):
            kw[key] = flag_int(flags, key)
        kw["rotary_base"] = flag_float(flags, "rotary_base", 10000.0)
        kw["rotary_percent"] = flag_float(flags, "rotary_percent", 1.0)
        if "rotary_scaling_factor" in flags:
            kw["rope_type"] = "yarn"
            kw["rotary_scaling_factor"] = flag_float(flags, "rotary_scaling_factor")
        else:  # MLATransformerConfig defaults to YaRN x40; a spec without a factor means plain rope
            kw["rope_type"] = "rope"
            kw["rotary_scaling_factor"] = 1.0
        for key in ("mscale", "mscale_all_dim"):
            if key in flags:
                kw[key] = flag_float(flags, key)
    kw.update(parallel_kwargs(parallel or {}))
    kw.update(recompute_kwargs(parallel or {}))
    return kw


def gpt_model_kwargs(flags: Mapping[str, Any], tp: int = 1) -> dict[str, Any]:
    """kwargs for ``GPTModel`` besides config and layer spec."""
    pos = str(flags.get("position_embedding_type", "rope" if flag_bool(flags, "use_rotary_position_embeddings") else "learned_absolute"))
    if is_mla(flags):
        pos = "none"  # MLA applies its own (YaRN) rotary inside the attention
    return {
        "vocab_size": padded_vocab_size(flags, tp),
        "max_sequence_length": flag_int(flags, "max_position_embeddings", flag_int(flags, "seq_length", 4096)),
        "position_embedding_type": pos,
        "rotary_percent": flag_float(flags, "rotary_percent", 1.0),
        "rotary_base": int(flag_float(flags, "rotary_base", 10000.0)),
        "share_embeddings_and_output_weights": not flag_bool(flags, "untie_embeddings_and_output_weights"),
    }


def layer_spec_kwargs(flags: Mapping[str, Any]) -> dict[str, Any]:
    """kwargs for megatron-core's ``get_gpt_layer_local_spec``."""
    return {
        "num_experts": flag_int(flags, "num_experts") if is_moe(flags) else None,
        "moe_grouped_gemm": flag_bool(flags, "moe_grouped_gemm"),
        "qk_layernorm": flag_bool(flags, "qk_layernorm"),
        "multi_latent_attention": is_mla(flags),
        "normalization": str(flags.get("normalization", "LayerNorm")),
    }


# --- parallelism, recomputation, optimizer (training flags, not the model spec) -----------------


def parallel_kwargs(megatron: Mapping[str, Any]) -> dict[str, Any]:
    kw: dict[str, Any] = {
        "tensor_model_parallel_size": flag_int(megatron, "tensor_model_parallel_size", 1),
        "pipeline_model_parallel_size": flag_int(megatron, "pipeline_model_parallel_size", 1),
        "context_parallel_size": flag_int(megatron, "context_parallel_size", 1),
        "expert_model_parallel_size": flag_int(megatron, "expert_model_parallel_size", 1),
        "sequence_parallel": flag_bool(megatron, "sequence_parallel"),
    }
    etp = flag_int(megatron, "expert_tensor_parallel_size")
    if etp is not None:
        kw["expert_tensor_parallel_size"] = etp
    vpp = flag_int(megatron, "virtual_pipeline_model_parallel_size")
    if vpp is not None:
        kw["virtual_pipeline_model_parallel_size"] = vpp
    for flag, key in (("decoder_first_pipeline_num_layers", "num_layers_in_first_pipeline_stage"),
                      ("decoder_last_pipeline_num_layers", "num_layers_in_last_pipeline_stage")):
        if flag in megatron:
            kw[key] = flag_int(megatron, flag)
    if kw["tensor_model_parallel_size"] == 1:
        kw["sequence_parallel"] = False  # meaningless without TP; megatron-core asserts on it
    return kw


def recompute_kwargs(megatron: Mapping[str, Any]) -> dict[str, Any]:
    gran = megatron.get("recompute_granularity")
    if gran in (None, False, "none"):
        return {}
    if gran not in ("full", "selective"):
        raise ModelArgsError(_S("recompute", granularity=gran))
    kw: dict[str, Any] = {"recompute_granularity": gran}
    if gran == "full":
        kw["recompute_method"] = str(megatron.get("recompute_method", "uniform"))
        kw["recompute_num_layers"] = flag_int(megatron, "recompute_num_layers", 1)
    return kw


def optimizer_kwargs(megatron: Mapping[str, Any], optim: Any) -> dict[str, Any]:
    """kwargs for megatron-core's ``OptimizerConfig`` from the runtime's OptimConfig + flags.

    The distributed optimizer (fp32 main weights and Adam states sharded over data-parallel
    ranks) is on by default, as in the reference recipes; ``use_distributed_optimizer: False`` in
    the flag dict turns it off. ``--optimizer-cpu-offload`` keeps Adam's states and step on the
    CPU (the whole fraction unless ``--optimizer-offload-fraction`` says otherwise) with the
    distributed optimizer's fp32 main shards (these are leaf tensors only when every model
    parameter is bf16/fp16, which the trainer ensures: fp32 norm weights reach the optimizer as
    non-leaf views, "can't optimize a non-leaf Tensor"). ``--use-precision-aware-optimizer`` is
    passed through only when given.
    """
    offload = flag_bool(megatron, "optimizer_cpu_offload")
    distributed = megatron.get("use_distributed_optimizer", True) not in (False, "false", "False", "0")
    kw = {
        "optimizer": str(megatron.get("optimizer", "adam")),
        "lr": float(getattr(optim, "lr", 1e-6)),
        "min_lr": flag_float(megatron, "min_lr", 0.0),
        "weight_decay": float(getattr(optim, "weight_decay", 0.0)),
        "adam_beta1": float(getattr(optim, "adam_beta1", 0.9)),
        "adam_beta2": float(getattr(optim, "adam_beta2", 0.98)),
        "adam_eps": float(getattr(optim, "adam_eps", 1e-8)),
        "clip_grad": float(getattr(optim, "clip_grad", 1.0)),
        "bf16": not flag_bool(megatron, "fp16"),
        "fp16": flag_bool(megatron, "fp16"),
        "params_dtype": "float16" if flag_bool(megatron, "fp16") else "bfloat16",
        "use_distributed_optimizer": distributed or offload,
        "optimizer_cpu_offload": offload,
        "optimizer_offload_fraction": flag_float(megatron, "optimizer_offload_fraction", 1.0 if offload else 0.0),
        "overlap_cpu_optimizer_d2h_h2d": flag_bool(megatron, "overlap_cpu_optimizer_d2h_h2d"),
        "use_precision_aware_optimizer": flag_bool(megatron, "use_precision_aware_optimizer"),
    }
    return kw


# --- config.json agreement ---------------------------------------------------------------------


def hf_config_mismatches(flags: Mapping[str, Any], hf_config: Mapping[str, Any]) -> list[str]:
    """Every structural field where config.json and the spec disagree, one line each (empty: agree)."""
    from slime.model_spec import compare_lines

    return compare_lines(flags, hf_config)


def check_hf_config(flags: Mapping[str, Any], hf_dir: str | Path) -> dict[str, Any]:
    """Refuse a checkpoint whose config.json disagrees with the spec (before any weight is read)."""
    from slime.model_spec import check_config_file

    return check_config_file(flags, hf_dir)
