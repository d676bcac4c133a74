"""MODEL_ARGS (``scripts/models/*.sh``) and Megatron pass-through flags -> megatron-core kwargs.

Pure Python: nothing here imports torch or megatron-core, so the mapping is unit-tested on a CPU
machine (tests/runtime/test_megatron_cpu_parts.py) and the conversion tool can refuse a mismatched
checkpoint before any library or weight is loaded.

Flags use the key convention of ``slime.args`` (``--num-query-groups 2`` -> ``num_query_groups:
"2"``, a switch -> ``True``), so ``cfg.megatron`` (the pass-through dict the runtime parser fills
from ``${MODEL_ARGS[@]}``) and a spec file read here give the same dict.

The spec file is read WITHOUT running bash, like the lab does: the text of ``MODEL_ARGS=( ... )``
is tokenized with shlex. The runtime never imports the lab (architecture.md), hence this reader.
"""

from __future__ import annotations

import ast
import json
import math
import re
import shlex
from pathlib import Path
from typing import Any, Mapping, Sequence


class ModelArgsError(ValueError):
    """A spec flag is malformed, or asks for something this backend cannot build."""


class ConfigMismatchError(ValueError):
    """The checkpoint's config.json disagrees with the model spec (message names every field)."""


# --- reading -----------------------------------------------------------------------------------

_ARRAY_RE = re.compile(r"^\s*MODEL_ARGS=\(", re.M)


def read_model_args(path: str | Path) -> list[str]:
    """The tokens of the ``MODEL_ARGS=( ... )`` array in a spec file (comments dropped)."""
    return model_args_from_text(Path(path).read_text(), str(path))


def model_args_from_text(text: str, path: str = "spec") -> list[str]:
    """The one reader of spec files: the runtime and the lab (lab/model_spec.py) both use it."""
    m = _ARRAY_RE.search(text)
    if not m:
        raise ModelArgsError(f"{path}: no MODEL_ARGS=( ... ) array")
    lexer = shlex.shlex(text[m.end():], posix=True, punctuation_chars="()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    tokens: list[str] = []
    for tok in lexer:
        if tok == ")":
            return tokens
        if "$" in tok:
            raise ModelArgsError(f"{path}: {tok!r} uses a shell variable; spec files must be literal")
        tokens.append(tok)
    raise ModelArgsError(f"{path}: MODEL_ARGS=( is never closed")


def flags_from_argv(argv: Sequence[str]) -> dict[str, Any]:
    """``['--num-layers', '2', '--swiglu', '--spec', 'mod', 'fn']`` ->
    ``{'num_layers': '2', 'swiglu': True, 'spec': ['mod', 'fn']}``: a bare flag is True, one value a
    string, several values (Megatron's nargs flags such as --spec) a list."""
    flags: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        tok = argv[i]
        if not tok.startswith("--"):
            raise ModelArgsError(f"unexpected value {tok!r} (no flag takes it)")
        name, eq, val = tok[2:].partition("=")
        key = name.replace("-", "_")
        i += 1
        if eq:
            flags[key] = val
            continue
        values = []
        while i < len(argv) and not argv[i].startswith("--"):
            values.append(argv[i])
            i += 1
        flags[key] = True if not values else values[0] if len(values) == 1 else values
    return flags


def load_flags(spec: str | Path | Sequence[str] | Mapping[str, Any]) -> dict[str, Any]:
    """A spec file path, an argv list or an already-parsed flag dict -> flag dict."""
    if isinstance(spec, Mapping):
        return dict(spec)
    if isinstance(spec, (str, Path)):
        return flags_from_argv(read_model_args(spec))
    return flags_from_argv(list(spec))


# --- typed accessors ---------------------------------------------------------------------------


def _int(flags: Mapping[str, Any], key: str, default: int | None = None) -> int | None:
    v = flags.get(key)
    if v is None or v is False:
        return default
    try:
        return int(v)
    except (TypeError, ValueError):
        raise ModelArgsError(f"--{key.replace('_', '-')} {v!r} is not an integer") from None


def _float(flags: Mapping[str, Any], key: str, default: float | None = None) -> float | None:
    v = flags.get(key)
    if v is None or v is False:
        return default
    try:
        return float(v)
    except (TypeError, ValueError):
        raise ModelArgsError(f"--{key.replace('_', '-')} {v!r} is not a number") from None


def _bool(flags: Mapping[str, Any], key: str) -> bool:
    v = flags.get(key, False)
    if isinstance(v, str):
        return v.lower() not in ("0", "false", "no", "")
    return bool(v)


def _require(flags: Mapping[str, Any], *keys: str) -> None:
    missing = [k for k in keys if flags.get(k) in (None, False)]
    if missing:
        raise ModelArgsError("the model spec lacks " + ", ".join("--" + k.replace("_", "-") for k in missing))


def parse_layer_pattern(value: Any, num_layers: int) -> list[int] | int:
    """``--moe-layer-freq``: an int (every k-th layer is MoE) or ``"[0]*3+[1]*58"`` / a list.

    Evaluated without ``eval``: ``[a, b]*n`` terms joined by ``+``.
    """
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if re.fullmatch(r"\d+", text):
        return int(text)
    out: list[int] = []
    for term in text.split("+"):
        m = re.fullmatch(r"\s*(\[[^\]]*\])\s*(?:\*\s*(\d+))?\s*", term)
        if not m:
            raise ModelArgsError(f"--moe-layer-freq {text!r}: expected terms like [0]*3+[1]*58")
        items = ast.literal_eval(m.group(1))
        out.extend([int(x) for x in items] * int(m.group(2) or 1))
    if len(out) != num_layers:
        raise ModelArgsError(f"--moe-layer-freq {text!r} describes {len(out)} layers, the spec has {num_layers}")
    return out


# --- what this backend builds ------------------------------------------------------------------

# Flags the spec files use that megatron-core's GPTModel cannot express without a custom layer
# spec (GLM-4's extra post-norms, Qwen3.5's Gated DeltaNet layers). Refused with the reason rather
# than silently building a different network.
UNSUPPORTED = {
    "post_self_attn_layernorm": "GLM-4's post-attention sandwich norm needs a custom layer spec",
    "post_mlp_layernorm": "GLM-4's post-MLP sandwich norm needs a custom layer spec",
    "hybrid_linear_attention": "Gated DeltaNet layers need flash-linear-attention and a hybrid spec",
    "enable_dsa_indexer": "DeepSeek sparse attention (the DSA indexer) needs its own attention spec",
}


def unsupported_flags(flags: Mapping[str, Any]) -> list[str]:
    return [f"--{k.replace('_', '-')}: {why}" for k, why in UNSUPPORTED.items() if _bool(flags, k)]


def is_moe(flags: Mapping[str, Any]) -> bool:
    return (_int(flags, "num_experts", 0) or 0) > 0


def is_mla(flags: Mapping[str, Any]) -> bool:
    return _bool(flags, "multi_latent_attention")


def num_query_groups(flags: Mapping[str, Any]) -> int:
    heads = _int(flags, "num_attention_heads")
    if _bool(flags, "group_query_attention") or "num_query_groups" in flags:
        return _int(flags, "num_query_groups", heads)
    return heads


def kv_channels(flags: Mapping[str, Any]) -> int:
    return _int(flags, "kv_channels") or _int(flags, "hidden_size") // _int(flags, "num_attention_heads")


def padded_vocab_size(flags: Mapping[str, Any], tp: int = 1) -> int:
    """Megatron pads the vocabulary to a multiple of ``make_vocab_size_divisible_by * tp``.

    The padded rows are zeros on conversion, dropped on export, and masked out of the softmax by
    the trainer, so log-probs equal the HF model's.
    """
    vocab = _int(flags, "vocab_size")
    if vocab is None:
        raise ModelArgsError("the model spec lacks --vocab-size")
    div = (_int(flags, "make_vocab_size_divisible_by", 128) or 1) * tp
    return int(math.ceil(vocab / div) * div)


def transformer_config_kwargs(flags: Mapping[str, Any], parallel: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """kwargs for ``TransformerConfig`` (or ``MLATransformerConfig`` when ``is_mla``).

    Values that are callables in megatron-core (the activation) are given by name here
    (``activation_func: 'silu'``) and resolved by :func:`slime.backends.megatron.model.make_config`,
    so this stays importable without torch.
    """
    bad = unsupported_flags(flags)
    if bad:
        raise ModelArgsError("this Megatron backend cannot build the spec: " + "; ".join(bad))
    _require(flags, "num_layers", "hidden_size", "num_attention_heads")
    num_layers = _int(flags, "num_layers")
    hidden = _int(flags, "hidden_size")
    kw: dict[str, Any] = {
        "num_layers": num_layers,
        "hidden_size": hidden,
        "ffn_hidden_size": _int(flags, "ffn_hidden_size", 4 * hidden),
        "num_attention_heads": _int(flags, "num_attention_heads"),
        "num_query_groups": num_query_groups(flags),
        "kv_channels": kv_channels(flags),
        "normalization": str(flags.get("normalization", "LayerNorm")),
        "layernorm_epsilon": _float(flags, "norm_epsilon", 1e-5),
        "layernorm_zero_centered_gamma": _bool(flags, "apply_layernorm_1p"),
        "gated_linear_unit": _bool(flags, "swiglu"),
        "activation_func": "silu" if _bool(flags, "swiglu") else "gelu",
        "add_bias_linear": not _bool(flags, "disable_bias_linear"),
        "add_qkv_bias": _bool(flags, "add_qkv_bias") or not _bool(flags, "disable_bias_linear"),
        "qk_layernorm": _bool(flags, "qk_layernorm"),
        "attention_output_gate": _bool(flags, "attention_output_gate"),
        "rotary_interleaved": _bool(flags, "rotary_interleaved"),
        # RL fine-tuning runs without dropout unless the spec asks for it (Megatron-LM's 0.1
        # default would make the train/rollout log-probs disagree by construction).
        "attention_dropout": _float(flags, "attention_dropout", 0.0),
        "hidden_dropout": _float(flags, "hidden_dropout", 0.0),
        "attention_softmax_in_fp32": True,
        "bf16": not _bool(flags, "fp16"),
        "fp16": _bool(flags, "fp16"),
        "params_dtype": "float16" if _bool(flags, "fp16") else "bfloat16",
        "bias_activation_fusion": _bool(flags, "swiglu"),
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
        kw["num_moe_experts"] = _int(flags, "num_experts")
        kw["moe_layer_freq"] = parse_layer_pattern(flags.get("moe_layer_freq", 1), num_layers)
        for key, conv in (("moe_router_topk", _int), ("moe_ffn_hidden_size", _int),
                          ("moe_shared_expert_intermediate_size", _int), ("moe_router_topk_scaling_factor", _float),
                          ("moe_router_num_groups", _int), ("moe_router_group_topk", _int),
                          ("moe_aux_loss_coeff", _float), ("moe_router_bias_update_rate", _float)):
            if key in flags:
                kw[key] = conv(flags, key)
        for key in ("moe_router_score_function", "moe_router_load_balancing_type",
                    "moe_router_dtype"):
            if key in flags:
                kw[key] = str(flags[key])
        for key in ("moe_router_enable_expert_bias", "moe_grouped_gemm", "moe_permute_fusion"):
            if key in flags:
                kw[key] = _bool(flags, key)
    if "mtp_num_layers" in flags:
        kw["mtp_num_layers"] = _int(flags, "mtp_num_layers")
    if is_mla(flags):
        _require(flags, "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
        kw["q_lora_rank"] = _int(flags, "q_lora_rank")  # None: no q compression
        for key in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"):
            kw[key] = _int(flags, key)
        kw["rotary_base"] = _float(flags, "rotary_base", 10000.0)
        kw["rotary_percent"] = _float(flags, "rotary_percent", 1.0)
        if "rotary_scaling_factor" in flags:
            kw["rope_type"] = "yarn"
            kw["rotary_scaling_factor"] = _float(flags, "rotary_scaling_factor")
        for key in ("mscale", "mscale_all_dim"):
            if key in flags:
                kw[key] = _float(flags, key)
    kw.update(parallel_kwargs(parallel or {}))
    kw.update(recompute_kwargs(parallel or {}))
    return kw


def gpt_model_kwargs(flags: Mapping[str, Any], tp: int = 1) -> dict[str, Any]:
    """kwargs for ``GPTModel`` besides config and layer spec."""
    pos = str(flags.get("position_embedding_type", "rope" if _bool(flags, "use_rotary_position_embeddings") else "learned_absolute"))
    if is_mla(flags):
        pos = "none"  # MLA applies its own (YaRN) rotary inside the attention
    return {
        "vocab_size": padded_vocab_size(flags, tp),
        "max_sequence_length": _int(flags, "max_position_embeddings", _int(flags, "seq_length", 4096)),
        "position_embedding_type": pos,
        "rotary_percent": _float(flags, "rotary_percent", 1.0),
        "rotary_base": int(_float(flags, "rotary_base", 10000.0)),
        "share_embeddings_and_output_weights": not _bool(flags, "untie_embeddings_and_output_weights"),
    }


def layer_spec_kwargs(flags: Mapping[str, Any]) -> dict[str, Any]:
    """kwargs for megatron-core's ``get_gpt_layer_local_spec``."""
    return {
        "num_experts": _int(flags, "num_experts") if is_moe(flags) else None,
        "moe_grouped_gemm": _bool(flags, "moe_grouped_gemm"),
        "qk_layernorm": _bool(flags, "qk_layernorm"),
        "multi_latent_attention": is_mla(flags),
        "normalization": str(flags.get("normalization", "LayerNorm")),
    }


# --- parallelism, recomputation, optimizer (training flags, not the model spec) -----------------


def parallel_kwargs(megatron: Mapping[str, Any]) -> dict[str, Any]:
    kw = {
        "tensor_model_parallel_size": _int(megatron, "tensor_model_parallel_size", 1),
        "pipeline_model_parallel_size": _int(megatron, "pipeline_model_parallel_size", 1),
        "context_parallel_size": _int(megatron, "context_parallel_size", 1),
        "expert_model_parallel_size": _int(megatron, "expert_model_parallel_size", 1),
        "sequence_parallel": _bool(megatron, "sequence_parallel"),
    }
    etp = _int(megatron, "expert_tensor_parallel_size")
    if etp is not None:
        kw["expert_tensor_parallel_size"] = etp
    vpp = _int(megatron, "virtual_pipeline_model_parallel_size")
    if vpp is not None:
        kw["virtual_pipeline_model_parallel_size"] = vpp
    for flag, key in (("decoder_first_pipeline_num_layers", "num_layers_in_first_pipeline_stage"),
                      ("decoder_last_pipeline_num_layers", "num_layers_in_last_pipeline_stage")):
        if flag in megatron:
            kw[key] = _int(megatron, flag)
    if kw["tensor_model_parallel_size"] == 1:
        kw["sequence_parallel"] = False  # meaningless without TP; megatron-core asserts on it
    return kw


def recompute_kwargs(megatron: Mapping[str, Any]) -> dict[str, Any]:
    gran = megatron.get("recompute_granularity")
    if gran in (None, False, "none"):
        return {}
    if gran not in ("full", "selective"):
        raise ModelArgsError(f"--recompute-granularity {gran!r}: expected full or selective")
    kw: dict[str, Any] = {"recompute_granularity": gran}
    if gran == "full":
        kw["recompute_method"] = str(megatron.get("recompute_method", "uniform"))
        kw["recompute_num_layers"] = _int(megatron, "recompute_num_layers", 1)
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
    offload = _bool(megatron, "optimizer_cpu_offload")
    distributed = megatron.get("use_distributed_optimizer", True) not in (False, "false", "False", "0")
    kw = {
        "optimizer": str(megatron.get("optimizer", "adam")),
        "lr": float(getattr(optim, "lr", 1e-6)),
        "min_lr": _float(megatron, "min_lr", 0.0),
        "weight_decay": float(getattr(optim, "weight_decay", 0.0)),
        "adam_beta1": float(getattr(optim, "adam_beta1", 0.9)),
        "adam_beta2": float(getattr(optim, "adam_beta2", 0.98)),
        "adam_eps": float(getattr(optim, "adam_eps", 1e-8)),
        "clip_grad": float(getattr(optim, "clip_grad", 1.0)),
        "bf16": not _bool(megatron, "fp16"),
        "fp16": _bool(megatron, "fp16"),
        "params_dtype": "float16" if _bool(megatron, "fp16") else "bfloat16",
        "use_distributed_optimizer": distributed or offload,
        "optimizer_cpu_offload": offload,
        "optimizer_offload_fraction": _float(megatron, "optimizer_offload_fraction", 1.0 if offload else 0.0),
        "overlap_cpu_optimizer_d2h_h2d": _bool(megatron, "overlap_cpu_optimizer_d2h_h2d"),
        "use_precision_aware_optimizer": _bool(megatron, "use_precision_aware_optimizer"),
    }
    return kw


# --- config.json agreement ---------------------------------------------------------------------


def _rope_theta(hf: Mapping[str, Any]) -> float | None:
    if "rope_theta" in hf:
        return float(hf["rope_theta"])
    rp = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if isinstance(rp, Mapping) and "rope_theta" in rp:
        return float(rp["rope_theta"])
    return None


def expected_hf_fields(flags: Mapping[str, Any]) -> list[tuple[str, str, Any, Any]]:
    """(config.json key, spec flag, expected value, comparison kind) for every checkable field."""
    out: list[tuple[str, str, Any, Any]] = [
        ("num_hidden_layers", "--num-layers", _int(flags, "num_layers"), "eq"),
        ("hidden_size", "--hidden-size", _int(flags, "hidden_size"), "eq"),
        ("num_attention_heads", "--num-attention-heads", _int(flags, "num_attention_heads"), "eq"),
        ("vocab_size", "--vocab-size", _int(flags, "vocab_size"), "eq"),
        ("rms_norm_eps", "--norm-epsilon", _float(flags, "norm_epsilon"), "float"),
        ("rope_theta", "--rotary-base", _float(flags, "rotary_base", 10000.0), "float"),
        ("tie_word_embeddings", "--untie-embeddings-and-output-weights",
         not _bool(flags, "untie_embeddings_and_output_weights"), "bool"),
    ]
    if not is_mla(flags):
        out += [("num_key_value_heads", "--num-query-groups", num_query_groups(flags), "eq"),
                ("head_dim", "--kv-channels", kv_channels(flags), "eq")]
    if is_moe(flags):
        out += [("intermediate_size", "--ffn-hidden-size", _int(flags, "ffn_hidden_size"), "eq"),
                ("n_routed_experts|num_experts", "--num-experts", _int(flags, "num_experts"), "eq"),
                ("num_experts_per_tok", "--moe-router-topk", _int(flags, "moe_router_topk"), "eq"),
                ("moe_intermediate_size", "--moe-ffn-hidden-size", _int(flags, "moe_ffn_hidden_size"), "eq")]
    else:
        out.append(("intermediate_size", "--ffn-hidden-size", _int(flags, "ffn_hidden_size"), "eq"))
    if is_mla(flags):
        out += [("q_lora_rank", "--q-lora-rank", _int(flags, "q_lora_rank"), "eq"),
                ("kv_lora_rank", "--kv-lora-rank", _int(flags, "kv_lora_rank"), "eq"),
                ("qk_nope_head_dim", "--qk-head-dim", _int(flags, "qk_head_dim"), "eq"),
                ("qk_rope_head_dim", "--qk-pos-emb-head-dim", _int(flags, "qk_pos_emb_head_dim"), "eq"),
                ("v_head_dim", "--v-head-dim", _int(flags, "v_head_dim"), "eq")]
    return out


def _hf_value(hf: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    for k in key.split("|"):
        if k == "rope_theta":
            v = _rope_theta(hf)
            if v is not None:
                return True, v
        elif k == "head_dim":
            if hf.get("head_dim") is not None:
                return True, hf["head_dim"]
            if "hidden_size" in hf and "num_attention_heads" in hf:  # HF's default head size
                return True, int(hf["hidden_size"]) // int(hf["num_attention_heads"])
        elif k == "tie_word_embeddings":
            return True, bool(hf.get(k, False))  # the HF default when absent is model-specific;
        elif k in hf and hf[k] is not None:
            return True, hf[k]
    return False, None


def hf_config_mismatches(flags: Mapping[str, Any], hf_config: Mapping[str, Any]) -> list[str]:
    """Every field where config.json and the spec disagree, as readable lines (empty: agree).

    Fields absent from config.json are skipped (not every architecture has every key); the
    QKV-bias switch is checked against ``attention_bias`` or, for qwen2, the family's fixed bias.
    """
    lines: list[str] = []
    text = hf_config.get("text_config") if isinstance(hf_config.get("text_config"), Mapping) else None
    hf = {**hf_config, **(text or {})}
    for key, flag, want, kind in expected_hf_fields(flags):
        if want is None:
            continue
        found, got = _hf_value(hf, key)
        if not found:
            continue
        if kind == "float":
            same = math.isclose(float(got), float(want), rel_tol=1e-9, abs_tol=0.0)
        elif kind == "bool":
            same = bool(got) == bool(want)
        else:
            same = int(got) == int(want)
        if not same:
            flag_txt = flag if kind != "bool" else f"{flag} ({'absent' if want else 'given'})"
            lines.append(f"{key.split('|')[0]} = {got!r} in config.json, but the spec says {flag_txt} {want!r}")
    model_type = str(hf.get("model_type", ""))
    spec_bias = _bool(flags, "add_qkv_bias")
    hf_bias = True if model_type == "qwen2" else hf.get("attention_bias")
    if hf_bias is not None and bool(hf_bias) != spec_bias:
        lines.append(f"QKV bias is {'on' if hf_bias else 'off'} in config.json ({model_type or 'attention_bias'}), "
                     f"but the spec {'has' if spec_bias else 'lacks'} --add-qkv-bias")
    return lines


def check_hf_config(flags: Mapping[str, Any], hf_dir: str | Path) -> dict[str, Any]:
    """Read ``hf_dir/config.json`` and raise :class:`ConfigMismatchError` on any disagreement.

    Called by conversion and by the trainer BEFORE any weight is read or moved.
    """
    path = Path(hf_dir) / "config.json"
    if not path.exists():
        raise ConfigMismatchError(f"{path} not found: cannot check the checkpoint against the model spec")
    hf = json.loads(path.read_text())
    bad = hf_config_mismatches(flags, hf)
    if bad:
        raise ConfigMismatchError(
            f"refusing {hf_dir}: its config.json disagrees with the model spec (MODEL_ARGS) in "
            f"{len(bad)} field(s):\n  - " + "\n  - ".join(bad)
            + "\nFix the spec file (scripts/models/*.sh) or point at the matching checkpoint; no weights were read."
        )
    return hf
