"""A generate hook for the straw producer tests: the built-in request through the router, after a
pause, with a marker file per call (which process generated which sample, and how often)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any


async def slow_generate(args: Any, sample: Any, sampling_params: dict) -> Any:
    from slime.rollout.generate import fill_sample

    markers = Path(args.rollout.queue_dir).parent / "markers"
    markers.mkdir(exist_ok=True)
    (markers / f"{sample.sample_id.replace('/', '_')}-{os.getpid()}-{time.monotonic_ns()}").touch()
    await asyncio.sleep(0.5)  # a window in which the test kills the producer mid-group
    outs = await asyncio.to_thread(args.client.generate, [list(sample.prompt_tokens)], sampling_params)
    fill_sample(sample, outs[0])
    return sample
