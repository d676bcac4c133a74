"""Screenshots of the lab's diagrams for a few experiments, widths and languages (headless Chromium).

    PYTHONPATH=. python tools/lab_screenshots.py OUT_DIR

Starts the app under uvicorn on a free loopback port, builds each experiment through the API (the
same edits a user makes), stores it as the page's workspace, and saves one PNG per diagram:
OUT_DIR/<experiment>-<width>-<lang>-<diagram>.png, plus a docs page with formulas. For review, not
for tests: nothing here asserts a picture.
"""
from __future__ import annotations

import json
import socket
import sys
import threading
import time
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

EXPERIMENTS = {
    "dense": {"model.recipe": "glm4-9b"},
    "moe-pd": {"model.recipe": "glm4.7", "serving.pd.enabled": True, "serving.pd.prefill_engines": 1,
               "serving.pd.decode_engines": 3, "serving.pd.rdma_devices": ["mlx5_0"], "serving.hicache.enabled": True},
    "hybrid-async": {"model.recipe": "qwen3.8-27b", "placement.scheduling": "async", "rollout.queue": True},
}
DIAGRAMS = {"loop": ".loop", "layout": ".placement", "memory": "#memory", "tp": "#diag-tp", "pp": "#diag-pp",
            "ep": "#diag-ep", "cp": "#diag-cp", "zero": "#diag-zero", "serving": "#serving-diagram"}


def _serve():
    import uvicorn

    from lab.web.app import create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.02)
    return server, f"http://127.0.0.1:{port}"


def _workspace(edits: dict) -> dict:
    from fastapi.testclient import TestClient

    from lab.web.app import create_app

    c = TestClient(create_app(), base_url="http://127.0.0.1")
    ws = c.post("/api/workspace", json={"workspace": None, "action": {"type": "view"}}).json()["workspace"]
    for path, value in edits.items():  # one edit at a time, as a user clicks (dependent changes apply)
        r = c.post("/api/workspace", json={"workspace": ws, "action": {"type": "edit", "path": path, "value": value}})
        r.raise_for_status()
        ws = r.json()["workspace"]
    return ws


def main(out: Path) -> None:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    server, url = _serve()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for name, edits in EXPERIMENTS.items():
            ws = json.dumps(_workspace(edits))
            for width in (1280, 800):
                for lang in ("en", "zh"):
                    ctx = browser.new_context(viewport={"width": width, "height": 900})
                    ctx.add_init_script(f"localStorage.setItem('slime-lab.workspace', {json.dumps(ws)});"
                                        f"localStorage.setItem('slime-lab.lang', '{lang}');")
                    page = ctx.new_page()
                    page.goto(url + "/")
                    page.wait_for_selector("body[data-ready='1']")
                    page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
                    # The sticky top bar would cover a diagram taller than the viewport in its picture.
                    page.evaluate("document.querySelector('header.top').style.position = 'static'")
                    for diagram, sel in DIAGRAMS.items():
                        if diagram in ("tp", "pp", "ep", "cp", "zero"):
                            page.click(f"#tab-{diagram}")
                        el = page.locator(sel)
                        el.scroll_into_view_if_needed()
                        el.screenshot(path=str(out / f"{name}-{width}-{lang}-{diagram}.png"))
                    ctx.close()
        for lang in ("en", "zh"):
            ctx = browser.new_context(viewport={"width": 1280, "height": 1400})
            page = ctx.new_page()
            page.goto(f"{url}/docs/{lang}/corrections.md#tis-truncated-importance-sampling")
            page.screenshot(path=str(out / f"docs-{lang}-corrections.png"))
            ctx.close()
        browser.close()
    server.should_exit = True


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "out/screenshots"))
