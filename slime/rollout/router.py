"""The rollout router: one HTTP address in front of the engines, addressed like sglang-router.

    POST /generate            proxied to one engine (the reply is the engine's, unchanged; a
                              `stream: true` reply is relayed frame by frame as it arrives)
    POST /workers             {url, worker_type, bootstrap_port} -> 202 {id}
    GET  /workers             {workers: [{id, url, worker_type, is_healthy, load}], total, stats}
    DELETE /workers/{id}      deregister
    legacy: POST /add_worker?url=, POST /remove_worker?url=, GET /list_workers
    GET  /health

The client (slime/rollout/client.py) talks to it exactly as to an engine. Policy: requests with
an `X-SMG-Routing-Key` header go to the engine a consistent-hash ring assigns to the key (session
affinity for multi-turn; only that key's share moves when an engine joins or leaves); others to
the least-loaded healthy engine (ties broken round robin). At most `concurrency` requests are in
flight per engine (the others wait). An engine that drops a request (connection refused/reset:
it died) is marked unhealthy and the request is sent again to another engine, waiting up to
`retry_timeout` s for one to be (re)registered: a sample in flight on a dead engine is retried,
not lost. HTTP error answers are the engine's verdict and pass through unchanged.

With `--use-sglang-router` the runtime launches sglang-router (0.3.2 tested) in its place
(SGLangRouterProcess in a Ray actor); PD pairs need it (its PD mode, launched from the prefill and
decode groups): this router serves regular workers only.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import itertools
import json
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from slime.refusals import declare
from slime.rollout.http_thread import ThreadedServer

_R = declare("router", {
    "exited": ("code", "command"),
    "exited_log": ("code", "command", "log"),
    "no_answer": ("url", "seconds"),
})

ROUTING_KEY_HEADER = "X-SMG-Routing-Key"
VNODES = 64  # virtual nodes per engine on the hash ring


def _wants_stream(body: bytes) -> bool:
    """True for a JSON object with `"stream": true` (anything else is proxied whole, unchanged)."""
    if b'"stream"' not in body:
        return False
    try:
        data = json.loads(body)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("stream") is True


def _h(s: str) -> int:
    return int.from_bytes(hashlib.md5(s.encode()).digest()[:8], "big")


@dataclass
class Worker:
    id: str
    url: str
    worker_type: str = "regular"
    bootstrap_port: int | None = None
    healthy: bool = True
    load: int = 0
    served: int = 0
    sem: asyncio.Semaphore = field(default_factory=asyncio.Semaphore, repr=False)  # the router gives --concurrency slots

    def describe(self) -> dict[str, Any]:
        return {"id": self.id, "url": self.url, "worker_type": self.worker_type, "is_healthy": self.healthy,
                "load": self.load, "served": self.served, "bootstrap_port": self.bootstrap_port}


class RouterState:
    """Worker registry + policy; all methods run on the server's event loop."""

    def __init__(self, concurrency: int = 512, policy: str = "least_load", retry_timeout: float = 120.0):
        if policy not in ("least_load", "round_robin"):
            raise ValueError(f"router policy {policy!r}: least_load or round_robin")
        self.concurrency, self.policy, self.retry_timeout = concurrency, policy, retry_timeout
        self.workers: dict[str, Worker] = {}
        self._rr = itertools.count()
        self.retried = 0
        self.changed = asyncio.Event()

    def add(self, url: str, worker_type: str = "regular", bootstrap_port: int | None = None) -> Worker:
        url = url.rstrip("/")
        if worker_type not in ("regular", "prefill", "decode"):
            raise ValueError(f"unknown worker_type {worker_type!r}")
        if worker_type != "regular":
            raise ValueError("prefill/decode workers need sglang-router (PD pairing); this router serves "
                             "regular workers")
        for w in self.workers.values():
            if w.url == url:
                w.healthy = True
                self.changed.set()
                return w
        w = Worker(uuid.uuid4().hex[:12], url, worker_type, bootstrap_port, sem=asyncio.Semaphore(self.concurrency))
        self.workers[w.id] = w
        self.changed.set()
        return w

    def remove(self, worker_id: str) -> bool:
        ok = self.workers.pop(worker_id, None) is not None
        self.changed.set()
        return ok

    def by_url(self, url: str) -> Worker | None:
        url = url.rstrip("/")
        return next((w for w in self.workers.values() if w.url == url), None)

    def pick(self, key: str | None, exclude: set[str]) -> Worker | None:
        live = [w for w in self.workers.values() if w.healthy and w.id not in exclude]
        if not live:
            return None
        if key is not None:
            ring = sorted((_h(f"{w.url}#{v}"), w.url) for w in live for v in range(VNODES))
            i = bisect.bisect(ring, (_h(key), "")) % len(ring)
            return next(w for w in live if w.url == ring[i][1])
        start = next(self._rr)
        order = live[start % len(live):] + live[:start % len(live)]
        return order[0] if self.policy == "round_robin" else min(order, key=lambda w: w.load)


def create_router_app(state: RouterState, timeout: float = 14_400.0) -> FastAPI:
    app = FastAPI(title="slime router")
    http: dict[str, httpx.AsyncClient] = {}

    def client() -> httpx.AsyncClient:
        if "c" not in http:
            http["c"] = httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=5.0), trust_env=False,
                                          limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
        return http["c"]

    async def wait_for_worker(key: str | None, exclude: set[str], deadline: float) -> Worker | None:
        while True:
            w = state.pick(key, exclude)
            if w is not None or time.monotonic() > deadline:
                return w
            state.changed.clear()
            try:
                await asyncio.wait_for(state.changed.wait(), timeout=0.5)
            except asyncio.TimeoutError:
                pass
            exclude.clear()  # a re-registered engine may have the same url

    def no_engine() -> JSONResponse:
        return JSONResponse({"object": "error", "message": "no healthy engine behind the router "
                             f"after {state.retry_timeout:g} s", "type": "ServiceUnavailable", "code": 503},
                            status_code=503)

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request):
        body = await request.body()
        key = request.headers.get(ROUTING_KEY_HEADER)
        if _wants_stream(body):
            return await stream(body, key)
        tried: set[str] = set()
        deadline = time.monotonic() + state.retry_timeout
        while True:
            w = await wait_for_worker(key, tried, deadline)
            if w is None:
                return no_engine()
            w.load += 1
            try:
                async with w.sem:
                    resp = await client().post(w.url + "/generate", content=body,
                                               headers={"content-type": "application/json"})
            except httpx.TransportError:
                w.healthy = False  # it dropped the request: retry elsewhere (or on its replacement)
                tried.add(w.id)
                state.retried += 1
                continue
            finally:
                w.load -= 1
            w.served += 1
            return Response(resp.content, status_code=resp.status_code,
                            media_type=resp.headers.get("content-type", "application/json"))

    async def stream(body: bytes, key: str | None) -> Response:
        """A `stream: true` request: the engine's SSE bytes pass through as they arrive. Until the
        engine answers, a dropped connection is retried elsewhere like any request; after that the
        stream is the engine's. The engine's slot and load are held until the stream ends; a client
        that goes away closes the engine's stream (which aborts the request there)."""
        tried: set[str] = set()
        deadline = time.monotonic() + state.retry_timeout
        while True:
            w = await wait_for_worker(key, tried, deadline)
            if w is None:
                return no_engine()
            w.load += 1
            try:
                await w.sem.acquire()
            except BaseException:  # the client left while the engine's slots were full
                w.load -= 1
                raise
            try:
                req = client().build_request("POST", w.url + "/generate", content=body,
                                             headers={"content-type": "application/json"})
                resp = await client().send(req, stream=True)
            except httpx.TransportError:
                w.sem.release()
                w.load -= 1
                w.healthy = False
                tried.add(w.id)
                state.retried += 1
                continue
            except BaseException:
                w.sem.release()
                w.load -= 1
                raise
            break

        async def relay():
            try:
                async for chunk in resp.aiter_raw():
                    yield chunk
                w.served += 1
            finally:
                await resp.aclose()
                w.sem.release()
                w.load -= 1

        return StreamingResponse(relay(), status_code=resp.status_code,
                                 media_type=resp.headers.get("content-type", "text/event-stream"))

    @app.post("/workers")
    async def add_worker(request: Request):
        body = await request.json()
        try:
            w = state.add(body["url"], body.get("worker_type", "regular"), body.get("bootstrap_port"))
        except (KeyError, ValueError) as e:
            return JSONResponse({"error": {"message": f"cannot register worker: {e}"}}, status_code=400)
        return JSONResponse({"id": w.id, "url": w.url, "status": "accepted"}, status_code=202)

    @app.get("/workers")
    async def list_workers():
        ws = [w.describe() for w in state.workers.values()]
        return {"workers": ws, "total": len(ws),
                "stats": {"healthy": sum(w["is_healthy"] for w in ws), "retried_requests": state.retried}}

    @app.delete("/workers/{worker_id}")
    async def delete_worker(worker_id: str):
        w = state.workers.get(worker_id) or state.by_url(worker_id)
        if w is None:
            return JSONResponse({"error": {"message": f"no worker {worker_id}"}}, status_code=404)
        state.remove(w.id)
        return {"success": True, "message": f"removed {w.url}"}

    @app.post("/add_worker")
    async def add_worker_legacy(url: str):
        state.add(url)
        return {"success": True}

    @app.post("/remove_worker")
    async def remove_worker_legacy(url: str):
        w = state.by_url(url)
        if w:
            state.remove(w.id)
        return {"success": w is not None}

    @app.get("/list_workers")
    async def list_workers_legacy():
        return {"urls": [w.url for w in state.workers.values()]}

    @app.get("/health")
    async def health():
        return Response(status_code=200 if any(w.healthy for w in state.workers.values()) else 503)

    return app


class RouterServer(ThreadedServer):
    """The router app with uvicorn in a daemon thread (inside RouterActor, or a test process)."""

    def __init__(self, host: str = "127.0.0.1", port: int | None = None, concurrency: int = 512,
                 policy: str = "least_load", retry_timeout: float = 120.0):
        # asyncio primitives bind to the server's loop on first use (Python >= 3.10).
        self.state = RouterState(concurrency, policy, retry_timeout)
        super().__init__(create_router_app(self.state), host, port, "router-http")


def sglang_router_argv(host: str, port: int, policy: str = "cache_aware", worker_urls: list[str] | None = None,
                       health_interval_s: float = 10.0, health_timeout_s: float = 5.0,
                       python: str | None = None, prefill: list[tuple[str, int | None]] | None = None,
                       decode: list[str] | None = None) -> list[str]:
    """`python -m sglang_router.launch_router` with slime's settings (sglang-router 0.3.x): no
    circuit breaker, a 14,400 s request timeout, balance thresholds 10 / 1.2, health probes of
    GET /health. With prefill/decode workers, PD mode: `--pd-disaggregation --prefill URL
    BOOTSTRAP_PORT ... --decode URL ...` (the router pairs them and adds the bootstrap fields)."""
    import sys

    from slime.rollout.http_thread import free_port

    cmd = [python or sys.executable, "-m", "sglang_router.launch_router", "--host", host, "--port", str(port),
           "--policy", policy, "--disable-circuit-breaker", "--request-timeout-secs", "14400",
           "--balance-abs-threshold", "10", "--balance-rel-threshold", "1.2",
           "--health-check-endpoint", "/health",
           "--health-check-interval-secs", str(max(1, round(health_interval_s))),
           "--health-check-timeout-secs", str(max(1, round(health_timeout_s))),
           "--worker-startup-timeout-secs", "600", "--log-level", "warn",
           # its metrics exporter binds a fixed port (29000) by default: two routers on a host collide
           "--prometheus-host", host, "--prometheus-port", str(free_port(host))]
    if prefill or decode:
        cmd.append("--pd-disaggregation")
        for url, bootstrap in prefill or []:
            cmd += ["--prefill", url, *([str(bootstrap)] if bootstrap is not None else [])]
        for url in decode or []:
            cmd += ["--decode", url]
    elif worker_urls:
        cmd += ["--worker-urls", *worker_urls]
    return cmd


class SGLangRouterProcess:
    """sglang-router as a child process that dies with its parent (PR_SET_PDEATHSIG), so killing
    the actor that hosts it, or the run, stops the router too."""

    def __init__(self, host: str = "127.0.0.1", port: int | None = None, policy: str = "cache_aware",
                 health_interval_s: float = 10.0, health_timeout_s: float = 5.0, log_path: str | None = None,
                 worker_urls: list[str] | None = None, prefill: list[tuple[str, int | None]] | None = None,
                 decode: list[str] | None = None):
        from slime.rollout.http_thread import free_port

        self.host, self.port = host, port or free_port(host)
        self.cmd = sglang_router_argv(self.host, self.port, policy, worker_urls, health_interval_s, health_timeout_s,
                                      prefill=prefill, decode=decode)
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 60.0) -> str:
        log = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115 - the child keeps it
        self.proc = proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT if log else None,
                                            preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                if self.log_path:
                    raise RuntimeError(_R("exited_log", code=proc.returncode, command=" ".join(self.cmd),
                                          log=str(self.log_path)))
                raise RuntimeError(_R("exited", code=proc.returncode, command=" ".join(self.cmd)))
            try:
                if httpx.get(self.url + "/workers", timeout=2, trust_env=False).status_code == 200:
                    return self.url
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(_R("no_answer", url=self.url, seconds=f"{timeout:g}"))

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except Exception:  # noqa: BLE001 - it ignored SIGTERM
            self.proc.kill()
            self.proc.wait(timeout=5)


def _die_with_parent() -> None:
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:  # not Linux: stop() still ends it
        pass


def split_evenly(n: int, k: int) -> list[range]:
    """n items into k contiguous shares whose sizes differ by at most 1 (empty shares dropped)."""
    out, start = [], 0
    for i in range(k):
        size = n // k + (1 if i < n % k else 0)
        if size:
            out.append(range(start, start + size))
        start += size
    return out
