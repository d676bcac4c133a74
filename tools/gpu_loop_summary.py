"""Summarise the GPU loop's metrics.jsonl (tools/run_gpu_loop.sh): the figures docs/benchmarks.md
quotes. Prints JSON.

    python3 tools/gpu_loop_summary.py RUN1_METRICS.jsonl ALL_METRICS.jsonl
"""

from __future__ import annotations

import json
import statistics
import sys


def rows(path: str) -> list[dict]:
    try:
        return [json.loads(line) for line in open(path) if line.strip()]
    except FileNotFoundError:
        return []


def summarise(run1: list[dict], all_rows: list[dict]) -> dict:
    train = [r for r in all_rows if r.get("rollout_id", -1) >= 0 and "perf/step_time" in r]
    curve = [(r["step"], r["eval/held_out"]) for r in all_rows if "eval/held_out" in r]
    first = next((r for r in train if r["rollout_id"] == 0), {})
    out: dict = {"held_out_curve": curve, "rise": (curve[-1][1] - curve[0][1]) if len(curve) > 1 else None,
                 "step1_kl_loss": first.get("train/kl_loss"), "step1_ppo_kl": first.get("train/ppo_kl"),
                 "step1_train_rollout_logp_abs_diff": first.get("train/train_rollout_logp_abs_diff")}
    steady = [r for r in train if r["rollout_id"] > 0]  # the first step pays compilation and warm-up
    if steady:
        sync = sum(r.get("perf/sync_time", 0.0) for r in steady)
        step = sum(r["perf/step_time"] for r in steady)
        out.update(sync_share_of_step=sync / step, median_sync_s=statistics.median(r.get("perf/sync_time", 0.0) for r in steady),
                   median_step_s=statistics.median(r["perf/step_time"] for r in steady),
                   median_train_s=statistics.median(r.get("perf/train_time", 0.0) for r in steady),
                   median_mfu=statistics.median(r.get("perf/mfu", 0.0) for r in steady),
                   median_tflops_per_gpu=statistics.median(r.get("perf/train_tflops_per_gpu", 0.0) for r in steady))
    mem: dict[str, float] = {}
    for r in train:
        for k, v in r.items():
            if k.startswith("memory/") and isinstance(v, (int, float)):
                mem[k] = max(mem.get(k, 0.0), v)
    out["memory_max_gib"] = mem
    ids1 = [r["rollout_id"] for r in run1 if r.get("rollout_id", -1) >= 0 and "perf/step_time" in r]
    ids = [r["rollout_id"] for r in train]
    out["run1_rollout_ids"] = [min(ids1), max(ids1)] if ids1 else None
    resumed = ids[len(ids1):]
    out["run2_first_rollout_id"] = resumed[0] if resumed else None
    out["rollouts_logged"] = len(ids)
    # Each step's timeline (slime/timeline.py): where its seconds went, and its trainer MFU.
    out["steps"] = [{"rollout_id": r["rollout_id"], "step_s": r["perf/step_time"], "mfu": r.get("perf/mfu"),
                     "phases_s": {k.removeprefix("phase/"): v for k, v in r.items() if k.startswith("phase/")}}
                    for r in train]
    return out


if __name__ == "__main__":
    print(json.dumps(summarise(rows(sys.argv[1]), rows(sys.argv[2])), indent=1))
