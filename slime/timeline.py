"""The phase timeline of a step: where every second of it went.

Each step's wall time is split into named phases, written as `phase/<name>` (seconds) into
metrics.jsonl beside `perf/step_time`. `idle` is the part of the step no phase measured (Ray object
transfers, advantage bookkeeping, the loop itself), so the phases add up to the step time.

A phase is timed where its work happens: the loop and the runtime time theirs with
`PhaseClock.phase`, the trainer ranks theirs with their own clock and return them in their metrics
(`absorb` books them into the runtime's clock). Phases nest: time spent in an inner phase (an
onload inside a checkpoint, a trainer's forward/backward inside the train call) is booked to the
inner phase only, and a *container* (`phase(None)`) books nothing of its own, so what it does not
name falls into `idle`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

PREFIX = "phase/"
# In the order a step runs them (the order of the stacked bar in the lab and in the summary).
PHASES = ("rollout", "reward", "old_log_probs", "ref_log_probs", "packing", "train_fwd_bwd", "train_optimizer",
          "offload", "onload", "sync", "eval", "checkpoint", "idle")
TRAINER_PHASES = ("old_log_probs", "ref_log_probs", "packing", "train_fwd_bwd", "train_optimizer")


class PhaseClock:
    """Exclusive wall time per phase. `sync` runs before every clock reading (on a GPU,
    torch.cuda.synchronize: queued kernels belong to the phase that queued them)."""

    def __init__(self, sync: Callable[[], None] | None = None):
        self.sync = sync
        self.seconds: dict[str, float] = {}
        self._stack: list[list] = []  # [name or None, start, seconds booked to inner phases]
        self._t0 = self._now()

    def _now(self) -> float:
        if self.sync is not None:
            self.sync()
        return time.perf_counter()

    def reset(self) -> None:
        """A new step: forget the phases booked so far (call outside any phase)."""
        self.seconds = {}
        self._stack = []
        self._t0 = self._now()

    @contextmanager
    def phase(self, name: str | None) -> Iterator[None]:
        """Time the block as `name` (None: a container that books only what its inner phases name)."""
        frame: list[Any] = [name, self._now(), 0.0]
        self._stack.append(frame)
        try:
            yield
        finally:
            self._stack.pop()
            took = self._now() - frame[1]
            if name is not None:
                self.seconds[name] = self.seconds.get(name, 0.0) + max(took - frame[2], 0.0)
            if self._stack:
                self._stack[-1][2] += took if name is not None else frame[2]

    def absorb(self, seconds: dict[str, float]) -> None:
        """Book phases measured elsewhere (a trainer rank, the rollout manager) that ran inside the
        innermost open phase of this clock."""
        total = 0.0
        for name, s in seconds.items():
            self.seconds[name] = self.seconds.get(name, 0.0) + max(float(s), 0.0)
            total += max(float(s), 0.0)
        if self._stack:
            self._stack[-1][2] += total

    def move(self, src: str, dst: str, seconds: float) -> None:
        """Re-book up to `seconds` of `src` as `dst` (a part of a phase measured inside it)."""
        took = min(max(seconds, 0.0), self.seconds.get(src, 0.0))
        self.seconds[src] = self.seconds.get(src, 0.0) - took
        self.seconds[dst] = self.seconds.get(dst, 0.0) + took

    def elapsed(self) -> float:
        return self._now() - self._t0

    def metrics(self, step_time: float | None = None) -> dict[str, float]:
        """`phase/<name>` for every phase of PHASES (0.0 when it did not run), idle the rest of
        the step (never negative), and `perf/step_time`."""
        total = self.elapsed() if step_time is None else step_time
        out = {f"{PREFIX}{p}": self.seconds.get(p, 0.0) for p in PHASES if p != "idle"}
        out[f"{PREFIX}idle"] = max(total - sum(out.values()), 0.0)
        out["perf/step_time"] = total
        return out


def book_rollout(clock: PhaseClock, metrics: dict) -> None:
    """After a synchronous rollout timed as `rollout` (the loop's wait for it): the manager's
    reward time moves to `reward`. A rollout read back from the straw queue was generated and
    scored before a restart, so all of its wait stays `rollout`."""
    if not metrics.get("rollout/from_queue"):
        clock.move("rollout", "reward", float(metrics.get("perf/reward_time", 0.0)))


def pop_phases(metrics: dict[str, float]) -> dict[str, float]:
    """Remove the `phase/<name>` entries from `metrics` and return them as {name: seconds}."""
    keys = [k for k in metrics if k.startswith(PREFIX)]
    return {k[len(PREFIX):]: float(metrics.pop(k)) for k in keys}


def trainer_metrics(clock: PhaseClock) -> dict[str, float]:
    """What a trainer rank returns with its train/* metrics: its sub-phases, as `phase/<name>`."""
    return {f"{PREFIX}{p}": clock.seconds.get(p, 0.0) for p in TRAINER_PHASES}


# -- the run summary ------------------------------------------------------------------------------
def run_summary(rows: list[dict]) -> dict:
    """Totals over the logged steps: seconds per phase, their shares of the summed step time, and
    the largest phase (idle included: a large idle is itself the finding)."""
    totals = {p: 0.0 for p in PHASES}
    step_total, steps = 0.0, 0
    for row in rows:
        if "perf/step_time" not in row:
            continue
        steps += 1
        step_total += float(row["perf/step_time"])
        for p in PHASES:
            totals[p] += float(row.get(f"{PREFIX}{p}", 0.0))
    largest = max(PHASES, key=lambda p: totals[p]) if steps else None
    return {"steps": steps, "step_time": step_total, "phases": totals, "largest": largest,
            "shares": {p: (t / step_total if step_total else 0.0) for p, t in totals.items()}}


def format_summary(summary: dict) -> str:
    """The lines the loop prints at the end of a run."""
    if not summary["steps"]:
        return "[slime] run summary: no step was timed"
    lines = [f"[slime] run summary: {summary['steps']} steps, {summary['step_time']:.1f} s"]
    for p in sorted(PHASES, key=lambda p: -summary["phases"][p]):
        if summary["phases"][p] > 0:
            lines.append(f"[slime]   {p:<16} {summary['phases'][p]:9.2f} s  {summary['shares'][p]:6.1%}")
    big = summary["largest"]
    lines.append(f"[slime] largest phase: {big} ({summary['phases'][big]:.2f} s, {summary['shares'][big]:.1%} "
                 f"of step time)")
    return "\n".join(lines)
