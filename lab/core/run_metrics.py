"""A run's metrics.jsonl as the series the "Did it work?" step plots.

The file is what train.py / train_async.py write (slime/metrics.py): one JSON object per line with
`step`. The page draws what this returns and computes nothing itself:

- charts: reward, held-out reward (every `eval/<name>`), KL, |Δ log-prob| and MFU, each a list of
  series of (step, value) points; a metric the run did not log is left out, a NaN is a gap;
- phases: one stacked bar per step with a timeline (`phase/<name>`, slime/timeline.py), the phases
  in the runtime's order, and the run's largest phase (slime.timeline.run_summary).

A step logged twice (a run resumed from an earlier checkpoint appends to the same file) keeps its
last line. A line that is not a JSON object with a numeric `step` is refused, naming the line.
"""
from __future__ import annotations

import json
import math
from typing import Any

from lab.core.safe_json import JSON_WHY
from slime.metrics import eval_reward_keys
from slime.timeline import PHASES, PREFIX, run_summary

# chart id -> the metrics it draws, in legend order (the charts of docs/en/observability.md).
CHARTS: dict[str, tuple[str, ...]] = {
    "reward": ("rollout/raw_reward",),
    "eval": (),  # every eval/<name> reward of the file (slime.metrics.eval_reward_keys)
    "kl": ("train/kl_loss", "train/train_rollout_kl"),
    "logp_diff": ("train/train_rollout_logp_abs_diff",),
    "mfu": ("perf/mfu",),
}


class RunMetricsError(ValueError):
    """A file the lab cannot plot: `key`/`params` word it (lab/locales, `runs.*`), `line` is 1-based (0: the file)."""

    def __init__(self, key: str, params: dict[str, Any], line: int = 0) -> None:
        super().__init__(key)
        self.key, self.params, self.line = key, params, line


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def parse_rows(text: str) -> list[dict[str, Any]]:
    """One dict per step, ascending; blank lines skipped; the last line of a repeated step wins."""
    by_step: dict[int, dict[str, Any]] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as exc:
            why: Any = type(exc).__name__
            if isinstance(exc, json.JSONDecodeError):  # the json module's reason, worded in the page's language
                why = {"key": JSON_WHY[exc.msg]} if exc.msg in JSON_WHY else exc.msg
            raise RunMetricsError("runs.not_json", {"line": n, "why": why}, n) from None
        if not isinstance(row, dict):
            raise RunMetricsError("runs.not_object", {"line": n}, n)
        step = row.get("step")
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step) \
                or step != int(step):
            raise RunMetricsError("runs.no_step", {"line": n}, n)
        by_step[int(step)] = {**row, "step": int(step)}
    if not by_step:
        raise RunMetricsError("runs.empty", {})
    return [by_step[s] for s in sorted(by_step)]


def _series(rows: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    points = [[r["step"], _number(r[key])] for r in rows if key in r]
    if not any(v is not None for _, v in points):
        return None
    return {"key": key, "points": points}


def chart_series(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    evals = eval_reward_keys({k for r in rows for k in r})
    out: dict[str, list[dict[str, Any]]] = {}
    for chart, keys in CHARTS.items():
        found = [s for s in (_series(rows, k) for k in (evals if chart == "eval" else keys)) if s is not None]
        out[chart] = found
    return out


def phase_bars(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One bar per step that has a timeline: its phases' seconds (in PHASES order) and its step time."""
    timed = [r for r in rows if any(k.startswith(PREFIX) for k in r) and _number(r.get("perf/step_time")) is not None]
    bars = [{"step": r["step"], "step_time": float(r["perf/step_time"]),
             "seconds": [_number(r.get(PREFIX + p)) or 0.0 for p in PHASES]} for r in timed]
    summary = run_summary(timed)
    return {"names": list(PHASES), "bars": bars, "largest": summary["largest"],
            "totals": [summary["phases"][p] for p in PHASES], "step_time": summary["step_time"]}


def run_series(text: str) -> dict[str, Any]:
    rows = parse_rows(text)
    return {"steps": [r["step"] for r in rows], "charts": chart_series(rows), "phases": phase_bars(rows)}
