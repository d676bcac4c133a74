"""What one round trip costs inside Chromium: a fetch POST against a WebSocket message.

    python bench/bench_transport.py [--rounds 3] [--n 200] [--request-kib 2.2] [--answer-kib 9.1]

A question for the lab's click → preview time (issue #27, point 7): of a click's 17–30 ms on the
2-core machine, how much is the transport itself? This serves a bare echo app (not the lab: no
validation, no rendering; FastAPI under uvicorn on 127.0.0.1, a free port), opens it in Debian's
Chromium through Playwright, and times, in the page, `n` round trips of each kind after 20 of
warm-up, each sending a request of the lab's click size and reading back an answer of its median
size (JSON-parsed on both ends of the page, as app.js does): `fetch("/echo", {method: "POST"})`,
then the same over one open WebSocket. Needs the `websockets` package (uvicorn's WebSocket
support), which the lab itself does not install. Writes bench/results/transport.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"

APP = '''
import json, os
from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import HTMLResponse, Response
app = FastAPI()
ANSWER = json.dumps({"x": "y" * int(float(os.environ["ANSWER_KIB"]) * 1024)})
PAGE = open(os.environ["PAGE_FILE"]).read()
@app.get("/")
def index():
    return HTMLResponse(PAGE)
@app.post("/echo")
async def echo(request: Request):
    json.loads(await request.body())
    return Response(ANSWER, media_type="application/json")
@app.websocket("/ws")
async def ws(sock: WebSocket):
    await sock.accept()
    try:
        while True:
            json.loads(await sock.receive_text())
            await sock.send_text(ANSWER)
    except WebSocketDisconnect:
        pass
'''

PAGE = """<!doctype html><html><body><script>
async function run(n, requestBytes) {
  const body = JSON.stringify({a: "b".repeat(requestBytes)});
  const q = (a, p) => { a = a.slice().sort((x, y) => x - y); return a[Math.min(a.length - 1, Math.floor(a.length * p))]; };
  const post = async () => {
    const r = await fetch('/echo', {method: 'POST', headers: {'content-type': 'application/json'}, body});
    return JSON.parse(await r.text());
  };
  const ws = new WebSocket('ws://' + location.host + '/ws');
  await new Promise((res, rej) => { ws.onopen = res; ws.onerror = rej; });
  let resolve;
  ws.onmessage = (e) => resolve(JSON.parse(e.data));
  const send = () => new Promise((res) => { resolve = res; ws.send(body); });
  const timed = async (f) => {
    for (let i = 0; i < 20; i++) await f();
    const out = [];
    for (let i = 0; i < n; i++) { const t = performance.now(); await f(); out.push(performance.now() - t); }
    return {p50: q(out, 0.5), p95: q(out, 0.95), max: Math.max(...out)};
  };
  const result = {fetch: await timed(post), websocket: await timed(send)};
  ws.close();
  return result;
}
</script></body></html>"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--request-kib", type=float, default=2.2, help="a click's request (the page's body, ~2.2 KB)")
    ap.add_argument("--answer-kib", type=float, default=9.1, help="a click's answer (bench_page.py's median)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "transport.json"))
    args = ap.parse_args()
    try:
        import websockets  # noqa: F401 - uvicorn serves WebSockets only with it (or wsproto)
    except ImportError:
        sys.exit("bench_transport.py needs the websockets package: pip install websockets")
    from playwright.sync_api import sync_playwright

    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"slime-bench-transport-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    (work / "echo_app.py").write_text(APP)
    (work / "page.html").write_text(PAGE)
    port = free_port()
    env = {**os.environ, "ANSWER_KIB": str(args.answer_kib), "PAGE_FILE": str(work / "page.html")}
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "echo_app:app", "--host", "127.0.0.1",
                               "--port", str(port), "--log-level", "warning"], cwd=work, env=env)
    load = [os.getloadavg()[0]]
    rounds = []
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)
                break
            except OSError:
                time.sleep(0.2)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{port}/")
            for _ in range(args.rounds):
                r = page.evaluate("([n, b]) => run(n, b)", [args.n, int(args.request_kib * 1024)])
                rounds.append({k: {m: round(v, 2) for m, v in d.items()} for k, d in r.items()})
                print(json.dumps(rounds[-1]), flush=True)
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=10)
    load.append(os.getloadavg()[0])
    out = {"rounds": rounds, "n": args.n, "request_kib": args.request_kib, "answer_kib": args.answer_kib,
           "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                       "loadavg_1m_before": round(load[0], 2), "loadavg_1m_after": round(load[1], 2)},
           "command": "python bench/bench_transport.py " + " ".join(sys.argv[1:])}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
