"""One real Ray 2.60 head on 127.0.0.1: the rendered `train` submits a trivial job through the same
submit path (ray job submit + explicit runtime env) and handles token authentication.

The cluster is started in its own session (process group) with its own temp dir and HOME, and torn
down by killing exactly that process group and its descendants: `ray stop` would stop every Ray
cluster on this machine, including other people's.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from lab.core.recipes import REPO_ROOT, get_recipe
from lab.render import write_files
from lab.rules.dependents import new_experiment
from lab.web.export import experiment_files

pytestmark = [pytest.mark.ray, pytest.mark.slow]

FAKE_TRAIN = """import json, os, sys
print("SLIME_FAKE_TRAIN " + json.dumps({"argv": sys.argv[1:], "PYTHONPATH": os.environ.get("PYTHONPATH"),
                                          "PYTHONUNBUFFERED": os.environ.get("PYTHONUNBUFFERED")}))
"""


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def process_tree(pgid: int) -> set[int]:
    procs = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
                fields = stat[stat.rindex(")") + 2:].split()
                procs[int(d)] = (int(fields[1]), int(fields[2]))  # ppid, pgid
            except (OSError, ValueError):
                pass
    tree = {pid for pid, (_, pg) in procs.items() if pg == pgid}
    grew = True
    while grew:
        grew = False
        for pid, (ppid, _) in procs.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return tree


def stop_cluster(pgid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in process_tree(pgid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + (2 if sig == signal.SIGTERM else 5)
        while time.time() < deadline and process_tree(pgid):
            time.sleep(0.2)


@pytest.fixture
def ray_head():
    if shutil.which("ray") is None:
        pytest.skip("ray is not installed (pip install 'ray[default]')")
    home = Path(tempfile.mkdtemp(prefix="slr-", dir="/tmp"))  # short: Ray's socket paths have a length limit
    env = {**os.environ, "HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_AUTH_MODE", None)
    env.pop("RAY_AUTH_TOKEN", None)
    env.pop("RAY_ADDRESS", None)
    # A token on the head turns Ray 2.60's token authentication on (its default when one exists).
    subprocess.run(["ray", "get-auth-token", "--generate"], env=env, capture_output=True, check=True, timeout=30)
    gcs, dash, client, agent_http, agent_grpc, metrics, rtenv, nm, om = free_ports(9)
    cmd = ["ray", "start", "--head", "--node-ip-address", "127.0.0.1", "--dashboard-host", "127.0.0.1",
           "--num-cpus", "1", "--num-gpus", "0", "--port", str(gcs), "--dashboard-port", str(dash),
           "--ray-client-server-port", str(client), "--dashboard-agent-listen-port", str(agent_http),
           "--dashboard-agent-grpc-port", str(agent_grpc), "--metrics-export-port", str(metrics),
           "--runtime-env-agent-port", str(rtenv), "--node-manager-port", str(nm), "--object-manager-port", str(om),
           "--temp-dir", str(home / "ray"), "--disable-usage-stats"]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        out, _ = proc.communicate(timeout=45)
        if proc.returncode != 0:
            pytest.fail(f"ray start failed:\n{out[-3000:]}")
        yield {"home": home, "env": env, "dashboard": f"http://127.0.0.1:{dash}"}
    finally:
        stop_cluster(proc.pid)
        shutil.rmtree(home, ignore_errors=True)


def test_rendered_train_submits_a_job_to_a_real_ray_head_with_token_auth(ray_head, tmp_path):
    env = ray_head["env"]
    # Without RAY_AUTH_MODE=token the submit is refused: the generated shell must handle it.
    plain = subprocess.run(["ray", "job", "submit", "--address", ray_head["dashboard"], "--no-wait", "--", "true"],
                           env=env, capture_output=True, text=True, timeout=30)
    assert plain.returncode != 0 and "authentication token" in (plain.stdout + plain.stderr)

    exp = new_experiment("tiny-cpu")
    repo = tmp_path / "repo"
    write_files(experiment_files(exp), repo)
    spec = get_recipe("tiny-cpu").model_spec
    (repo / spec).parent.mkdir(parents=True)
    (repo / spec).write_text((REPO_ROOT / spec).read_text())
    (repo / "train.py").write_text(FAKE_TRAIN)
    out = subprocess.run(["bash", str(repo / "experiment.sh"), "train"], cwd=repo, capture_output=True, text=True,
                         timeout=75, env={**env, "RAY_DASHBOARD": ray_head["dashboard"]})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "RAY_AUTH_MODE=token" in out.stdout
    line = next(line for line in out.stdout.splitlines() if line.startswith("SLIME_FAKE_TRAIN "))
    job = json.loads(line[len("SLIME_FAKE_TRAIN "):])
    assert job["PYTHONPATH"] == str(repo) and job["PYTHONUNBUFFERED"] == "1"
    assert job["argv"][job["argv"].index("--train-backend") + 1] == "embedded"
    assert job["argv"][job["argv"].index("--num-layers") + 1] == "2"  # MODEL_ARGS travelled too


def test_train_run_before_the_head_is_up_waits_for_it_and_then_submits(tmp_path):
    """`train` issued while Ray is still coming up (connection refused, then no job agent) waits with a
    message and submits once the head accepts jobs: the README's `ray start` + `train` on a busy machine."""
    if shutil.which("ray") is None:
        pytest.skip("ray is not installed (pip install 'ray[default]')")
    home = Path(tempfile.mkdtemp(prefix="slw-", dir="/tmp"))
    env = {**os.environ, "HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0"}
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_ADDRESS"):
        env.pop(key, None)
    gcs, dash, client, agent_http, agent_grpc, metrics, rtenv, nm, om = free_ports(9)
    repo = tmp_path / "repo"
    write_files(experiment_files(new_experiment("tiny-cpu")), repo)
    spec = get_recipe("tiny-cpu").model_spec
    (repo / spec).parent.mkdir(parents=True)
    (repo / spec).write_text((REPO_ROOT / spec).read_text())
    (repo / "train.py").write_text(FAKE_TRAIN)
    train = subprocess.Popen(["bash", str(repo / "experiment.sh"), "train"], cwd=repo, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             env={**env, "RAY_DASHBOARD": f"http://127.0.0.1:{dash}", "SLIME_RAY_SUBMIT_WAIT": "400"})
    head = None
    try:
        time.sleep(4)  # train is now retrying against a head that does not exist yet
        head = subprocess.Popen(
            ["ray", "start", "--head", "--node-ip-address", "127.0.0.1", "--dashboard-host", "127.0.0.1",
             "--num-cpus", "1", "--num-gpus", "0", "--port", str(gcs), "--dashboard-port", str(dash),
             "--ray-client-server-port", str(client), "--dashboard-agent-listen-port", str(agent_http),
             "--dashboard-agent-grpc-port", str(agent_grpc), "--metrics-export-port", str(metrics),
             "--runtime-env-agent-port", str(rtenv), "--node-manager-port", str(nm), "--object-manager-port", str(om),
             "--temp-dir", str(home / "ray"), "--disable-usage-stats"],
            env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out, _ = train.communicate(timeout=450)
        assert train.returncode == 0, out[-4000:]
        waits = [line for line in out.splitlines() if "Ray is not ready to take the job yet" in line]
        print("\n".join(waits[:2] + waits[-2:]))  # shown with pytest -s
        assert waits
        assert any(line.startswith("SLIME_FAKE_TRAIN ") for line in out.splitlines())
    finally:
        if train.poll() is None:
            train.kill()
        if head is not None:
            head.communicate(timeout=120)
            stop_cluster(head.pid)
        shutil.rmtree(home, ignore_errors=True)
