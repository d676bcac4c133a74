"""What the embedded torch backends can honour, checked before Ray reserves anything.

The embedded trainer is one HF model per data-parallel rank (DDP); the embedded engine is one HF
model per engine. Neither shards a model, so model-parallel flags meant for Megatron / SGLang are
refused here with the reason, instead of being silently ignored. Each trainer backend declares
its own checks in slime/backends/registry.py (the Megatron backend's live in
slime/backends/megatron/capabilities.py); the registry asks the chosen one, then the rollout
engines' checks here (rollout_engine_errors).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slime.refusals import declare

_R = declare("embedded", {
    "sglang_missing": (),
    "engine_r3": (),
    "engine_offload": (),
    "engine_groups": (),
    "engine_pd_router": (),
    "engine_group_size": ("worker_type", "size"),
    "engine_pd_backend": ("backend",),
    "engine_pd_model": ("path", "model_type"),
    "engine_size": ("size",),
    "engine_parallel": ("flag", "value"),
    "engine_semantic": ("flag",),
    "trainer_parallel": ("flag", "value"),
    "trainer_cpu_adam": (),
    "trainer_offload": (),
    "trainer_routing_replay": (),
    "trainer_r3": (),
    "trainer_optimizer": ("optimizer",),
    "trainer_megatron_flag": ("flag",),
})

_PARALLEL = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
             "expert_model_parallel_size", "expert_tensor_parallel_size",
             "virtual_pipeline_model_parallel_size")
_SGLANG_PARALLEL = ("tp_size", "tensor_parallel_size", "pp_size", "dp_size", "data_parallel_size",
                    "ep_size", "expert_parallel_size", "ep")
# SGLang flags that change what is sampled: the embedded engine cannot emulate them.
_SGLANG_SEMANTIC = ("speculative_algorithm", "kv_cache_dtype", "quantization", "enable_dp_attention",
                    "disaggregation_mode", "enable_return_routed_experts")

# How the embedded trainer reads the Megatron flags it may be given (cfg.megatron). Every flag
# is in one of these, or refused by embedded_megatron_flag_errors() naming it (tests walk the
# parser against this: tests/runtime/test_flags_read_or_refused.py).
# - the LR schedule: read into OptimConfig (slime/args.py) and run by slime/training/lr_schedule.py;
EMBEDDED_READS_LR = ("lr_decay_style", "min_lr", "lr_warmup_iters", "lr_warmup_fraction", "lr_decay_iters")
# - model-spec flags (MODEL_ARGS): the embedded trainer loads the model --hf-checkpoint/config.json
#   describes, and these are compared with it before start (slime.backends.registry.model_flag_errors, PAR-7);
EMBEDDED_CHECKS_SPEC = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "group_query_attention",
    "num_query_groups", "kv_channels", "norm_epsilon", "rotary_base", "vocab_size",
    "untie_embeddings_and_output_weights", "add_qkv_bias", "num_experts", "moe_router_topk", "moe_ffn_hidden_size",
    "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
    "swiglu", "normalization", "position_embedding_type", "use_rotary_position_embeddings", "disable_bias_linear",
    "max_position_embeddings",
)
# - parallel sizes: 1 is what the embedded trainer does (data parallel only); > 1 is refused;
# - --optimizer adam: the embedded trainer's AdamW is Megatron's adam (decoupled weight decay).
_EMBEDDED_OK = (*EMBEDDED_READS_LR, *EMBEDDED_CHECKS_SPEC, *_PARALLEL, "optimizer")


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def rollout_engine_errors(cfg, environment: bool = True) -> list[str]:
    """What the rollout engine (--rollout-backend) cannot honour; environment=False: judge the
    flags only, not what this machine has installed."""
    e: list[str] = []
    c = cfg.cluster
    if environment and c.rollout_backend == "sglang" and not c.external:
        from slime.rollout.engines.sglang import sglang_available

        if not sglang_available():
            e.append(_R("sglang_missing"))
    if c.rollout_backend == "embedded" and not c.external and getattr(cfg.loss, "use_rollout_routing_replay", False):
        e.append(_R("engine_r3"))
    if c.rollout_backend == "embedded" and not c.external:
        if not c.colocate and c.offload_rollout:
            e.append(_R("engine_offload"))
        if c.sglang_config or c.prefill_num_servers:
            e.extend(_pd_group_errors(cfg))
        if c.rollout_num_gpus_per_engine != 1:
            e.append(_R("engine_size", size=c.rollout_num_gpus_per_engine))
        for k in _SGLANG_PARALLEL:
            v = _int(cfg.sglang.get(k, 1))
            if v is not None and v > 1:
                e.append(_R("engine_parallel", flag=f"--sglang-{k.replace('_', '-')}", value=v))
        for k in _SGLANG_SEMANTIC:
            if k in cfg.sglang:
                e.append(_R("engine_semantic", flag=f"--sglang-{k.replace('_', '-')}"))
    return e


PD_MODEL_TYPES = ("llama", "qwen2", "qwen3")  # slime/inference/decoder.py's fast path (_SUPPORTED)


def _pd_group_errors(cfg) -> list[str]:
    """Embedded engines take server groups for PD only (slime/rollout/engines/pd.py), behind sglang-router."""
    c = cfg.cluster
    e: list[str] = []
    if c.sglang_config:
        from slime.rollout.engines.sglang import TranslationError, load_server_groups

        try:
            groups = load_server_groups(c.sglang_config, cfg.model.hf_checkpoint)
        except TranslationError:  # unreadable, malformed or not written yet: the translation check names it
            groups = []
        if any(g.worker_type == "regular" for g in groups):
            return [_R("engine_groups")]
        e += [_R("engine_group_size", worker_type=g.worker_type, size=g.num_gpus_per_engine)
              for g in groups if g.num_gpus_per_engine != 1]
    else:
        groups = []
    for g in groups:
        backend = g.overrides.get("disaggregation_transfer_backend")
        if backend not in (None, "mooncake"):
            e.append(_R("engine_pd_backend", backend=backend))
    backend = cfg.sglang.get("disaggregation_transfer_backend")
    if backend not in (None, "mooncake"):
        e.append(_R("engine_pd_backend", backend=backend))
    path = Path(cfg.model.hf_checkpoint or "") / "config.json"
    if cfg.model.hf_checkpoint and path.exists():
        hf = json.loads(path.read_text())
        if hf.get("model_type") not in PD_MODEL_TYPES or hf.get("use_sliding_window"):
            e.append(_R("engine_pd_model", path=str(path), model_type=hf.get("model_type")))
    if not c.use_sglang_router:
        e.append(_R("engine_pd_router"))
    return e


def embedded_trainer_errors(cfg) -> list[str]:
    """--train-backend embedded: what one HF model per data-parallel rank cannot honour."""
    e: list[str] = []
    for k in _PARALLEL:
        v = _int(cfg.megatron.get(k, 1))
        if v is not None and v > 1:
            e.append(_R("trainer_parallel", flag=f"--{k.replace('_', '-')}", value=v))
    if cfg.megatron.get("optimizer_cpu_offload"):
        e.append(_R("trainer_cpu_adam"))
    e.extend(embedded_megatron_flag_errors({k: v for k, v in cfg.megatron.items() if k != "optimizer_cpu_offload"}))
    if not cfg.cluster.colocate and cfg.cluster.offload_train:
        e.append(_R("trainer_offload"))
    loss = cfg.loss
    if getattr(loss, "use_routing_replay", False):
        e.append(_R("trainer_routing_replay"))
    if getattr(loss, "use_rollout_routing_replay", False):
        e.append(_R("trainer_r3"))
    return e


def ignored_sglang_flags(cfg) -> list[str]:
    """Pass-through flags the embedded engine accepts but does not act on (printed as a notice)."""
    if cfg.cluster.rollout_backend != "embedded":
        return []
    flagged = set(_SGLANG_PARALLEL) | set(_SGLANG_SEMANTIC)
    if cfg.cluster.sglang_config or cfg.cluster.prefill_num_servers:  # PD engines read these (engines/pd.py)
        flagged |= {"disaggregation_transfer_backend", "disaggregation_ib_device"}
    return [f"--sglang-{k.replace('_', '-')}" for k in cfg.sglang if k not in flagged]


def embedded_megatron_flag_errors(megatron: dict) -> list[str]:
    """Megatron flags the embedded trainer neither reads nor checks: refused, each named."""
    e: list[str] = []
    opt = megatron.get("optimizer")
    if opt is not None and str(opt).lower() != "adam":
        e.append(_R("trainer_optimizer", optimizer=str(opt)))
    for key in megatron:
        if key in _EMBEDDED_OK:
            continue
        e.append(_R("trainer_megatron_flag", flag=f"--{key.replace('_', '-')}"))
    return e


def spec_extra_mismatches(megatron: dict, hf: dict) -> list[str]:
    """Spec flags the Megatron checker leaves to the model builder, checked here for the
    embedded trainer (which builds from config.json and would otherwise ignore them)."""
    flags = {k: v for k, v in megatron.items() if k in EMBEDDED_CHECKS_SPEC}
    lines = []
    act = str(hf.get("hidden_act", "")).lower()
    if "swiglu" in flags and act and act not in ("silu", "swish"):
        lines.append(f"hidden_act = {act!r} in config.json, but the spec says --swiglu")
    norm = flags.get("normalization")
    if norm is not None:
        has_rms = "rms_norm_eps" in hf
        if (str(norm) == "RMSNorm") != has_rms and ("layer_norm_eps" in hf or has_rms):
            lines.append(f"config.json has {'rms_norm_eps' if has_rms else 'layer_norm_eps'}, but the spec says "
                         f"--normalization {norm}")
    rope = [f for f in ("--position-embedding-type rope", "--use-rotary-position-embeddings")
            if (f.endswith("rope") and str(flags.get("position_embedding_type", "")) == "rope")
            or (f.endswith("embeddings") and flags.get("use_rotary_position_embeddings"))]
    if rope and "rope_theta" not in hf and not hf.get("rope_scaling") and not hf.get("rope_parameters"):
        lines.append(f"config.json has no rope_theta, but the spec says {rope[0]}")
    if flags.get("group_query_attention") and "num_key_value_heads" in hf \
            and hf.get("num_key_value_heads") == hf.get("num_attention_heads"):
        lines.append("config.json has as many KV heads as attention heads (no grouping), but the spec says "
                     "--group-query-attention")
    if flags.get("multi_latent_attention") and "kv_lora_rank" not in hf:
        lines.append("config.json has no kv_lora_rank, but the spec says --multi-latent-attention")
    experts = flags.get("num_experts")
    if experts not in (None, False, "0", 0) and not any(k in hf for k in ("n_routed_experts", "num_experts")):
        lines.append(f"config.json describes no experts, but the spec says --num-experts {experts}")
    if flags.get("disable_bias_linear") and hf.get("mlp_bias"):
        lines.append("mlp_bias = true in config.json, but the spec says --disable-bias-linear")
    mpe = flags.get("max_position_embeddings")
    if mpe is not None and "max_position_embeddings" in hf:
        try:
            if int(mpe) > int(hf["max_position_embeddings"]):
                lines.append(f"max_position_embeddings = {hf['max_position_embeddings']} in config.json, but the spec "
                             f"says --max-position-embeddings {mpe}")
        except (TypeError, ValueError):
            lines.append(f"--max-position-embeddings {mpe!r}: not an integer")
    return lines
