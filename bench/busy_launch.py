"""`ray start` followed at once by `bash experiment.sh train`, on a machine kept busy.

    python bench/busy_launch.py [--rollouts 20] [--burners 2]

What README's tiny path does, with the machine's cores kept busy by `--burners` spinning
processes: render the tiny-cpu experiment into the checkout root, `prepare`, `convert`, then
`ray start --head` (its own ports, temp dir and process session, so other clusters on the machine
are untouched) and, the moment it returns, `bash experiment.sh train`. The generated `train` waits
for Ray's job agent (lab/render/templates/experiment.sh.j2, `submit_when_ray_is_ready`). The
cluster is then stopped by ending exactly the processes of its session (never `ray stop`, which
would stop every cluster here). Writes bench/results/busy_launch.json.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def session_pids(sid: int) -> set[int]:
    """Processes whose session id is `sid` (the ray start session and every daemon it spawned)."""
    out = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
                if int(stat[stat.rindex(")") + 2:].split()[3]) == sid:
                    out.add(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return out


def stop_session(sid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in session_pids(sid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + 5
        while time.time() < deadline and session_pids(sid):
            time.sleep(0.2)


def sh(cmd: list[str], env: dict[str, str], log: list[dict], **kw) -> subprocess.CompletedProcess:
    t = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, env=env, text=True, capture_output=True, **kw)
    log.append({"cmd": " ".join(cmd), "rc": p.returncode, "s": round(time.monotonic() - t, 1)})
    print(f"$ {' '.join(cmd)}  -> rc {p.returncode} in {log[-1]['s']} s", flush=True)
    return p


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rollouts", type=int, default=20)
    ap.add_argument("--burners", type=int, default=2)
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    for k in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN"):
        env.pop(k, None)
    home = Path(tempfile.mkdtemp(prefix="h13r-", dir="/tmp"))
    env["HOME"] = str(home)
    steps: list[dict] = []
    burn = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.burners)]
    sid = None
    result: dict = {"rollouts": args.rollouts, "burners": args.burners, "cores": os.cpu_count(), "steps": steps}
    try:
        p = sh([sys.executable, "-m", "lab.web.cli", "render", "--model", "tiny-cpu", "--set",
                f"task.num_rollout={args.rollouts}", "-o", "out/"], env, steps)
        assert p.returncode == 0, p.stderr
        (ROOT / "experiment.sh").write_text((ROOT / "out" / "experiment.sh").read_text())
        for step in ("prepare", "convert"):
            p = sh(["bash", "experiment.sh", step], env, steps)
            assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        gcs, dash, client, agent_http, agent_grpc, metrics, rtenv, nm, om = free_ports(9)
        start = subprocess.Popen(
            ["ray", "start", "--head", "--node-ip-address", "127.0.0.1", "--dashboard-host", "127.0.0.1",
             "--num-cpus", "2", "--port", str(gcs), "--dashboard-port", str(dash),
             "--ray-client-server-port", str(client), "--dashboard-agent-listen-port", str(agent_http),
             "--dashboard-agent-grpc-port", str(agent_grpc), "--metrics-export-port", str(metrics),
             "--runtime-env-agent-port", str(rtenv), "--node-manager-port", str(nm),
             "--object-manager-port", str(om), "--temp-dir", str(home / "ray"), "--disable-usage-stats"],
            cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        sid = start.pid
        t0 = time.monotonic()
        out, _ = start.communicate(timeout=300)
        steps.append({"cmd": "ray start --head ... (own ports)", "rc": start.returncode,
                      "s": round(time.monotonic() - t0, 1)})
        print(f"$ ray start --head ...  -> rc {start.returncode} in {steps[-1]['s']} s", flush=True)
        assert start.returncode == 0, out[-3000:]
        train = sh(["bash", "experiment.sh", "train"], {**env, "RAY_DASHBOARD": f"http://127.0.0.1:{dash}"}, steps,
                   timeout=3000)
        waits = [line for line in train.stdout.splitlines() if "Ray is not ready" in line]
        result.update(train_rc=train.returncode, waits=len(waits), wait_lines=waits[:3] + waits[-1:],
                      train_tail=train.stdout.splitlines()[-5:], stderr_tail=train.stderr.splitlines()[-5:])
        print("\n".join(waits[:3] + ["..."] + train.stdout.splitlines()[-8:]))
    finally:
        for b in burn:
            b.kill()
        if sid is not None:
            stop_session(sid)
    out_path = ROOT / "bench" / "results" / "busy_launch.json"
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result.get("train_rc") == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
