"""Prefill/decode disaggregation for the embedded engine, on SGLang's bootstrap protocol.

sglang-router in PD mode (`--pd-disaggregation --prefill URL BOOTSTRAP_PORT --decode URL`) sends
each /generate to one prefill and one decode engine at once, the same body with `bootstrap_host`
(the prefill engine's host), `bootstrap_port` (the port registered with the prefill worker) and
`bootstrap_room` (a random id; a list, one per prompt, for a batch) added, and answers the
decode engine's reply. Here:

- The prefill engine (`disaggregation_mode` prefill) runs the prompts' prefill forward only and
  keeps each prompt's KV cache and last-position logits under its room. Its bootstrap server
  (`/server_info` disaggregation_bootstrap_port; a free port, so that several prefill engines
  share a host) answers POST /kv/pull: it writes that room's KV + logits into the buffer the
  decode engine registered, with Mooncake's transfer engine (`transfer_sync_write`; TCP, or RDMA
  with `--sglang-disaggregation-ib-device`), then answers the layout and the weight version. The
  prefill request answers once its rooms were pulled.
- The decode engine (`disaggregation_mode` decode) registers a receive buffer of the size the
  prompt's KV takes, asks the prefill engine's bootstrap server to fill it, and seats the KV in
  its own cache: it samples the first token from the transferred logits and decodes from there,
  with no forward pass over the prompt (its `kv_transfer.prefill_forward_tokens` stays 0). `n`
  samples of one prompt share one transfer.
- A KV cache computed on other weights than the decode engine serves, a prefill engine that
  vanished or a failed transfer: the decode engine answers 503 naming it; the router passes the
  error on and the rollout manager sends the request again (same seeds, same samples).

Counters (`/server_info` kv_transfer): bytes sent / received, transfers, failures, and the
prompt tokens each engine ran through a prefill forward.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import torch
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from slime.inference.engine_core import EngineCore, EngineError, GenerateRequest

PD_FIELDS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")
MODES = ("prefill", "decode")


class PDError(ValueError):
    """An engine that cannot serve the PD role it was given (refused at start)."""


def _expand_rooms(value: Any, rows: int, name: str) -> list[Any]:
    if isinstance(value, list):
        if len(value) != rows:
            raise ValueError(f"{name}: {len(value)} values for {rows} prompts")
        return value
    return [value] * rows


@dataclass
class _Entry:
    """One room's prefill output waiting for its decode engine."""

    kv: torch.Tensor  # [layers, 2, kv_heads, length, head_dim]
    logits: torch.Tensor  # [vocab]
    version: str
    taken: threading.Event = field(default_factory=threading.Event)
    error: str | None = None


class PDRole:
    """The PD side of one embedded engine: its Mooncake endpoint, and (prefill) its bootstrap
    server and the rooms waiting to be pulled."""

    def __init__(self, core: EngineCore, mode: str, host: str = "127.0.0.1", backend: str = "mooncake",
                 ib_device: str = "", timeout_s: float = 300.0):
        from slime.inference.decoder import SlotDecoder

        # the flag checks (slime/backends/embedded/capabilities.py) refuse these before start
        if mode not in MODES:
            raise PDError(f"disaggregation_mode {mode!r}: the embedded engine serves null, prefill or decode")
        if backend != "mooncake":
            raise PDError(f"disaggregation_transfer_backend {backend!r}: the embedded engine moves KV with mooncake")
        if not isinstance(core.batcher.decoder, SlotDecoder):
            raise PDError(f"{core.model.config.model_type}: PD needs the engine's KV-cache fast path")
        from slime.sync.mooncake import Endpoint

        self.core, self.mode, self.host, self.timeout_s = core, mode, host, timeout_s
        self.protocol = "rdma" if ib_device else "tcp"
        self.ep = Endpoint(host, self.protocol, ib_device)
        self.stats = {"bytes_sent": 0, "bytes_received": 0, "transfers": 0, "failures": 0}
        self._lock = threading.Lock()
        self._cv = threading.Condition()
        self._outbox: dict[int, _Entry] = {}
        self.bootstrap = None
        self.http = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=5.0), trust_env=False)
        if mode == "prefill":
            from slime.rollout.http_thread import ThreadedServer

            self.bootstrap = ThreadedServer(self._bootstrap_app(), host, None, "pd-bootstrap")
            self.bootstrap.start()

    @property
    def bootstrap_port(self) -> int | None:
        return self.bootstrap.port if self.bootstrap is not None else None

    def wants(self, body: dict[str, Any]) -> bool:
        return any(body.get(k) is not None for k in PD_FIELDS)

    def info(self) -> dict[str, Any]:
        return {"disaggregation_mode": self.mode, "disaggregation_bootstrap_port": self.bootstrap_port,
                "disaggregation_transfer_backend": "mooncake",
                "kv_transfer": {**self.stats, "protocol": self.protocol, "session_id": self.ep.session_id,
                                "prefill_forward_tokens": self.core.batcher.prefilled_tokens}}

    def stop(self) -> None:
        if self.bootstrap is not None:
            self.bootstrap.stop()
        with self._cv:
            for e in self._outbox.values():
                e.error = "the prefill engine is shutting down"
                e.taken.set()
            self._cv.notify_all()
        self.http.close()

    def _count(self, **inc: int) -> None:
        with self._lock:
            for k, v in inc.items():
                self.stats[k] += v

    # -- prefill ----------------------------------------------------------------------------------
    def prefill(self, body: dict[str, Any], parse) -> list[dict[str, Any]] | dict[str, Any]:
        """Run the prompts' prefill, hold each room's KV until the decode engine pulled it
        (blocking: called in a worker thread). parse: embedded._parse_generate."""
        sp = body.get("sampling_params") or {}
        one = [{**s, "n": 1} for s in sp] if isinstance(sp, list) else {**sp, "n": 1}  # one KV per prompt
        req, is_list = parse({**{k: v for k, v in body.items() if k not in PD_FIELDS}, "sampling_params": one},
                             self.core)
        rooms = [int(r) for r in _expand_rooms(body.get("bootstrap_room"), len(req.input_ids), "bootstrap_room")]
        req.export = True
        outs = self.core.generate(req)
        entries = [_Entry(kv.contiguous(), logits, outs[0]["meta_info"]["weight_version"])
                   for kv, logits in req.exported]
        with self._cv:
            self._outbox.update(zip(rooms, entries))
            self._cv.notify_all()
        deadline = time.monotonic() + self.timeout_s
        try:
            for room, e in zip(rooms, entries):
                if not e.taken.wait(max(0.0, deadline - time.monotonic())):
                    raise EngineError(f"bootstrap room {room}: no decode engine pulled the KV cache within "
                                      f"{self.timeout_s:g} s", 504)
                if e.error:
                    raise EngineError(f"bootstrap room {room}: {e.error}", 503)
        finally:
            with self._cv:
                for room in rooms:
                    self._outbox.pop(room, None)
        for o in outs:
            o["meta_info"]["input_token_logprobs"] = []
        return outs if is_list else outs[0]

    def _pull(self, room: int, session_id: str, ptr: int, nbytes: int) -> dict[str, Any]:
        """The bootstrap server's side of a transfer: wait for the room, write it, answer its layout."""
        from slime.sync.mooncake import bucket_layout

        deadline = time.monotonic() + self.timeout_s
        with self._cv:
            while room not in self._outbox:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise EngineError(f"bootstrap room {room}: no such prefill request within {self.timeout_s:g} s",
                                      404)
                self._cv.wait(min(left, 1.0))
            e = self._outbox[room]
        size, meta = bucket_layout({"kv": e.kv, "logits": e.logits})
        if size > nbytes:
            e.error = f"the decode engine's buffer holds {nbytes} bytes, the KV cache takes {size}"
            e.taken.set()
            raise EngineError(e.error, 400)
        buf = torch.empty(size, dtype=torch.uint8)
        for m, t in zip(meta, (e.kv, e.logits)):
            buf[m["offset"]:m["offset"] + m["nbytes"]].copy_(t.contiguous().view(-1).view(torch.uint8))
        eng = self.ep.engine
        if eng.register_memory(buf.data_ptr(), size) != 0:
            raise EngineError(f"registering a {size}-byte send buffer with Mooncake failed", 503)
        try:
            rc = int(eng.transfer_sync_write(session_id, buf.data_ptr(), int(ptr), size))
        finally:
            eng.unregister_memory(buf.data_ptr())
        if rc != 0:
            self._count(failures=1)
            e.error = f"Mooncake write of {size} bytes to {session_id} failed (rc {rc})"
            e.taken.set()
            raise EngineError(e.error, 503)
        self._count(bytes_sent=size, transfers=1)
        e.taken.set()
        return {"layout": meta, "nbytes": size, "weight_version": e.version}

    def _bootstrap_app(self) -> FastAPI:
        app = FastAPI(title="slime embedded PD bootstrap")

        @app.get("/health")
        async def health():
            return {"session_id": self.ep.session_id}

        @app.post("/kv/pull")
        async def pull(request: Request):
            b = await request.json()
            try:
                out = await run_in_threadpool(self._pull, int(b["room"]), str(b["session_id"]), int(b["ptr"]),
                                              int(b["nbytes"]))
            except EngineError as e:
                return JSONResponse({"error": {"message": str(e)}}, status_code=e.status)
            except (KeyError, TypeError, ValueError) as e:
                return JSONResponse({"error": {"message": f"bad pull request: {e}"}}, status_code=400)
            return out

        return app

    # -- decode -----------------------------------------------------------------------------------
    def kv_nbytes(self, length: int) -> int:
        """Bytes of one prompt's KV cache + last logits as the prefill engine lays them out (same model)."""
        from slime.inference.decoder import SlotDecoder
        from slime.sync.mooncake import bucket_layout

        d = self.core.batcher.decoder
        assert isinstance(d, SlotDecoder)  # checked when the PD role was set up
        kv = torch.empty((len(d.model.model.layers), 2, d.n_kv, length, d.head_dim), dtype=self.core.dtype,
                         device="meta")
        logits = torch.empty((d.model.config.vocab_size,), dtype=self.core.dtype, device="meta")
        return bucket_layout({"kv": kv, "logits": logits})[0]

    def _fetch(self, host: str, port: int, room: int, length: int) -> tuple[tuple, str]:
        from slime.sync.mooncake import unpack

        nbytes = self.kv_nbytes(length)
        buf = torch.empty(nbytes, dtype=torch.uint8)
        eng = self.ep.engine
        if eng.register_memory(buf.data_ptr(), nbytes) != 0:
            raise EngineError(f"registering a {nbytes}-byte receive buffer with Mooncake failed", 503)
        url = f"http://{host}:{port}/kv/pull"
        try:
            r = self.http.post(url, json={"room": room, "session_id": self.ep.session_id, "ptr": buf.data_ptr(),
                                          "nbytes": nbytes})
        except httpx.HTTPError as e:
            self._count(failures=1)
            raise EngineError(f"prefill engine's bootstrap server {host}:{port} (room {room}) failed: {e!r}; "
                              f"retry the request", 503) from e
        finally:
            eng.unregister_memory(buf.data_ptr())
        if r.status_code != 200:
            self._count(failures=1)
            raise EngineError(f"prefill engine's bootstrap server {host}:{port} (room {room}): HTTP "
                              f"{r.status_code} {r.text[:300]}; retry the request", 503)
        got = r.json()
        t = unpack(buf, got["layout"])
        kv, logits = t["kv"].clone(), t["logits"].clone()
        if kv.shape[-2] != length:
            raise EngineError(f"room {room}: the prefill engine sent {kv.shape[-2]} positions for a "
                              f"{length}-token prompt", 503)
        self._count(bytes_received=int(got["nbytes"]), transfers=1)
        return (kv, logits), str(got["weight_version"])

    def decode_request(self, body: dict[str, Any], parse) -> tuple[GenerateRequest, bool]:
        """The request with each prompt's KV pulled from its prefill engine (blocking)."""
        req, is_list = parse({k: v for k, v in body.items() if k not in PD_FIELDS}, self.core)
        prompts = _prompt_rows(body, req)
        hosts = _expand_rooms(body.get("bootstrap_host"), len(prompts), "bootstrap_host")
        ports = _expand_rooms(body.get("bootstrap_port"), len(prompts), "bootstrap_port")
        rooms = _expand_rooms(body.get("bootstrap_room"), len(prompts), "bootstrap_room")
        if any(p is None for p in ports) or any(r is None for r in rooms):
            raise EngineError("bootstrap_port and bootstrap_room are required in PD mode (register the prefill "
                              "worker with its bootstrap port)", 400)
        fetched = [self._fetch(str(h), int(p), int(r), len(prompt))
                   for (prompt, _), h, p, r in zip(prompts, hosts, ports, rooms)]
        versions = {v for _, v in fetched}
        if len(versions) != 1:
            raise EngineError(f"the prompts' KV caches come from weight versions {sorted(versions)}; retry", 503)
        req.kv_in = [got for (_, n), (got, _) in zip(prompts, fetched) for _ in range(n)]
        req.kv_version = versions.pop()
        return req, is_list


def _prompt_rows(body: dict[str, Any], req: GenerateRequest) -> list[tuple[list[int], int]]:
    """(prompt, n) of each prompt of the request, before the n-expansion."""
    sp = body.get("sampling_params") or {}
    out: list[tuple[list[int], int]] = []
    i = 0
    while i < len(req.input_ids):
        n = int((sp[len(out)] if isinstance(sp, list) else sp).get("n", 1))
        out.append((req.input_ids[i], n))
        i += n
    return out


def pd_role(core: EngineCore, server_args: dict[str, Any] | None, host: str) -> PDRole | None:
    """The role `disaggregation_mode` asks for (None: a regular engine)."""
    a = server_args or {}
    mode = a.get("disaggregation_mode") or "null"
    if mode == "null":
        return None
    return PDRole(core, mode, host, a.get("disaggregation_transfer_backend") or "mooncake",
                  a.get("disaggregation_ib_device") or "")
