"""What the embedded torch backends can honour, checked before Ray reserves anything.

The embedded trainer is one HF model per data-parallel rank (DDP); the embedded engine is one HF
model per engine. Neither shards a model, so model-parallel flags meant for Megatron / SGLang are
refused here with the reason, instead of being silently ignored. Each trainer backend declares
its own checks in slime/backends/registry.py (the Megatron backend's live in
slime/backends/megatron/capabilities.py); backend_capability_errors asks the chosen one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_PARALLEL = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
             "expert_model_parallel_size", "expert_tensor_parallel_size",
             "virtual_pipeline_model_parallel_size")
_SGLANG_PARALLEL = ("tp_size", "tensor_parallel_size", "pp_size", "dp_size", "data_parallel_size",
                    "ep_size", "expert_parallel_size", "ep")
# SGLang flags that change what is sampled: the embedded engine cannot emulate them.
_SGLANG_SEMANTIC = ("speculative_algorithm", "kv_cache_dtype", "quantization", "enable_dp_attention",
                    "disaggregation_mode", "enable_return_routed_experts")

# Megatron model flags -> HF config.json keys (PAR-7: a model spec that disagrees with the
# checkpoint converts or loads silently wrong).
_MODEL_KEYS = {"num_layers": "num_hidden_layers", "hidden_size": "hidden_size",
               "ffn_hidden_size": "intermediate_size", "num_attention_heads": "num_attention_heads",
               "num_query_groups": "num_key_value_heads", "rotary_base": "rope_theta",
               "norm_epsilon": "rms_norm_eps"}


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def backend_capability_errors(cfg) -> list[str]:
    e: list[str] = []
    c = cfg.cluster
    from slime.backends.registry import capability_errors

    e.extend(capability_errors(cfg))
    if c.rollout_backend == "sglang" and not c.external:
        from slime.rollout.engines.sglang import sglang_available

        if not sglang_available():
            e.append("--rollout-backend sglang needs the optional [sglang] install and a GPU; "
                     "use --rollout-backend embedded on this machine")
    if c.rollout_backend == "embedded" and not c.external and getattr(cfg.loss, "use_rollout_routing_replay", False):
        e.append("--use-rollout-routing-replay (R3): the embedded engine returns no routed experts "
                 "(return_routed_experts); use --rollout-backend sglang with --sglang-enable-return-routed-experts")
    if c.rollout_backend == "embedded" and not c.external:
        if c.sglang_config or c.prefill_num_servers:
            e.append("--sglang-config / --prefill-num-servers: server groups and PD need --rollout-backend sglang")
        if c.rollout_num_gpus_per_engine != 1:
            e.append(f"--rollout-num-gpus-per-engine {c.rollout_num_gpus_per_engine}: an embedded engine "
                     f"serves one unshardable model copy; use 1")
        for k in _SGLANG_PARALLEL:
            v = _int(cfg.sglang.get(k, 1))
            if v is not None and v > 1:
                e.append(f"--sglang-{k.replace('_', '-')} {v}: the embedded engine has no model parallelism")
        for k in _SGLANG_SEMANTIC:
            if k in cfg.sglang:
                e.append(f"--sglang-{k.replace('_', '-')}: not supported by the embedded engine "
                         f"(it would change what is sampled); use --rollout-backend sglang")
    return e


def embedded_trainer_errors(cfg) -> list[str]:
    """--train-backend embedded: what one HF model per data-parallel rank cannot honour."""
    e: list[str] = []
    for k in _PARALLEL:
        v = _int(cfg.megatron.get(k, 1))
        if v is not None and v > 1:
            e.append(f"--{k.replace('_', '-')} {v}: the embedded trainer does not shard models "
                     f"(data parallel only); use 1, or --train-backend megatron")
    if cfg.megatron.get("optimizer_cpu_offload"):
        e.append("--optimizer-cpu-offload: the embedded trainer keeps AdamW on the model's device")
    loss = cfg.loss
    if getattr(loss, "use_routing_replay", False):
        e.append("--use-routing-replay: the embedded trainer runs dense Hugging Face models and has no MoE "
                 "router to replay; drop the flag, or use --train-backend megatron with a MoE model")
    if getattr(loss, "use_rollout_routing_replay", False):
        e.append("--use-rollout-routing-replay (R3): the embedded trainer runs dense models and cannot replay "
                 "the rollout's MoE routes; drop the flag, or use --train-backend megatron with a MoE model")
    return e


def ignored_sglang_flags(cfg) -> list[str]:
    """Pass-through flags the embedded engine accepts but does not act on (printed as a notice)."""
    if cfg.cluster.rollout_backend != "embedded":
        return []
    flagged = set(_SGLANG_PARALLEL) | set(_SGLANG_SEMANTIC)
    return [f"--sglang-{k.replace('_', '-')}" for k in cfg.sglang if k not in flagged]


def model_flag_errors(cfg) -> list[str]:
    """Model architecture flags (from scripts/models/*.sh) must match --hf-checkpoint/config.json."""
    if not cfg.model.hf_checkpoint:
        return []
    path = Path(cfg.model.hf_checkpoint) / "config.json"
    if not path.exists():
        return []
    hf = json.loads(path.read_text())
    e = []
    for flag, key in _MODEL_KEYS.items():
        if flag in cfg.megatron and key in hf:
            try:
                same = float(cfg.megatron[flag]) == float(hf[key])
            except (TypeError, ValueError):
                continue
            if not same:
                e.append(f"--{flag.replace('_', '-')} {cfg.megatron[flag]} disagrees with {path}: "
                         f"{key} = {hf[key]}")
    return e
