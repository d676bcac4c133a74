"""Time validate + derive + render of every file, per recipe: p50 / p95 over N iterations.

    python3 bench/bench_render.py [--iterations 200]

Prints a table and writes bench/results/render.json. Goal: p95 <= 10 ms per recipe (the page
re-renders on every change). The first call per recipe (imports, template compile, git state,
file hashes) is a warm-up and is not timed; caches are what a running server has.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lab.core.recipes import all_recipes  # noqa: E402
from lab.rules.dependents import new_experiment  # noqa: E402
from lab.rules.derive import derive  # noqa: E402
from lab.rules.validate import validate  # noqa: E402
from lab.web.export import experiment_files  # noqa: E402

GOAL_P95_MS = 10.0


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def bench(iterations: int) -> dict:
    results = {}
    for name in all_recipes():
        exp = new_experiment(name)
        experiment_files(exp)  # warm-up
        times, cpu = [], []
        for _ in range(iterations):
            t0, c0 = time.perf_counter(), time.process_time()
            validate(exp)
            derive(exp)
            experiment_files(exp)  # validates and derives again for experiment.json: the real cost of a download
            times.append((time.perf_counter() - t0) * 1000)
            cpu.append((time.process_time() - c0) * 1000)
        results[name] = {"p50_ms": round(percentile(times, 0.5), 3), "p95_ms": round(percentile(times, 0.95), 3),
                         "mean_ms": round(statistics.fmean(times), 3), "iterations": iterations,
                         # CPU time of this process: what the code costs, independent of other load
                         "cpu_p50_ms": round(percentile(cpu, 0.5), 3), "cpu_p95_ms": round(percentile(cpu, 0.95), 3)}
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "render.json"))
    args = ap.parse_args()
    if args.iterations < 1:
        ap.error("--iterations must be >= 1")
    results = bench(args.iterations)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{'recipe':<14} {'p50 ms':>8} {'p95 ms':>8} {'cpu p50':>8} {'cpu p95':>8}  goal p95 <= {GOAL_P95_MS:g} ms"
          f"  (load average {load:.1f} on {os.cpu_count()} CPUs)")
    for name, r in results.items():
        flag = "ok" if r["p95_ms"] <= GOAL_P95_MS else "OVER"
        print(f"{name:<14} {r['p50_ms']:>8.2f} {r['p95_ms']:>8.2f} {r['cpu_p50_ms']:>8.2f} {r['cpu_p95_ms']:>8.2f}  {flag}")
    doc = {"benchmark": "validate + derive + render_all", "goal_p95_ms": GOAL_P95_MS,
           "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
           "load_average_1m": round(load, 2), "recipes": results,
           "all_within_goal": all(r["p95_ms"] <= GOAL_P95_MS for r in results.values())}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
