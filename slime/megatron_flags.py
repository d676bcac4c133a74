"""Megatron's flags that slime passes through to its Megatron backend: the one pinned list.

A flag named here (or starting with a prefix of MEGATRON_PREFIXES) is pulled out of the command line
by slime.args into cfg.megatron, whatever value follows, and read by slime/backends/megatron (or
refused by a backend's capability check). The names are Megatron's own:

- UPSTREAM: flags of megatron-core's parser (megatron/training/arguments.py) at MEGATRON_VERSION;
- FORK: flags of the Megatron-LM fork that slime's launch scripts and model specs come from, which
  that parser does not have (slime's Megatron backend reads them itself);
- the prefixes: whole families (MoE, MTP, FP8, linear attention; --index-* is the fork's DSA indexer).

Where megatron-core is installed, upstream_flags() reads its real parser, and
tests/runtime/test_megatron_flags.py checks this list against it (megatron-core is installed in CI).
The runtime itself reads the pinned list, never the installed parser: a flag's verdict is the same
on every machine (the lab judges scripts meant for another cluster), and building Megatron's parser
imports torch, which parsing must not.
"""

from __future__ import annotations

import argparse
from functools import lru_cache

MEGATRON_VERSION = "0.19.2"

UPSTREAM: frozenset[str] = frozenset({
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--sequence-parallel",
    "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers", "--recompute-granularity", "--recompute-method",
    "--recompute-num-layers", "--optimizer-cpu-offload", "--use-precision-aware-optimizer",
    "--overlap-cpu-optimizer-d2h-h2d", "--overlap-grad-reduce", "--overlap-param-gather",
    "--use-distributed-optimizer", "--num-layers", "--hidden-size", "--ffn-hidden-size",
    "--num-attention-heads", "--group-query-attention", "--num-query-groups", "--kv-channels",
    "--max-position-embeddings", "--seq-length", "--normalization", "--norm-epsilon", "--swiglu",
    "--disable-bias-linear", "--add-qkv-bias", "--qk-layernorm", "--position-embedding-type",
    "--rotary-base", "--rotary-percent", "--untie-embeddings-and-output-weights", "--vocab-size",
    "--make-vocab-size-divisible-by", "--use-rotary-position-embeddings", "--num-experts",
    "--bf16", "--fp16", "--attention-dropout", "--hidden-dropout", "--lr-decay-style", "--min-lr",
    "--lr-warmup-iters", "--lr-warmup-fraction", "--lr-decay-iters", "--attention-softmax-in-fp32",
    "--accumulate-allreduce-grads-in-fp32", "--attention-backend", "--ckpt-format",
    "--no-save-optim", "--no-load-optim", "--no-load-rng", "--optimizer", "--use-mcore-models",
    "--transformer-impl", "--spec",
    # architecture flags of the model specs (scripts/models/*.sh): MLA, YaRN, norms
    "--multi-latent-attention", "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim",
    "--v-head-dim", "--rotary-scaling-factor", "--mscale", "--mscale-all-dim", "--rotary-interleaved",
    "--apply-layernorm-1p", "--attention-output-gate", "--optimizer-offload-fraction",
    # fusion switches of the specs: the backend never fuses these kernels (model_args.py), so
    # "no fusion" is what it does
    "--no-masked-softmax-fusion", "--no-rope-fusion",
})

FORK: frozenset[str] = frozenset({
    "--virtual-pipeline-model-parallel-size",  # megatron-core 0.19: --num-virtual-stages-per-pipeline-rank
    "--megatron-to-hf-mode", "--allgather-cp",
    # architecture flags of the model specs: hybrid, DSA, norms
    "--post-self-attn-layernorm", "--post-mlp-layernorm", "--hybrid-linear-attention", "--enable-dsa-indexer",
    # train the spec's MTP layer (its loss weighed by --mtp-loss-scaling-factor); frozen without it
    "--enable-mtp-training",
})

MEGATRON_FLAGS: frozenset[str] = UPSTREAM | FORK
UPSTREAM_PREFIXES = ("--moe-", "--mtp-", "--fp8-", "--linear-")
FORK_PREFIXES = ("--index-",)
MEGATRON_PREFIXES = UPSTREAM_PREFIXES + FORK_PREFIXES


def is_megatron_flag(name: str) -> bool:
    return name in MEGATRON_FLAGS or name.startswith(MEGATRON_PREFIXES)


@lru_cache(maxsize=1)
def upstream_flags() -> frozenset[str] | None:
    """Every option string of the installed megatron-core's parser; None where it is not installed.
    Imports torch and megatron (seconds): the check against the pinned list calls it, parsing never does."""
    try:
        from megatron.training.arguments import add_megatron_arguments
    except ImportError:
        return None
    parser = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    add_megatron_arguments(parser)
    # Megatron's parser has no public list of its options; _actions is argparse's record of them.
    return frozenset(o for a in parser._actions for o in a.option_strings)
