"""A measurement aid: torch.profiler around one call of a trainer, its table written to a folder.

Set SLIME_PROFILE_DIR to an absolute folder every trainer process can write (Ray's workers inherit
it from the environment of `ray start`), and SLIME_PROFILE_CALL to the call to profile, counted
from 1 (default 2: after the first call's warm-up and compilation). Each rank writes
`<name>_call<N>_rank<R>.txt`: operators by their own device time (CPU time without CUDA). Unset,
it costs a counter increment per call.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ENV_DIR = "SLIME_PROFILE_DIR"
ENV_CALL = "SLIME_PROFILE_CALL"


def call_wanted() -> int:
    """The call SLIME_PROFILE_CALL names (default 2)."""
    raw = (os.environ.get(ENV_CALL) or "2").strip()
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{ENV_CALL}={raw!r}: name the train call to profile as a whole number from 1 "
                         "(2, the default, is the first call after warm-up)")
    return int(raw)


class CallProfiler:
    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0

    @contextmanager
    def __call__(self, rank: int) -> Iterator[None]:
        self.calls += 1
        out = os.environ.get(ENV_DIR)
        if not out or self.calls != call_wanted():
            yield
            return
        import torch
        from torch.profiler import ProfilerActivity, profile

        cuda = torch.cuda.is_available()
        activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
        with profile(activities=activities) as prof:
            yield
        table = prof.key_averages().table(sort_by="self_device_time_total" if cuda else "self_cpu_time_total",
                                          row_limit=60)
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{self.name}_call{self.calls}_rank{rank}.txt").write_text(table)
