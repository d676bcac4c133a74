"""The load bench in its short form (CI): concurrent clients over loopback get only 200s, none hangs,
and the server's memory stays flat. The full run (20 clients, 20,000 requests) is in docs/benchmarks.md."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab.core.recipes import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.mark.parametrize("transport", ["post", "socket"])
def test_concurrent_editors_get_answers_without_errors_hangs_or_memory_growth(tmp_path, transport):
    out = tmp_path / "load.json"
    p = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "bench_lab_load.py"), "--clients", "5",
                        "--requests", "300", "--max-seconds", "200", "--transport", transport, "--out", str(out)],
                       capture_output=True, text=True, timeout=280)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    result = json.loads(Path(out).read_text())
    assert result["transport"] == transport
    assert result["requests"] == 300 and result["errors"] == 0 and result["hung"] == 0
    assert result["rss_mib"]["peak"] - result["rss_mib"]["after_warmup"] < 64, result["rss_mib"]


def test_the_edit_bench_measures_both_streams_of_edits(tmp_path):
    # The in-process bench replays the load test's page (same request builder): it must keep working
    # when the page's request changes.
    out = tmp_path / "edit.json"
    p = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "bench_lab_edit.py"), "--edits", "20",
                        "--history", "10", "--out", str(out)], capture_output=True, text=True, timeout=280)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    result = json.loads(Path(out).read_text())
    for stream in ("repeat", "new"):
        assert result[stream]["cpu_ms_per_edit"] > 0 and 20 <= result[stream]["history"] <= 30, result[stream]  # an edit to the value held adds none
        assert result[stream]["answer_bytes"] > 0
