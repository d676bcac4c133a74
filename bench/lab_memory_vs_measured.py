"""The lab's per-GPU memory estimate (lab/memory.py, the placement step) against measured peaks.

For each bench/bench_megatron.py shape the lab estimates the training phase from a model spec
written from the same dimensions, with the bench's layout (1 GPU, TP = PP = 1, one pack of
seq x per-pack tokens per micro-batch). The measured peaks are `torch.cuda.max_memory_allocated`
of the runs docs/benchmarks.md lists (passed in with --measured NAME=GiB@TOKENS[:recompute]).

    python3 bench/lab_memory_vs_measured.py --measured llama3.2-3b=101.6@8192 ...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def spec_text(shape: str) -> str:
    from bench.bench_megatron import SHAPES

    L, h, f, nh, ng, d, v = SHAPES[shape]
    return (f"MODEL_ARGS=(--num-layers {L} --hidden-size {h} --ffn-hidden-size {f} --num-attention-heads {nh} "
            f"--group-query-attention --num-query-groups {ng} --kv-channels {d} --swiglu --disable-bias-linear "
            f"--add-qkv-bias --normalization RMSNorm --position-embedding-type rope "
            f"--untie-embeddings-and-output-weights --vocab-size {v})\n")


def lab_training_gib(shape: str, tokens: int, recompute: str = "none", recipe: str = "glm4-9b") -> dict:
    """lab.memory.estimate_memory for this shape on one GPU (the recipe only lends the form)."""
    import lab.memory as lm
    from lab.model_spec import spec_from_text
    from lab.rules import new_experiment

    spec = spec_from_text(spec_text(shape), shape)
    exp = new_experiment(recipe)
    exp = exp.model_copy(update={"resources": exp.resources.model_copy(update={
        "tp": 1, "pp": 1, "cp": 1, "ep": 1, "max_tokens_per_gpu": tokens, "recompute": recompute, "cpu_adam": False})})
    exp = exp.model_copy(update={"placement": exp.placement.model_copy(update={"train_gpus": 1})})
    real = lm.recipe_and_spec
    lm.recipe_and_spec = lambda e: (real(e)[0], spec)
    try:
        est = lm.estimate_memory(exp)
    finally:
        lm.recipe_and_spec = real
    return {"items_gib": est.training.items_gib, "total_gib": est.training.total_gib}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measured", action="append", default=[], help="NAME=GiB@TOKENS[:recompute]")
    a = ap.parse_args(argv)
    rows = []
    for m in a.measured:
        name, rest = m.split("=", 1)
        gib, _, tail = rest.partition("@")
        tokens, _, recompute = tail.partition(":")
        est = lab_training_gib(name, int(tokens), recompute or "none")
        rows.append({"shape": name, "tokens": int(tokens), "recompute": recompute or "none", "measured_gib": float(gib),
                     "lab_gib": est["total_gib"], "lab_items_gib": est["items_gib"],
                     "lab_vs_measured": round(est["total_gib"] / float(gib) - 1, 3)})
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
