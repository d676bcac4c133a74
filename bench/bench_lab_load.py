"""Load test of the lab server: concurrent clients editing over loopback, bounded in count and time.

    python bench/bench_lab_load.py [--clients 20] [--requests 20000] [--max-seconds 900] [--workers N]
                                   [--transport post|socket] [--out FILE]

Starts the real server (`python -m lab.web.cli serve`, one process, as a user runs it) on a free
127.0.0.1 port, then runs `--clients` threads, each a user with its own workspace and a keep-alive
connection, sending edits (`POST /api/workspace`, one field changed per request; as the page does, each
client keeps its whole workspace with its growing undo history and sends B, A and the two top
entries of each history stack with the stacks' lengths and the tags of the answer parts it holds,
then applies the stack changes the answer names) until `--requests` answers
have come back in all, or `--max-seconds` have passed. Reports requests/s, latency p50/p90/p99/max,
errors, the server's CPU time per request (utime + stime: what one request costs, however busy
the machine is) and the clients' own (this process: they share the server's cores), its RSS (VmRSS) after warm-up, at each quarter of the run and at its peak, and
the machine's load averages (1, 5, 15 min) when the run started and when it ended.
`--transport socket` sends the same edits as the page does once its socket is open: one message
each over `WS /api/workspace/socket` (lab/web/api_socket.py), one socket per client; the first
view still goes by POST, as the page's first screen does.
Goal: edit p99 ≤ 100 ms at 20 clients on 2 cores, with RSS flat. Exit 1 on any error, any request
slower than --hang-seconds, or when the time bound cut the run short.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pydantic_core
import report  # bench/report.py: python puts this script's folder first on sys.path
from websockets.sync.client import connect

ROOT = Path(__file__).resolve().parents[1]
# Edits a user makes: (field, values cycled through). Each changes the rendered files.
EDITS = [
    ("rollout.temperature", [0.7, 0.8, 0.9, 1.0]),
    ("task.n_samples_per_prompt", [4, 8, 16]),
    ("placement.ownership", ["colocated", "disaggregated"]),
    ("rollout.max_response_len", [4096, 8192, 16384]),
    ("task.num_rollout", [3, 100, 3000]),
    ("corrections.tis", [True, False]),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_tree(pid: int) -> list[int]:
    """The server and its descendants (`serve --workers N` answers in N child processes)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            todo += [int(c) for c in task.read_text().split()]
    return out


def rss_mib(pid: int) -> float:
    """VmRSS of the server's processes, summed."""
    total = 0.0
    for p in process_tree(pid):
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) / 1024
    return total


def cpu_seconds(pid: int) -> float:
    """utime + stime of the server's processes, in seconds (what they computed, whatever else ran)."""
    total = 0.0
    for p in process_tree(pid):
        stat = Path(f"/proc/{p}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


sys.path.insert(0, str(ROOT))
from lab.core.history_tail import TAIL_SENT  # noqa: E402 - what the page sends of each stack (app.js, tied by a test)
from lab.web.api_socket import PATH as SOCKET_PATH  # noqa: E402 - the page's socket route


def page_request(ws: dict, action: dict, held: dict[str, str]) -> dict:
    sent = {"b": ws["b"], "a": ws["a"], "undo": ws["undo"][-TAIL_SENT:], "redo": ws["redo"][-TAIL_SENT:]}
    return {"workspace": sent, "history": {"undo": len(ws["undo"]), "redo": len(ws["redo"])}, "action": action,
            "held": held}


def page_holds(held: dict[str, str], answer: dict) -> dict[str, str]:
    """The tags of the parts the page holds after the answer (lab/web/answer_parts.py)."""
    return {**{k: held[k] for k in answer["same"]}, **answer["tags"]}


def page_applies(ws: dict, answer: dict) -> dict:
    """The whole workspace the page keeps: B and A from the answer, each stack changed as it says."""
    h = answer["history"]
    return {**answer["workspace"],
            **{side: ws[side][h[side]["start"]:h[side]["stop"]] + h[side]["push"] for side in ("undo", "redo")}}


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


class Client(threading.Thread):
    def __init__(self, index: int, port: int, budget: "Budget", transport: str = "post") -> None:
        super().__init__(daemon=True)
        self.index, self.port, self.budget, self.transport = index, port, budget, transport
        self.sent = 0
        self.latencies: list[float] = []
        self.errors: list[str] = []

    def post(self, conn: http.client.HTTPConnection, body: dict) -> tuple[int, dict]:
        # pydantic-core's JSON (Rust): the clients share the server's 2 cores, and the json module
        # would spend ~2.7 ms of them per request on a 38 KB body and an 86 KB answer (~0.9 ms here).
        raw = pydantic_core.to_json(body)
        conn.request("POST", "/api/workspace", body=raw, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, pydantic_core.from_json(resp.read())

    def over_socket(self, sock: Any, body: dict) -> tuple[int, dict]:
        """One message as app.js sends it (head line, then the POST's body, in one text frame); its answer."""
        self.sent += 1
        sock.send('{"id":%d,"lang":"en"}\n' % self.sent + pydantic_core.to_json(body).decode())
        head, _, answer = sock.recv(self.budget.hang_s, decode=False).partition(b"\n")
        meta = pydantic_core.from_json(head)
        if meta.get("id") != self.sent:
            raise RuntimeError(f"answer {meta.get('id')} to message {self.sent}")
        return meta["status"], pydantic_core.from_json(answer)

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.budget.hang_s)
        try:
            status, data = self.post(conn, {"workspace": None, "action": {"type": "view"}})
            if self.transport == "socket":
                with connect(f"ws://127.0.0.1:{self.port}{SOCKET_PATH}", open_timeout=self.budget.hang_s,
                             max_size=None, compression=None) as sock:
                    self.edit(data, lambda body: self.over_socket(sock, body))
            else:
                self.edit(data, lambda body: self.post(conn, body))
        except Exception as exc:  # noqa: BLE001 - counted and reported
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            conn.close()

    def edit(self, first: dict, send: Callable[[dict], tuple[int, dict]]) -> None:
        """Edits sent one after another, each from the workspace the previous answer left."""
        ws, held = first["workspace"], first["tags"]
        k = self.index
        while self.budget.take():
            field, values = EDITS[k % len(EDITS)]
            value = values[(k // len(EDITS) + self.index) % len(values)]
            k += 1
            t = time.perf_counter()
            status, data = send(page_request(ws, {"type": "edit", "path": field, "value": value}, held))
            self.latencies.append(time.perf_counter() - t)
            if status != 200:
                self.errors.append(f"{status}: {json.dumps(data)[:200]}")
                continue
            ws, held = page_applies(ws, data), page_holds(held, data)


class Budget:
    """At most `requests` requests in all, none started after `deadline`."""

    def __init__(self, requests: int, max_seconds: float, hang_s: float) -> None:
        self.left = requests
        self.deadline = time.monotonic() + max_seconds
        self.hang_s = hang_s
        self.cut_short = False
        self.lock = threading.Lock()

    def take(self) -> bool:
        with self.lock:
            if time.monotonic() > self.deadline:
                self.cut_short = self.left > 0
                return False
            if self.left <= 0:
                return False
            self.left -= 1
            return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--max-seconds", type=float, default=900)
    ap.add_argument("--hang-seconds", type=float, default=10)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "lab_load.json"))
    ap.add_argument("--workers", type=int, default=1, help="passed to `slime-lab serve --workers`")
    ap.add_argument("--transport", choices=["post", "socket"], default="post",
                    help="how edits go: POST /api/workspace, or the page's WebSocket")
    args = ap.parse_args()

    load_at_start = os.getloadavg()  # other jobs on the machine: the figures mean little without it
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen([sys.executable, "-m", "lab.web.cli", "serve", "--port", str(port), "--workers",
                               str(args.workers)], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/api/recipes")
                if c.getresponse().status == 200:
                    break
            except OSError as exc:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the lab server did not start: " + server.stderr.read().decode()[-2000:]) from exc
                time.sleep(0.2)
        # Warm-up: every edit once (imports, caches), then the baseline RSS.
        warm = Budget(len(EDITS) * 3 * args.workers, 120, args.hang_seconds)
        warmers = [Client(i, port, warm, args.transport) for i in range(2 * args.workers)]  # connections reach every process
        for w in warmers:
            w.start()
        for w in warmers:
            w.join()
        rss_start = rss_mib(server.pid)
        cpu_start = cpu_seconds(server.pid)
        peak = [rss_start]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.5):
                peak.append(rss_mib(server.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        budget = Budget(args.requests, args.max_seconds, args.hang_seconds)
        clients = [Client(i, port, budget, args.transport) for i in range(args.clients)]
        t0, client_cpu = time.monotonic(), time.process_time()
        for c in clients:
            c.start()
        for c in clients:
            c.join(args.max_seconds + 2 * args.hang_seconds)
        wall, client_cpu = time.monotonic() - t0, time.process_time() - client_cpu
        stop.set()
        rss_end = rss_mib(server.pid)
        cpu = cpu_seconds(server.pid) - cpu_start
    finally:
        server.terminate()
        server.wait(10)

    lat = [x for c in clients for x in c.latencies]
    errors = [e for c in clients for e in c.errors]
    if not lat:
        raise SystemExit("no edit was answered: " + "; ".join(errors[:3]))
    hung = sum(x > args.hang_seconds for x in lat) + sum("timed out" in e for e in errors)
    result = {
        "clients": args.clients, "server_workers": args.workers, "transport": args.transport, "requests": len(lat), "seconds": round(wall, 1),
        "requests_per_s": round(len(lat) / wall, 1),
        "latency_ms": {"p50": round(1000 * statistics.median(lat), 1), "p90": round(1000 * percentile(lat, 0.9), 1),
                       "p99": round(1000 * percentile(lat, 0.99), 1), "max": round(1000 * max(lat), 1)},
        "errors": len(errors), "error_samples": errors[:5], "hung": hung, "cut_short": budget.cut_short,
        "server_cpu_ms_per_request": round(1000 * cpu / max(1, len(lat)), 2),
        # The clients run on the same cores: with C cores, (server + clients) CPU per request bounds
        # the rate at C / that, and with N clients waiting in turn, p50 is about N / rate.
        "clients_cpu_ms_per_request": round(1000 * client_cpu / max(1, len(lat)), 2),
        "rss_mib": {"after_warmup": round(rss_start, 1), "end": round(rss_end, 1), "peak": round(max(peak), 1),
                    "quartiles": [round(peak[min(len(peak) - 1, len(peak) * q // 4)], 1) for q in range(1, 5)]},
        "machine": report.machine(load_at_start),
    }
    report.write(result, args.out)
    return 1 if errors or hung or budget.cut_short else 0


if __name__ == "__main__":
    sys.exit(main())
