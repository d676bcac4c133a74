"""Kill a real training process right after a checkpoint, resume with --load: the run continues at
the next rollout id with no prompt repeated or skipped (restarting the rollout counter at 0 is the
trap users hit)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.runtime.conftest import REPO, tiny_flags

pytestmark = [pytest.mark.ray, pytest.mark.timeout(400)]


def _prompt_ids(pattern: str, rollouts: range) -> list[list[int]]:
    out = []
    for r in rollouts:
        rows = [json.loads(x) for x in Path(pattern.format(rollout_id=r)).read_text().splitlines()]
        out.append([row["prompt_id"] for row in rows])
    return out


def _pids_of_own_ray(ray_tmp: str) -> list[int]:
    """Processes of the Ray instance the killed driver started: found by its private temp dir."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if ray_tmp in cmd:
            pids.append(int(entry.name))
    return pids


def test_killed_after_a_save_resumes_at_the_next_rollout_with_the_same_prompts(tiny, ray_cluster, tmp_path):
    import train

    rollouts = "5"
    # The reference: the same run, uninterrupted.
    ref_out = tmp_path / "ref"
    ref_dump = str(ref_out / "rollouts" / "{rollout_id}.jsonl")
    train.main(tiny_flags(tiny, ref_out, "--num-rollout", rollouts, "--save-debug-rollout-data", ref_dump))

    # The victim: a separate process with its own Ray instance, killed by SIGKILL once rollout 2 is saved.
    out, ckpt = tmp_path / "killed", tmp_path / "ckpt"
    dump = str(tmp_path / "dump" / "{rollout_id}.jsonl")
    ray_tmp = tempfile.mkdtemp(prefix="/tmp/slk")  # short: Ray's socket paths have a length limit
    env = {**os.environ, "RAY_ADDRESS": "local", "RAY_AUTH_MODE": "disabled", "RAY_TMPDIR": ray_tmp,
           "PYTHONPATH": str(REPO)}
    argv = tiny_flags(tiny, out, "--num-rollout", rollouts, "--save", str(ckpt), "--save-interval", "2",
                      "--save-debug-rollout-data", dump)
    proc = subprocess.Popen([sys.executable, str(REPO / "train.py"), *argv], env=env, cwd=str(tmp_path),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    marker = ckpt / "latest_checkpointed_iteration.txt"
    deadline = time.monotonic() + 240
    try:
        while not (marker.exists() and marker.read_text().strip() == "2"):
            assert proc.poll() is None, f"train.py ended before its first save: {proc.stderr.read().decode()[-2000:]}"
            assert time.monotonic() < deadline, "no checkpoint within 240 s"
            time.sleep(0.02)
        assert proc.poll() is None, "the run finished before it could be killed; the test proves nothing"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in _pids_of_own_ray(ray_tmp):  # the orphaned raylet/GCS of the killed driver, by its own dir
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert proc.returncode == -signal.SIGKILL

    # Resume from the checkpoint, as a user would: same flags plus --load.
    resumed = tmp_path / "resumed"
    train.main(tiny_flags(tiny, resumed, "--num-rollout", rollouts, "--load", str(ckpt), "--save", str(ckpt),
                          "--save-interval", "2", "--save-debug-rollout-data", dump))
    rows = [json.loads(x) for x in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout_id"] for r in rows if r["rollout_id"] >= 0] == [2, 3, 4]  # not 0: the counter was restored
    assert _prompt_ids(dump, range(5)) == _prompt_ids(ref_dump, range(5))  # none repeated, none skipped
