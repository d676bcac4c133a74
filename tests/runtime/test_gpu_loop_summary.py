"""tools/gpu_loop_summary.py: the figures the GPU loop's docs quote, each step's timeline included."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

spec = importlib.util.spec_from_file_location("gpu_loop_summary", ROOT / "tools" / "gpu_loop_summary.py")
summary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(summary)


def test_the_summary_gives_each_steps_phases_and_mfu():
    rows = [{"rollout_id": i, "step": i, "perf/step_time": 10.0 + i, "perf/mfu": 0.2 + i / 100,
             "phase/rollout": 2.0, "phase/train_fwd_bwd": 6.0 + i, "phase/idle": 2.0,
             "train/kl_loss": 0.0, "train/ppo_kl": 0.0} for i in range(3)]
    out = summary.summarise(rows, rows)
    assert [s["rollout_id"] for s in out["steps"]] == [0, 1, 2]
    assert out["steps"][2] == {"rollout_id": 2, "step_s": 12.0, "mfu": 0.22,
                               "phases_s": {"rollout": 2.0, "train_fwd_bwd": 8.0, "idle": 2.0}}
    assert out["step1_kl_loss"] == 0.0 and out["median_step_s"] == 11.5
