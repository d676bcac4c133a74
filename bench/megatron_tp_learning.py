"""Does the Megatron trainer learn at TP 2 in the Ray loop as it does at TP 1? (CPU, gloo, float32)

Builds the tiny-cpu recipe's model and data locally (tools/tiny/prepare.py), then runs `train.py`
(real Ray on 127.0.0.1, an embedded engine, the Megatron trainer in its CPU mode) once per layout
with the tiny recipe's algorithm flags, and prints the held-out reward curve of each run from its
metrics.jsonl, as JSON (also written to --out).

    python bench/megatron_tp_learning.py --rollouts 150 --layouts 1,2 --out bench/results/megatron_tp_learning.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def flags(work: Path, out: Path, tp: int, rollouts: int) -> list[str]:
    from slime.model_spec import read_model_args

    data, model = work / "data", work / "model"
    return [
        "--train-backend", "megatron", *read_model_args(ROOT / "scripts" / "models" / "tiny-cpu.sh"),
        "--rollout-backend", "embedded", "--actor-num-nodes", "1", "--actor-num-gpus-per-node", str(tp),
        "--tensor-model-parallel-size", str(tp), "--rollout-num-gpus", "1", "--cpus-per-bundle", "0.5",
        "--hf-checkpoint", str(model), "--output-dir", str(out),
        "--prompt-data", str(data / "train.jsonl"), "--input-key", "prompt", "--label-key", "label",
        "--apply-chat-template", "--rollout-shuffle",
        "--num-rollout", str(rollouts), "--rollout-batch-size", "16", "--n-samples-per-prompt", "8",
        "--rollout-max-response-len", "4", "--rollout-temperature", "1", "--rm-type", "math",
        "--advantage-estimator", "grpo", "--eps-clip", "0.2", "--eps-clip-high", "0.28",
        "--micro-batch-size", "128", "--lr", "1e-3", "--weight-decay", "0.1", "--adam-beta1", "0.9",
        "--adam-beta2", "0.98", "--clip-grad", "1.0",
        "--eval-interval", "25", "--eval-prompt-data", "held_out", str(data / "eval.jsonl"),
        "--n-samples-per-eval-prompt", "1", "--eval-temperature", "1.0",
        "--update-weight-transport", "disk", "--update-weight-disk-dir", str(out / "weights"),
    ]


def held_out(metrics: Path) -> list[tuple[int, float]]:
    curve = []
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        if "eval/held_out" in row:
            curve.append((int(row.get("rollout_id", row.get("step", -1))), float(row["eval/held_out"])))
    return curve


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rollouts", type=int, default=150)
    ap.add_argument("--layouts", default="1,2", help="TP sizes to run, comma-separated")
    ap.add_argument("--work", default="runs/megatron-tp-learning")
    ap.add_argument("--out", help="write the JSON result here too")
    a = ap.parse_args()
    work = Path(a.work).resolve()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    if not (work / "model" / "config.json").exists():
        subprocess.run([sys.executable, str(ROOT / "tools" / "tiny" / "prepare.py"), "--model-dir", str(work / "model"),
                        "--data-dir", str(work / "data")], check=True, env=env)
    result = {"rollouts": a.rollouts, "runs": []}
    for tp in (int(x) for x in a.layouts.split(",")):
        out = work / f"tp{tp}"
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *flags(work, out, tp, a.rollouts)], env=env,
                              cwd=ROOT, capture_output=True, text=True)
        took = time.monotonic() - t0
        if proc.returncode:
            print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n", file=sys.stderr)
            return proc.returncode
        curve = held_out(out / "metrics.jsonl")
        result["runs"].append({"tp": tp, "seconds": round(took, 1), "held_out": curve,
                               "rise": round(curve[-1][1] - curve[0][1], 3) if curve else None})
        print(json.dumps(result["runs"][-1]), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
