"""The lab's per-GPU memory estimate beside the peaks measured on the H200.

The measured figures (bench/data/memory_measured.json, each row naming its run in
docs/benchmarks.md) are `torch.cuda.max_memory_allocated` peaks. The estimate is computed here:
- bench/bench_megatron.py shapes: lab/rules/memory_model.py's `training_parts` for the bench's layout
  (1 GPU, TP = PP = 1, one pack of --pack-tokens per micro-batch, the loss reading the response
  rows: the bench's prompts are a quarter of each sequence), dimensions from the bench's own flags
  read by slime.model_spec;
- recipes: lab.rules.memory.estimate_memory of the recipe's default experiment (the placement step's
  figure), training or rollout phase.

    python3 bench/compare_memory.py            # a table; --json for the rows
CPU only; imports neither torch nor Ray.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MEASURED = ROOT / "bench" / "data" / "memory_measured.json"
GOAL = 0.15  # issue 12: the estimate within 15 % of the measured peak


def measured_rows(path: Path = MEASURED) -> list[dict[str, Any]]:
    return json.loads(path.read_text())["rows"]


def bench_estimate(row: dict[str, Any]) -> dict[str, float]:
    """GiB by part for a bench/bench_megatron.py run on one GPU."""
    from bench.bench_megatron import flags_for
    from lab.rules.memory_model import GIB, TrainLayout, training_parts
    from slime.model_spec import spec_from_flags

    spec = spec_from_flags(flags_for(row["shape"]), row["shape"])
    seq, pack = row["seq_len"], row["pack_tokens"]
    per_pack = max(1, pack // seq)
    response = seq - seq // 4  # bench_megatron.py: prompt = seq_len // 4, the rest is response
    layout = TrainLayout(tokens=per_pack * seq, logit_rows=per_pack * response, recompute=row["recompute"])
    return {k: v / GIB for k, v in training_parts(spec, layout).items()}


def recipe_estimate(row: dict[str, Any]) -> dict[str, float]:
    """GiB by item of the lab's estimate for the recipe's default experiment, for the row's phase."""
    from lab.rules.dependents import new_experiment
    from lab.rules.memory import estimate_memory

    est = estimate_memory(new_experiment(row["recipe"]))
    phase = est.training if row["kind"] == "recipe_training" else est.rollout
    return {i.key.rsplit(".", 1)[-1]: i.gib for i in phase.items}


def compare(rows: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    out = []
    for row in rows if rows is not None else measured_rows():
        parts = bench_estimate(row) if row["kind"] == "megatron_bench" else recipe_estimate(row)
        est = sum(parts.values())
        out.append({"name": row["name"], "measured_gib": row["measured_gib"], "estimate_gib": round(est, 2),
                    "error": round(est / row["measured_gib"] - 1, 3),
                    "parts_gib": {k: round(v, 2) for k, v in parts.items()}, "source": row["source"]})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    a = ap.parse_args(argv)
    rows = compare()
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'run':52} {'measured':>9} {'estimate':>9} {'error':>7}  within {GOAL:.0%}")
    for r in rows:
        ok = "yes" if abs(r["error"]) <= GOAL else "no"
        print(f"{r['name']:52} {r['measured_gib']:8.2f}G {r['estimate_gib']:8.2f}G {r['error']:+7.1%}  {ok}")
        print("    " + ", ".join(f"{k} {v:g}" for k, v in r["parts_gib"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
