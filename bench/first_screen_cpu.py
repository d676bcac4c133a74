"""Renderer main-thread CPU until the first screen is drawn: the tree before a change against this one.

    python bench/first_screen_cpu.py BEFORE_TREE [--rounds 10]

`bench/bench_page.py` reads the main thread's CPU (CDP Performance metrics, thread ticks) when the
whole page is in (`body[data-ready]`). Since steps 2-6 come after the first screen (lab/page.py),
that figure counts them too; this one stops at the first screen. Both trees are served at once
(uvicorn, each from its own folder); loads alternate between them in fresh browser contexts. In
this tree app.js is served with one line added after its `lab:ready` mark that marks the body and
halts (so nothing after the mark runs before the figure is read); in BEFORE_TREE, where `lab:ready`
and `data-ready` came together, the page is served as it is. Prints medians; writes nothing.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.bench_page import ARGS, CHROMIUM  # noqa: E402 - the page bench's browser, as it launches it

READY = '  performance.mark("lab:ready"); // the first screen is drawn with its first answer\n'
HALT = READY + '  document.body.dataset.first = "1"; await new Promise(() => {});\n'


def serve(root: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "lab.web.app:create_app", "--factory", "--host", "127.0.0.1",
                             "--port", str(port), "--log-level", "warning"], cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(url + "/").read()
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.terminate()
    raise RuntimeError(f"uvicorn did not start in {root}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    app_js = (ROOT / "lab" / "static" / "app.js").read_text()
    if READY not in app_js:
        raise SystemExit("app.js has no first-screen mark to stop at")
    halted = app_js.replace(READY, HALT)
    from playwright.sync_api import sync_playwright

    servers = {"before": serve(args.before.resolve()), "after": serve(ROOT)}
    res: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            for rnd in range(args.rounds + 1):  # round 0 warms both servers; not counted
                for which in (("before", "after") if rnd % 2 else ("after", "before")):
                    url = servers[which][1]
                    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
                    if which == "after":
                        ctx.route(url + "/static/app.js", lambda route, _req=None: route.fulfill(
                            status=200, body=halted, headers={"content-type": "text/javascript; charset=utf-8"}))
                    page = ctx.new_page()
                    cdp = ctx.new_cdp_session(page)
                    cdp.send("Performance.enable", {"timeDomain": "threadTicks"})
                    page.goto(url + "/")
                    page.wait_for_selector("body[data-first='1']" if which == "after" else "body[data-ready='1']", state="attached")
                    cpu = 1000 * {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}["TaskDuration"]
                    ready = page.evaluate("performance.getEntriesByName('lab:ready')[0].startTime")
                    if rnd:
                        res[which].append((cpu, ready))
                    ctx.close()
            browser.close()
    finally:
        for proc, _ in servers.values():
            proc.terminate()
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}")
    for which, runs in res.items():
        print(f"{which:6}  main-thread CPU to the first screen: median {statistics.median(r[0] for r in runs):.1f} ms "
              f"(runs {[round(r[0], 1) for r in runs]}); lab:ready median {statistics.median(r[1] for r in runs):.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
