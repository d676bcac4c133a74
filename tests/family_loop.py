"""A tiny-gpu-<family> recipe around the loop, as a user runs it: the lab renders `experiment.sh`
into a checkout, then `prepare`, `convert`, `check` and `train` (a real `ray job submit` to a Ray
head of this module's own), and the run's metrics.jsonl is judged.

Shared by the CPU end-to-end test (tests/runtime/test_family_recipe_cpu.py: one family, small
batches) and the GPU tests (tests/gpu/test_family_recipes_gpu.py: all six, the recipes as written).
The Ray head runs in its own session, HOME and temp dir, and is stopped by killing exactly that
process group and its descendants (`ray stop` would stop every cluster on the machine).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What the rendered experiment.sh and train.py use from the checkout (linked, not copied).
CHECKOUT = ("slime", "lab", "tools", "scripts", "recipes", "train.py", "train_async.py", "pyproject.toml")
FAMILY_RECIPES = {"glm4": "tiny-gpu-glm4", "glm4_moe": "tiny-gpu-glm4-moe", "glm4_moe_lite": "tiny-gpu-glm4-moe-lite",
                  "deepseek_v3": "tiny-gpu-deepseek-v3", "glm_moe_dsa": "tiny-gpu-glm-moe-dsa",
                  "qwen3_5": "tiny-gpu-qwen3-5"}
LOGP_TOL = 0.1  # the recipes' --weight-sync-check-tol and the issue's train/rollout |Δ log-prob| goal


def checkout_in(dst: Path) -> Path:
    """A checkout at `dst` whose code is this one's (symlinks), where a run's files can be written."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in CHECKOUT:
        (dst / name).symlink_to(ROOT / name)
    return dst


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _process_tree(pgid: int) -> set[int]:
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


def _stop(pgid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _process_tree(pgid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + (3 if sig == signal.SIGTERM else 5)
        while time.time() < deadline and _process_tree(pgid):
            time.sleep(0.2)


def run_env() -> dict[str, str]:
    """This interpreter's environment for the shell steps: its bin dir (ray, python3) first, and a
    wheel set installed with --target (the GPU machine's /tmp/site) on PATH and as MEGATRON_PATH,
    which experiment.sh puts on the job's PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    path = [str(Path(sys.executable).parent)]
    for entry in filter(None, env.get("PYTHONPATH", "").split(":")):
        if (Path(entry) / "bin" / "ray").exists():
            path.append(str(Path(entry) / "bin"))
        if (Path(entry) / "megatron" / "core").is_dir():
            env.setdefault("MEGATRON_PATH", entry)
    env["PATH"] = ":".join([*path, env.get("PATH", "")])
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled", PYTHONUNBUFFERED="1")
    return env


@dataclass
class RayHead:
    dashboard: str
    env: dict[str, str]


@contextmanager
def ray_head(cwd: Path, num_cpus: int, num_gpus: int) -> Iterator[RayHead]:
    """A Ray head on 127.0.0.1 with a job server, started from `cwd` (a job's relative paths, the
    recipes' runs/..., resolve against it)."""
    if shutil.which("ray", path=run_env()["PATH"]) is None:
        raise RuntimeError("the ray CLI is not installed (pip install 'ray[default]')")
    home = Path(tempfile.mkdtemp(prefix="slf-", dir="/tmp"))  # short: Ray's socket paths have a length limit
    env = {**run_env(), "HOME": str(home)}
    gcs, dash, client, agent_http, agent_grpc, metrics, rtenv, nm, om = _free_ports(9)
    cmd = ["ray", "start", "--head", "--node-ip-address", "127.0.0.1", "--dashboard-host", "127.0.0.1",
           "--num-cpus", str(num_cpus), "--num-gpus", str(num_gpus), "--port", str(gcs), "--dashboard-port", str(dash),
           "--ray-client-server-port", str(client), "--dashboard-agent-listen-port", str(agent_http),
           "--dashboard-agent-grpc-port", str(agent_grpc), "--metrics-export-port", str(metrics),
           "--runtime-env-agent-port", str(rtenv), "--node-manager-port", str(nm), "--object-manager-port", str(om),
           "--temp-dir", str(home / "ray"), "--disable-usage-stats"]
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=90)
        if proc.returncode != 0:
            raise RuntimeError(f"ray start failed:\n{out[-3000:]}")
        yield RayHead(f"http://127.0.0.1:{dash}", env)
    finally:
        _stop(proc.pid)
        shutil.rmtree(home, ignore_errors=True)


@dataclass
class LoopResult:
    recipe: str
    seconds: dict[str, float]
    logs: dict[str, str]
    rows: list[dict]


def job_env(repo: Path, head: RayHead) -> dict[str, str]:
    """The environment of experiment.sh's steps: the head's, the checkout first on PYTHONPATH, and
    the head's own PYTHONPATH entries after it. A wheel set installed with --target (the GPU
    machine's /tmp/site) is on that path only: its `ray` CLI imports ray from there."""
    keep = [e for e in head.env.get("PYTHONPATH", "").split(os.pathsep) if e and e != str(repo)]
    return {**head.env, "RAY_DASHBOARD": head.dashboard, "PYTHONPATH": os.pathsep.join([str(repo), *keep])}


def run_recipe(recipe: str, repo: Path, head: RayHead, train_args: tuple[str, ...] = (),
               timeout_s: int = 600) -> LoopResult:
    """Render `recipe` into `repo`, then prepare -> convert -> check -> train through experiment.sh.
    `train_args` go after experiment.sh train (train.py takes the last value of a repeated flag)."""
    from lab.render import write_files
    from lab.rules.dependents import new_experiment
    from lab.web.export import experiment_files

    write_files(experiment_files(new_experiment(recipe)), repo)
    env = job_env(repo, head)
    seconds, logs = {}, {}
    for step, extra in (("prepare", ()), ("convert", ()), ("check", ()), ("train", train_args)):
        t0 = time.monotonic()
        r = subprocess.run(["bash", str(repo / "experiment.sh"), step, *extra], cwd=repo, env=env,
                           capture_output=True, text=True, timeout=timeout_s)
        seconds[step] = round(time.monotonic() - t0, 1)
        logs[step] = r.stdout + r.stderr
        # A line per step as it ends: a run cut off by the GPU machine's time limit still says how far it got.
        print(f"[family-loop] {recipe}: {step} exited {r.returncode} after {seconds[step]} s", flush=True)
        if r.returncode != 0:
            raise AssertionError(f"{recipe}: experiment.sh {step} exited {r.returncode}:\n{logs[step][-6000:]}")
    metrics = repo / "runs" / recipe / "out" / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return LoopResult(recipe, seconds, logs, rows)


def loop_problems(res: LoopResult, min_steps: int = 3, tol: float = LOGP_TOL) -> list[str]:
    """What the run must show: min_steps steps; at step 1 KL 0 exactly (train/kl_loss against the
    reference model, train/ppo_kl against the old log-probs); every step's train/rollout
    |Δ log-prob| within tol; every step's post-sync check (engine vs trainer after the weights
    were pushed) within tol; no error in the job's log."""
    rows, p = res.rows, []
    if len(rows) < min_steps:
        return [f"{len(rows)} steps logged, {min_steps} wanted"]
    first = rows[0]
    for key in ("train/kl_loss", "train/ppo_kl"):
        if first.get(key) != 0.0:
            p.append(f"step 1 {key} = {first.get(key)!r}, not 0")
    for r in rows:
        d = r.get("train/train_rollout_logp_abs_diff")
        if d is None or d > tol:
            p.append(f"step {r['step']}: train/rollout |Δ log-prob| {d!r} (> {tol} or missing)")
        c = r.get("sync/check_logp_max_diff")
        if c is None or c > tol:
            p.append(f"step {r['step']}: post-sync check {c!r} (> {tol} or missing: the sync was not verified)")
    if "Traceback" in res.logs.get("train", ""):
        p.append("the train log has a Traceback")
    return p


def summary(res: LoopResult) -> dict:
    first = res.rows[0] if res.rows else {}
    return {"recipe": res.recipe, "seconds": res.seconds, "steps": len(res.rows),
            "step1_kl_loss": first.get("train/kl_loss"), "step1_ppo_kl": first.get("train/ppo_kl"),
            "max_train_rollout_logp_abs_diff": max((r.get("train/train_rollout_logp_abs_diff") or 0.0)
                                                   for r in res.rows) if res.rows else None,
            "max_sync_check_logp_diff": max((r.get("sync/check_logp_max_diff") or 0.0)
                                            for r in res.rows) if res.rows else None}
