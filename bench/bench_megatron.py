#!/usr/bin/env python3
"""Training throughput of the Megatron trainer (GRPO loss, packed micro-batches) on one GPU.

What is timed: ``MegatronTrainer.train(records, num_steps=1)`` with rollout log-probs given
(``--use-rollout-logprobs``, so no extra forward pass), i.e. forward + the shared GRPO loss
(slime/training/loss.py) + backward + optimizer step, on random weights and random tokens.

FLOPs per step (reported as model TFLOP/s; no recomputation is counted):
  6 * (matmul parameters incl. the output layer) * tokens
  + 6 * layers * heads * head_dim * sum(seq_len^2)        (causal attention, fwd + bwd)
MFU is that over the bf16 dense peak measured on the machine (--peak-tflops, default 790).

    python bench/bench_megatron.py --shape llama3.2-3b --steps 4 --json out.json

MoE shapes: ``--moe-experts`` picks the routed experts' module: ``grouped`` (``--moe-grouped-gemm``:
slime's torch._grouped_mm experts, slime/backends/megatron/grouped_experts.py), ``sequential``
(megatron-core's SequentialMLP, one GEMM per expert), ``spec`` (as the model spec says; the
GLM-4.7 spec sets --moe-grouped-gemm), or ``both``: one run of each in its own process, then a
comparison line (tokens/s and MFU of each)::

    python bench/bench_megatron.py --shape glm4.7-flash-6l --moe-experts both --json moe.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = {
    # name: (layers, hidden, ffn, heads, kv groups, head dim, vocab)
    "qwen2.5-1.5b": (28, 1536, 8960, 12, 2, 128, 151936),
    "qwen2.5-3b": (36, 2048, 11008, 16, 2, 128, 151936),
    "llama3.2-3b": (28, 3072, 8192, 24, 8, 128, 128256),
    "qwen2.5-7b-16l": (16, 3584, 18944, 28, 4, 128, 152064),
}


def flags_for(shape: str) -> dict:
    L, h, f, nh, ng, d, v = SHAPES[shape]
    return {"num_layers": L, "hidden_size": h, "ffn_hidden_size": f, "num_attention_heads": nh,
            "group_query_attention": True, "num_query_groups": ng, "kv_channels": d, "swiglu": True,
            "disable_bias_linear": True, "add_qkv_bias": True, "normalization": "RMSNorm", "norm_epsilon": 1e-6,
            "position_embedding_type": "rope", "rotary_base": 1000000, "untie_embeddings_and_output_weights": True,
            "vocab_size": v, "seq_length": 32768, "max_position_embeddings": 32768}


# MoE shapes: a model spec with its depth reduced to fit one GPU (first layer dense, the rest MoE).
MOE_SHAPES = {
    # GLM-4.7-Flash-like: MLA, 64 experts top-4 + 1 shared expert, sigmoid router with expert bias
    "glm4.7-flash-6l": ("scripts/models/glm4.7-30B-A3B.sh", 6),
}


def moe_flags_for(shape: str) -> dict:
    from slime.model_spec import load_flags

    spec, layers = MOE_SHAPES[shape]
    flags = load_flags(Path(__file__).resolve().parent.parent / spec)
    first_dense = str(flags["moe_layer_freq"]).count("[0]") and int(str(flags["moe_layer_freq"]).split("[0]*")[1].split("+")[0])
    flags.update(num_layers=layers, moe_layer_freq=f"[0]*{first_dense}+[1]*{layers - first_dense}",
                 seq_length=32768, max_position_embeddings=32768)
    flags.pop("mtp_num_layers", None)
    return flags


def moe_flops(shape: str, flags: dict, n_records: int, seq_len: int) -> tuple[float, int, int]:
    """(FLOPs per step counting ACTIVE parameters, active matmul params incl. output layer, total params)."""
    from slime.model_spec import spec_from_flags

    s = spec_from_flags(flags)
    active = s.active_params + s.vocab * s.hidden  # + the output layer
    tokens = n_records * seq_len
    qk = (s.qk_head_dim + s.qk_pos_emb_head_dim) if s.mla else s.kv_channels
    v = s.v_head_dim if s.mla else s.kv_channels
    attn = 6 * s.layers * s.heads * (qk + v) / 2 * n_records * seq_len ** 2
    return 6 * active * tokens + attn, active, s.total_params


def param_counts(shape: str) -> tuple[int, int]:
    """(matmul params incl. output layer, all params)."""
    L, h, f, nh, ng, d, v = SHAPES[shape]
    layer = h * (nh + 2 * ng) * d + nh * d * h + 3 * h * f
    matmul = L * layer + v * h
    total = matmul + v * h + L * (2 * h + (nh + 2 * ng) * d) + h
    return matmul, total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama3.2-3b", choices=sorted(SHAPES) + sorted(MOE_SHAPES))
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--pack-tokens", type=int, default=8192, help="--max-tokens-per-gpu (one micro-batch)")
    ap.add_argument("--micro-batches", type=int, default=4, help="micro-batches per optimizer step")
    ap.add_argument("--steps", type=int, default=4, help="timed steps (after --warmup)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--attention", default="sdpa", choices=["sdpa", "local"])
    ap.add_argument("--recompute", default=None, choices=[None, "full", "selective"])
    ap.add_argument("--peak-tflops", type=float, default=790.0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--moe-experts", default="spec", choices=["spec", "grouped", "sequential", "both"],
                    help="MoE shapes: the experts' module (module docstring)")
    a = ap.parse_args(argv)
    if a.moe_experts == "both":
        return compare_experts(sys.argv[1:] if argv is None else list(argv), a.json)

    import torch

    from slime.backends.megatron.trainer import MegatronTrainer
    from slime.config import BatchConfig, LossConfig, ModelConfig, OptimConfig
    from slime.data.train_data import TrainRecord

    moe = a.shape in MOE_SHAPES
    flags = moe_flags_for(a.shape) if moe else flags_for(a.shape)
    if moe and a.moe_experts != "spec":
        flags["moe_grouped_gemm"] = a.moe_experts == "grouped"
    if a.recompute:
        flags.update(recompute_granularity=a.recompute, recompute_num_layers=1)
    seqs_per_pack = max(1, a.pack_tokens // a.seq_len)
    n_records = seqs_per_pack * a.micro_batches
    t_build = time.time()
    trainer = MegatronTrainer(flags, ModelConfig(), OptimConfig(lr=1e-6, weight_decay=0.1),
                              LossConfig(use_rollout_logprobs=True),
                              BatchConfig(use_dynamic_batch_size=True, max_tokens_per_gpu=a.pack_tokens),
                              attention=a.attention)
    build_s = time.time() - t_build
    rng = random.Random(0)
    vocab = int(flags["vocab_size"])
    prompt = a.seq_len // 4

    def records():
        out = []
        for i in range(n_records):
            toks = [rng.randrange(vocab) for _ in range(a.seq_len)]
            r = a.seq_len - prompt
            out.append(TrainRecord(toks, prompt, 1.0 if i % 2 else -1.0, [-rng.random() * 5 for _ in range(r)], [1] * r))
        return out

    batches = [records() for _ in range(2)]
    for i in range(a.warmup):
        trainer.train(batches[i % 2], 1)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(a.steps):
        torch.cuda.synchronize()
        t0 = time.time()
        m = trainer.train(batches[i % 2], 1)
        torch.cuda.synchronize()
        times.append(time.time() - t0)
    step = sorted(times)[len(times) // 2]
    tokens = n_records * a.seq_len
    if moe:
        flops, matmul, total = moe_flops(a.shape, flags, n_records, a.seq_len)
    else:
        L, h, f, nh, ng, d, v = SHAPES[a.shape]
        matmul, total = param_counts(a.shape)
        flops = 6 * matmul * tokens + 6 * L * nh * d * n_records * a.seq_len ** 2
    tflops = flops / step / 1e12
    res = {"shape": a.shape, "params_total": total, ("params_active_matmul" if moe else "params_matmul"): matmul,
           "seq_len": a.seq_len,
           "pack_tokens": a.pack_tokens, "micro_batches": a.micro_batches, "tokens_per_step": tokens,
           "attention": a.attention, "recompute": a.recompute, "step_s_median": round(step, 4),
           "step_s_all": [round(t, 4) for t in times], "tokens_per_s": round(tokens / step),
           "model_tflops": round(tflops, 1), "mfu_vs_peak": round(tflops / a.peak_tflops, 4),
           "peak_tflops_assumed": a.peak_tflops, "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1),
           "build_s": round(build_s, 1), "pg_loss": m.get("train/pg_loss"), "grad_norm": m.get("train/grad_norm"),
           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    if moe:
        from slime.model_spec import flag_bool

        res["moe_experts"] = "grouped" if flag_bool(flags, "moe_grouped_gemm") else "sequential"
    try:
        import megatron.core

        res["megatron_core"] = megatron.core.__version__
    except Exception:
        pass
    print(json.dumps(res), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


def _without(argv: list[str], *opts: str) -> list[str]:
    """argv less the given options and their values (``--opt v`` or ``--opt=v``)."""
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x in opts:
            skip = True
        elif not any(x.startswith(o + "=") for o in opts):
            out.append(x)
    return out


def compare_experts(argv: list[str], json_out: str | None) -> int:
    """``--moe-experts both``: SequentialMLP, then the grouped experts, each in its own process
    (one model on the GPU at a time); prints each run's line, then tokens/s and MFU side by side."""
    base = _without(argv, "--moe-experts", "--json")
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("sequential", "grouped"):
            path = Path(tmp) / f"{mode}.json"
            rc = subprocess.call([sys.executable, str(Path(__file__).resolve()), *base, "--moe-experts", mode,
                                  "--json", str(path)])
            if rc != 0:
                print(f"the {mode} run failed (exit {rc})", file=sys.stderr)
                return rc
            runs[mode] = json.loads(path.read_text())
    cmp = {mode: {k: r[k] for k in ("tokens_per_s", "mfu_vs_peak", "step_s_median", "peak_mem_gib")}
           for mode, r in runs.items()}
    cmp["grouped_speedup"] = round(runs["grouped"]["tokens_per_s"] / runs["sequential"]["tokens_per_s"], 3)
    print(json.dumps({"moe_experts_comparison": cmp}), flush=True)
    if json_out:
        Path(json_out).write_text(json.dumps({"runs": runs, "comparison": cmp}, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    sys.exit(main())
