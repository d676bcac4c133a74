"""The page bench in its short form (bench/bench_page.py): it runs whole in Chromium and reports each
figure docs/benchmarks.md quotes, the empty page's floor beside the lab's first load included."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_the_page_bench_reports_the_first_load_beside_the_browsers_floor(tmp_path):
    out = tmp_path / "page.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_page.py"), "--clicks", "4", "--loads", "2",
                        "--tunnel-clicks", "2", "--out", str(out)], capture_output=True, text=True, timeout=280, cwd=ROOT)
    # Exit 1 also says the timing goals were missed, which a shared CI machine may do: the run itself
    # must have finished and said which.
    verdict = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    assert (p.returncode, verdict) in ((0, "goals met"), (1, "goals NOT met")), p.stdout[-2000:] + p.stderr[-2000:]
    d = json.loads(out.read_text())
    for key in ("first_load_ms", "complete_load_ms", "first_load_floor_ms"):
        assert len(d[key]["runs"]) == 2 and all(x > 0 for x in d[key]["runs"]), d[key]
    assert d["first_load_floor_ms"]["main_thread_cpu_ms_median"] > 0
    assert d["first_load_transferred_kib"]["median"] > 0 and d["first_load_requests"] >= 1
    assert d["click_to_preview_ms"]["n"] == 4 and d["click_cpu_ms_per_click"]["server"] >= 0
