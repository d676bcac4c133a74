"""What every lab benchmark writes beside its figures: the machine and its load, and the result file."""
from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any


def machine(load_at_start: tuple[float, float, float]) -> dict[str, Any]:
    """Cores, Python and the load averages (1, 5, 15 min) at the start and now: the figures mean
    little without the load other jobs put on the machine."""
    return {"cores": os.cpu_count(), "python": platform.python_version(),
            "load_avg_at_start": [round(x, 2) for x in load_at_start],
            "load_avg_at_end": [round(x, 2) for x in os.getloadavg()]}


def write(result: dict[str, Any], out: str | Path) -> None:
    """Print the result and write it to `out` (JSON)."""
    print(json.dumps(result, indent=2))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2) + "\n")
