"""tools/run_gpu_tests.sh --list / --part N on a machine without a GPU: the parts are listed, a part
selects its tests and nothing else (every GPU test in exactly one part, as pytest collects them),
a wrong part number is refused with the valid range, and a part's junit XML becomes the JSON
summary the GPU run leaves in bench/results/."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import gpu_parts  # noqa: E402


def _sh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "tools" / "run_gpu_tests.sh"), *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def _collect(args: list[str]) -> set[str]:
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "gpu",
                        *args], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return {ln for ln in r.stdout.splitlines() if "::" in ln}


def test_list_shows_every_part_with_its_pytest_selection():
    r = _sh("--list")
    assert r.returncode == 0, r.stderr
    for i, p in enumerate(gpu_parts.PARTS, 1):
        assert f"part {i}: {p.name}" in r.stdout
    assert r.stdout.count("pytest -m gpu") == len(gpu_parts.PARTS)
    assert all(p.budget_s < 8 * 60 for p in gpu_parts.PARTS)


def test_each_gpu_test_runs_in_exactly_one_part_and_mtp_and_critic_are_in_one():
    everything = _collect(["tests/gpu"])
    seen: dict[str, int] = {}
    for i in range(1, len(gpu_parts.PARTS) + 1):
        dry = _sh("--part", str(i), "--dry-run")
        assert dry.returncode == 0, dry.stderr
        cmd = shlex.split(dry.stdout)
        assert cmd[:5] == ["python3", "-m", "pytest", "-m", "gpu"]
        for t in _collect(cmd[5:]):
            assert t not in seen, f"{t} is in parts {seen[t]} and {i}"
            seen[t] = i
    assert set(seen) == everything
    assert any("test_mtp_gpu.py" in t for t in seen) and any("test_embedded_critic_gpu.py" in t for t in seen)


@pytest.mark.parametrize("bad", ["0", "9", "two"])
def test_a_part_outside_the_list_is_refused_with_the_range(bad):
    r = _sh("--part", bad, "--dry-run")
    assert r.returncode == 2
    assert f"--part must be a number from 1 to {len(gpu_parts.PARTS)}" in r.stderr and "--list" in r.stderr


def test_a_parts_junit_becomes_the_json_summary(tmp_path):
    xml = tmp_path / "j.xml"
    xml.write_text(
        '<?xml version="1.0"?><testsuites><testsuite name="pytest">'
        '<testcase classname="tests.gpu.test_mtp_gpu" name="test_a[glm4_moe]" time="12.5"/>'
        '<testcase classname="tests.gpu.test_mtp_gpu" name="test_b" time="3.0"><failure message="boom"/></testcase>'
        '<testcase classname="tests.gpu.test_mtp_gpu" name="test_c" time="0.1"><skipped message="no fla"/></testcase>'
        '</testsuite></testsuites>')
    out = tmp_path / "gpu_part_4.json"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_parts.py"), "summary", "4", str(xml), str(out), "1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["part"] == 4 and res["name"] == gpu_parts.PARTS[3].name and res["pytest_exit"] == 1
    assert res["counts"] == {"passed": 1, "failed": 1, "skipped": 1} and res["seconds"] == 15.6
    assert res["tests"][0]["id"] == "tests/gpu/test_mtp_gpu.py::test_a[glm4_moe]"
    assert res["tests"][1]["message"] == "boom"
