"""Browser tests: the real app under uvicorn on 127.0.0.1 (a free port, in a thread) and Debian's
Chromium driven by Playwright (no `playwright install`; see environment.md for the launch args).

Every page fixture records each request URL (WebSockets included), console error and page error;
`assert_clean(page)` fails a test whose page fetched anything outside the origin or logged an error.
It also records every action the page sends to the workspace API and every answer it gets, by POST
or over the workspace socket (lab/web/api_socket.py): `page.lab.actions`, `page.lab.answers`.
`new_page(websocket=False)` refuses the socket, as a proxy without WebSockets would: the page then
sends every action by POST.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

import pytest

CHROMIUM = os.environ.get("SLIME_LAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def lab_url() -> Iterator[str]:
    import uvicorn

    from lab.web.app import create_app

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=5)


# Module scope, not session: sync_playwright keeps an asyncio loop marked as running in the main
# thread while it is open, which would break every later test that calls asyncio.run().
@pytest.fixture(scope="module")
def chromium():
    if not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM):
        pytest.skip(f"Chromium not found at {CHROMIUM}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@dataclass
class Recorder:
    origin: str
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    actions: list[tuple[str, dict]] = field(default_factory=list)  # (transport, request body) per action
    answers: list[dict] = field(default_factory=list)  # the workspace API's successful answers

    def foreign(self) -> list[str]:
        own = self.origin.replace("http://", "ws://", 1)
        return [u for u in self.requests
                if not (u.startswith((self.origin + "/", own + "/")) or u == self.origin or u.startswith(("data:", "blob:")))]

    def posted(self) -> list[dict]:
        return [body for via, body in self.actions if via == "post"]


def _socket_frames(ws, rec: Recorder) -> None:
    def sent(payload) -> None:
        rec.actions.append(("socket", json.loads(str(payload).partition("\n")[2])))

    def received(payload) -> None:
        head, _, body = str(payload).partition("\n")
        if 200 <= json.loads(head)["status"] < 300:
            rec.answers.append(json.loads(body))

    rec.requests.append(ws.url)
    ws.on("framesent", sent)
    ws.on("framereceived", received)


def _record(page, rec: Recorder) -> None:
    def request(r) -> None:
        rec.requests.append(r.url)
        if r.method == "POST" and r.url.endswith("/api/workspace"):
            rec.actions.append(("post", json.loads(r.post_data)))

    def response(r) -> None:
        if r.request.method == "POST" and r.url.endswith("/api/workspace") and r.ok:
            rec.answers.append(r.json())

    page.on("request", request)
    page.on("response", response)
    page.on("websocket", lambda ws: _socket_frames(ws, rec))
    page.on("console", lambda m: rec.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: rec.errors.append(f"pageerror: {e}"))


@pytest.fixture
def new_page(chromium, lab_url):
    """A factory of pages, each in a fresh browser context (own localStorage), recorded."""
    contexts = []

    def make(path: str = "/", *, lang: str | None = None, width: int = 1280, height: int = 900, wait: bool = True,
             websocket: bool = True):
        ctx = chromium.new_context(viewport={"width": width, "height": height}, accept_downloads=True)
        contexts.append(ctx)
        if not websocket:
            ctx.route_web_socket("**/api/workspace/socket", lambda ws: ws.close())
        # Any request leaving the origin is recorded and aborted (so a leak fails fast and offline).
        rec = Recorder(origin=lab_url)

        def route(r):
            url = r.request.url
            if url.startswith(lab_url + "/") or url.startswith(("data:", "blob:")):
                r.continue_()
            else:
                r.abort()

        ctx.route("**/*", route)
        ctx.set_default_timeout(8_000)
        if lang:
            ctx.add_init_script(f"localStorage.getItem('slime-lab.lang') || localStorage.setItem('slime-lab.lang', '{lang}')")
        page = ctx.new_page()
        _record(page, rec)
        page.lab = rec  # type: ignore[attr-defined]
        if path is not None:
            page.goto(lab_url + path)
            if wait:
                wait_ready(page)
        return page

    yield make
    for ctx in contexts:
        ctx.close()


def wait_ready(page, rev: int | None = None) -> None:
    page.wait_for_selector("body[data-ready='1']", timeout=10_000)


def rev(page) -> int:
    return int(page.evaluate("Number(document.body.dataset.rev || 0)"))


def wait_until(page, expr: str, timeout_s: float = 10.0) -> None:
    """Wait until a JS expression is true. Not page.wait_for_function: it compiles its predicate with
    eval, which the lab's Content-Security-Policy forbids; page.evaluate is not subject to it."""
    deadline = time.monotonic() + timeout_s
    while not page.evaluate(expr):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for: {expr}")
        time.sleep(0.02)


def act(page, fn) -> None:
    """Run a UI action and wait until the page has drawn the API's answer to it."""
    before = rev(page)
    fn()
    wait_until(page, f"Number(document.body.dataset.rev || 0) > {before}")


def reveal(page, path: str) -> None:
    """Open the <details> around a field's control, as a user clicks its summary."""
    page.evaluate("""p => { let d = document.querySelector(`[data-field="${p}"]`).closest('details');
                          while (d) { d.open = true; d = d.parentElement.closest('details'); } }""", path)


def assert_clean(page) -> None:
    rec: Recorder = page.lab
    assert rec.foreign() == [], f"requests left the origin: {rec.foreign()}"
    assert rec.errors == [], f"console/page errors: {rec.errors}"
