"""The family loop's experiment.sh steps run with the wheel set the head runs with.

On the GPU machine the wheels are installed with `pip --target /tmp/site`, so `/tmp/site/bin/ray` is
a script that imports ray from /tmp/site, which is on PYTHONPATH only. Steps that replaced
PYTHONPATH with the checkout alone could not run `ray job submit` (2026-12-05, GPU parts 6 and 7:
"No module named 'ray'"); this runs such a --target script under the steps' environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.family_loop import RayHead, job_env


def test_experiment_steps_see_a_wheel_set_installed_with_target(tmp_path: Path):
    site, repo = tmp_path / "site", tmp_path / "checkout"
    (site / "bin").mkdir(parents=True)
    repo.mkdir()
    (site / "target_probe.py").write_text("WHERE = 'site'\n")
    cli = site / "bin" / "probe"
    cli.write_text(f"#!{sys.executable}\nimport target_probe\nprint(target_probe.WHERE)\n")
    cli.chmod(0o755)
    head = RayHead("http://127.0.0.1:1", {"PATH": f"{site / 'bin'}:/usr/bin:/bin", "PYTHONPATH": str(site)})

    env = job_env(repo, head)

    assert env["PYTHONPATH"].split(":") == [str(repo), str(site)]  # the checkout first
    assert env["RAY_DASHBOARD"] == "http://127.0.0.1:1"
    run = subprocess.run([str(cli)], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "site", run.stderr
    checkout_only = {**env, "PYTHONPATH": str(repo)}  # what the steps had before
    assert subprocess.run([str(cli)], env=checkout_only, capture_output=True, timeout=60).returncode != 0
