"""Metrics: one printed line per step, OUTPUT_DIR/metrics.jsonl (one JSON object per line with
`step` and `rollout_id`), and TensorBoard when installed and asked for.

Prefixes: rollout/ (samples and rewards), train/ (loss terms, grad norm, train/rollout KL),
eval/<name> (mean held-out reward), perf/ (phase times, tokens/s), phase/<name> (the step's
timeline in seconds, slime/timeline.py: the phases add up to perf/step_time).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from slime.timeline import PREFIX, format_summary, run_summary

# eval/<name> is the mean held-out reward, eval/<name>_response_length the mean response length.
EVAL_LENGTH_SUFFIX = "_response_length"


def eval_reward_keys(keys) -> list[str]:
    """The eval/<name> reward metrics among `keys` (what the lab plots as held-out reward)."""
    return sorted(k for k in keys if k.startswith("eval/") and not k.endswith(EVAL_LENGTH_SUFFIX))


SHOWN = ("rollout/raw_reward", "train/pg_loss", "train/train_rollout_kl", "train/grad_norm",
         "perf/step_time")


def rollout_metrics(samples: list, reward_summary: dict[str, float]) -> dict[str, float]:
    n = max(len(samples), 1)
    lengths = [s.response_length for s in samples]
    return {
        **reward_summary,
        "rollout/raw_reward": sum(float(s.reward or 0.0) for s in samples) / n,
        "rollout/response_length": sum(lengths) / n,
        "rollout/truncated_ratio": sum(s.status.value == "truncated" for s in samples) / n,
        "rollout/aborted_ratio": sum(s.status.value == "aborted" for s in samples) / n,
        "rollout/num_samples": float(len(samples)),
    }


class MetricsLogger:
    def __init__(self, output_dir: str | None, use_tensorboard: bool = False, total_steps: int | None = None):
        self.path = None
        self.tb = None
        self.total = total_steps
        self.t0 = time.monotonic()
        self.timed: list[dict[str, float]] = []  # each step's phase/* and perf/step_time, for summary()
        if output_dir:
            Path(output_dir).mkdir(parents=True, exist_ok=True)
            self.path = Path(output_dir) / "metrics.jsonl"
            if use_tensorboard:
                try:
                    from torch.utils.tensorboard import SummaryWriter

                    self.tb = SummaryWriter(str(Path(output_dir) / "tensorboard"))
                except ImportError:
                    print("[metrics] --use-tensorboard: tensorboard is not installed; metrics.jsonl only")

    def log(self, step: int, rollout_id: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, "rollout_id": rollout_id, "time": round(time.monotonic() - self.t0, 3),
                  **{k: (float(v) if isinstance(v, (int, float)) else v) for k, v in metrics.items()}}
        self.timed.append({k: v for k, v in record.items() if k.startswith(PREFIX) or k == "perf/step_time"})
        if self.path:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")
        if self.tb:
            for k, v in metrics.items():
                if isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, step)
            self.tb.flush()
        print(self.format_line(step, metrics), flush=True)

    def format_line(self, step: int, metrics: dict[str, Any]) -> str:
        progress = f"step {step}/{self.total}" if self.total else f"step {step}"
        shown = [k for k in SHOWN if k in metrics] + sorted(k for k in metrics if k.startswith("eval/"))
        parts = [f"{k.split('/', 1)[1]}={metrics[k]:.4g}" for k in shown]
        return f"[slime] {progress} " + " ".join(parts)

    def summary(self) -> str:
        """The run summary the loop prints at its end: time per phase over all steps, the largest named."""
        return format_summary(run_summary(self.timed))

    def close(self) -> None:
        if self.tb:
            self.tb.close()


def dump_rollout(path_template: str, rollout_id: int, samples: list) -> None:
    """--save-debug-rollout-data: one JSON line per sample, for replay and inspection."""
    path = Path(path_template.format(rollout_id=rollout_id))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for s in samples:
            f.write(json.dumps({"rollout_id": rollout_id, "prompt_id": s.prompt_id, "epoch": s.epoch,
                                "group_index": s.group_index, "response": s.response,
                                "response_tokens": s.response_tokens, "reward": s.reward,
                                "status": s.status.value, "weight_version": s.weight_version,
                                "sample_id": s.sample_id}) + "\n")
