"""SGLang's own launch flag names that slime's translation may emit, and nothing else.

Checked against SGLang **v0.5.x** `python/sglang/srt/server_args.py` (`ServerArgs` fields and
`add_cli_args`), read at the version slime pins (v0.5.15.post1, see
shared/reference/sglang-protocol.md §4) — SGLANG_VERSION below. A ServerArgs field `foo_bar`
is the CLI flag `--foo-bar`; a few fields have extra aliases (`--tp`, `--tensor-parallel-size`),
listed in ALIASES so user spellings map to one field. Flags marked SLIME_PATCH exist only in
slime's patched SGLang image.

Every flag the translator in slime/rollout/engines/sglang.py writes must be a key of FLAGS
(tests/runtime/test_sglang_translation.py checks it); a `--sglang-*` pass-through or a YAML
override whose field is not here is refused with the field's name, instead of failing at engine
start on a GPU node.
"""

from __future__ import annotations

SGLANG_VERSION = "0.5.15.post1"
SGLANG_ROUTER_VERSION = "0.3.2"

SWITCH, VALUE, LIST = "switch", "value", "list"  # store_true flag / flag with one value / with several (nargs="+")

# ServerArgs field -> kind. Grouped as server_args.py groups them.
FLAGS: dict[str, str] = {
    # model and tokenizer
    "model_path": VALUE, "tokenizer_path": VALUE, "trust_remote_code": SWITCH, "dtype": VALUE,
    "quantization": VALUE, "kv_cache_dtype": VALUE, "context_length": VALUE, "load_format": VALUE,
    "skip_tokenizer_init": SWITCH, "revision": VALUE, "served_model_name": VALUE,
    # HTTP server
    "host": VALUE, "port": VALUE, "nccl_port": VALUE, "skip_server_warmup": SWITCH,
    "api_key": VALUE, "admin_api_key": VALUE, "enable_metrics": SWITCH, "weight_version": VALUE,
    # memory and scheduling
    "mem_fraction_static": VALUE, "max_running_requests": VALUE, "max_total_tokens": VALUE,
    "chunked_prefill_size": VALUE, "max_prefill_tokens": VALUE, "schedule_policy": VALUE,
    "schedule_conservativeness": VALUE, "page_size": VALUE, "cuda_graph_max_bs": VALUE, "cuda_graph_bs": LIST,
    "disable_cuda_graph": SWITCH, "disable_radix_cache": SWITCH, "enable_memory_saver": SWITCH,
    "enable_weights_cpu_backup": SWITCH, "enable_draft_weights_cpu_backup": SWITCH,
    "attention_backend": VALUE, "sampling_backend": VALUE, "random_seed": VALUE,
    "enable_deterministic_inference": SWITCH, "enable_return_routed_experts": SWITCH,
    "mamba_ssm_dtype": VALUE, "mamba_full_memory_ratio": VALUE, "watchdog_timeout": VALUE,
    "log_level": VALUE,
    # parallelism and placement
    "tp_size": VALUE, "pp_size": VALUE, "dp_size": VALUE, "ep_size": VALUE,
    "enable_dp_attention": SWITCH, "enable_dp_lm_head": SWITCH, "moe_a2a_backend": VALUE,
    "base_gpu_id": VALUE, "gpu_id_step": VALUE, "nnodes": VALUE, "node_rank": VALUE,
    "dist_init_addr": VALUE, "load_balance_method": VALUE, "prefill_round_robin_balance": SWITCH,
    # prefill/decode disaggregation
    "disaggregation_mode": VALUE, "disaggregation_transfer_backend": VALUE,
    "disaggregation_bootstrap_port": VALUE, "disaggregation_ib_device": VALUE,
    "disaggregation_decode_enable_offload_kvcache": SWITCH,
    # hierarchical cache
    "enable_hierarchical_cache": SWITCH, "hicache_ratio": VALUE, "hicache_size": VALUE,
    "hicache_write_policy": VALUE, "hicache_storage_backend": VALUE, "hicache_io_backend": VALUE,
    "hicache_mem_layout": VALUE,
    # speculative decoding
    "speculative_algorithm": VALUE, "speculative_draft_model_path": VALUE,
    "speculative_num_steps": VALUE, "speculative_eagle_topk": VALUE,
    "speculative_num_draft_tokens": VALUE, "speculative_draft_attention_backend": VALUE,
    # slime's patched SGLang only
    "release_hicache": SWITCH, "custom_pull_weights_pre_read_hook": VALUE,
}
SLIME_PATCH = frozenset({"release_hicache", "custom_pull_weights_pre_read_hook"})

ALIASES = {"tensor_parallel_size": "tp_size", "tp": "tp_size", "pipeline_parallel_size": "pp_size",
           "data_parallel_size": "dp_size", "dp": "dp_size", "expert_parallel_size": "ep_size",
           "ep": "ep_size", "speculative_draft_model": "speculative_draft_model_path",
           "model": "model_path", "speculative_algo": "speculative_algorithm"}

# Set by slime per engine (SGL-1): a --sglang-* spelling of these is dropped with a notice.
RESERVED = frozenset({"tp_size", "model_path", "host", "port", "nccl_port", "random_seed", "nnodes",
                      "node_rank", "dist_init_addr", "base_gpu_id", "gpu_id_step", "enable_memory_saver",
                      "skip_server_warmup"})

# ServerArgs defaults that a reader of slime's settings needs to know (same SGLANG_VERSION):
# hybrid (Mamba / GDN) models split the cache memory left after the weights between the
# recurrent-state pool and the attention KV pool at this state : KV ratio.
DEFAULTS = {"mamba_full_memory_ratio": 0.9}

DISAGGREGATION_TRANSFER_BACKENDS = ("mooncake", "nixl", "ascend", "fake")
WORKER_TYPES = ("regular", "prefill", "decode")


def canonical(field: str) -> str:
    """A field name as ServerArgs spells it (dashes to underscores, aliases resolved)."""
    f = field.replace("-", "_")
    return ALIASES.get(f, f)


def flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def upstream_kinds() -> dict[str, str] | None:
    """Field spelling of each option of the installed SGLang's own parser (ServerArgs.add_cli_args)
    -> its kind; None where SGLang is not installed. Keyed by the option as typed (`--cuda-graph-bs`
    -> cuda_graph_bs), since a deprecated alias stores into another field. The runtime reads FLAGS
    (a --sglang-* flag's verdict is the same on every machine); tests/runtime/test_megatron_flags.py
    checks FLAGS against this where SGLang is installed."""
    try:
        from sglang.srt.server_args import ServerArgs
    except ImportError:
        return None
    import argparse

    parser = argparse.ArgumentParser(add_help=False)
    ServerArgs.add_cli_args(parser)
    # argparse has no public list of a parser's options; _actions is its record of them.
    return {o[2:].replace("-", "_"): SWITCH if a.nargs == 0 else LIST if a.nargs in ("+", "*") else VALUE
            for a in parser._actions for o in a.option_strings if o.startswith("--")}
