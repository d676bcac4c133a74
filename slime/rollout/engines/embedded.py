"""The embedded engine's HTTP server: the SGLang protocol subset of sglang-protocol.md in front
of slime.inference.engine_core.EngineCore. FastAPI + uvicorn in a background thread,
bound to 127.0.0.1 on a free port (a Ray actor hosts it: slime/ray/actors.py).

Weight hand-off formats of POST /update_weights_from_tensor (one entry in
`serialized_named_tensors`, since an embedded engine is one "TP rank"):
- load_format "safetensors": base64 of safetensors bytes of {name: tensor} (never pickle).
- load_format "ray_staged": the entry is a staging key. The bucket travelled through Ray's object
  store into the engine's host actor beforehand (EngineActor.stage_bucket, a Ray call, so the
  ObjectRef is reference-counted and freed: pickling an ObjectRef into an HTTP body instead pins
  it in the object store for the owner's lifetime, measured with Ray 2.60). This is the CPU
  analogue of SGLang's CUDA-IPC handles: the payload moves out of band, HTTP carries the handle
  and the versioned commit.
- load_format "cuda_ipc": the staged entry is a CUDA IPC handle of a bucket that stays in the
  colocated trainer's GPU memory (slime/sync/cuda_ipc.py); the engine copies from it on the GPU,
  with no host copy.
Distributed updates (`/init_weights_update_group`, `/update_weights_from_distributed`): the
engine is one rank (`rank_offset`) of a process group the trainer's rank 0 hosts
(slime/sync/dist_group.py): gloo on CPU, nccl where the engine runs on a GPU. The update request
receives one broadcast per name in list order and answers after the last one; a stale version
is refused only after receiving (refusing early would leave the trainer's broadcast hanging).
Extension: `is_last_bucket` (default true): a bucketed update commits its weight_version with
its last bucket; until then the same version may continue and any other is refused.

Streaming (`"stream": true`): server-sent events as SGLang sends them, `data: <json>` frames and a
closing `data: [DONE]`. Frames are cumulative (text, output_ids and log-probs since the request
began, as SGLang without --stream-output): one per new token of a row, or per small group of
tokens when the client reads slower than the engine decodes; finish_reason is null until the
row's last frame, which equals the non-streamed answer (an abort ends the stream with SGLang's
`abort` finish_reason and the output so far). A batch or `n > 1` stream tags each frame with its
`index`. A client that disconnects aborts its request.
Disaggregation: with `disaggregation_mode` prefill or decode (server_args) the engine serves that
role of SGLang's bootstrap protocol, moving the prompt's KV cache over Mooncake
(slime/rollout/engines/pd.py). A regular engine (`disaggregation_mode` "null") refuses a request
carrying the bootstrap fields with 400, so a PD router in front of it fails loudly instead of
having both engines generate it all.
Seeds: a batch that shares one `sampling_params` (what goes through sglang-router) offsets its
`sampling_seed` per row and per sample (seed + row * n + k), so its rows differ and repeat.
Load: `GET /get_load` answers SGLang's per-DP-rank list (what sglang-router polls for its
load-aware policies) beside `GET /v1/loads`.
"""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from slime.inference.engine_core import EngineCore, EngineError, GenerateRequest, new_rid
from slime.inference.sampler import RowParams
from slime.rollout.http_thread import ThreadedServer, free_port  # noqa: F401  (free_port: re-exported)

SUPPORTED_UPDATES = ["update_weights_from_disk", "update_weights_from_tensor", "init_weights_update_group",
                     "update_weights_from_distributed", "destroy_weights_update_group",
                     "init_weights_transfer_engine", "update_weights_from_transfer_engine"]
TENSOR_FORMATS = ["safetensors", "ray_staged", "cuda_ipc"]
PD_FIELDS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")


def _handler_error(msg: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": msg}}, status_code=status)


def _schema_error(msg: str) -> JSONResponse:
    return JSONResponse({"object": "error", "message": msg, "type": "BadRequestError", "code": 400},
                        status_code=400)


def _control(ok: bool, msg: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"success": ok, "message": msg, **extra}, status_code=200 if ok else 400)


def _row_params(sp: dict[str, Any]) -> RowParams:
    known = {"max_new_tokens", "temperature", "top_p", "top_k", "stop_token_ids", "n", "sampling_seed",
             "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
             "min_p", "stop", "custom_params"}
    unknown = set(sp) - known
    if unknown:
        raise ValueError(f"unsupported sampling_params: {sorted(unknown)}")
    temp = float(sp.get("temperature", 1.0))
    top_k = int(sp.get("top_k", -1))
    if temp == 0:  # SGLang: temperature 0 is greedy (top_k 1)
        temp, top_k = 1.0, 1
    top_p = float(sp.get("top_p", 1.0))
    if not 0 < top_p <= 1:
        raise ValueError("top_p must lie in (0, 1]")
    seed = sp.get("sampling_seed")
    return RowParams(int(sp.get("max_new_tokens", 128)), temp, top_p, top_k,
                     tuple(sp.get("stop_token_ids") or ()), bool(sp.get("ignore_eos", False)),
                     None if seed is None else int(seed))


def _parse_generate(body: dict[str, Any], core: EngineCore) -> tuple[GenerateRequest, bool]:
    pd = [k for k in PD_FIELDS if body.get(k) is not None]
    if pd:
        raise ValueError(f"{', '.join(pd)}: this engine does not serve prefill/decode disaggregation "
                         f"(disaggregation_mode null); register it as a regular worker, not behind a PD router")
    if "input_ids" in body:
        ids = body["input_ids"]
        batch = bool(ids) and isinstance(ids[0], list)
        prompts = ids if batch else [ids]
    elif "text" in body:
        texts = body["text"]
        batch = isinstance(texts, list)
        prompts = [core.tokenizer(t, add_special_tokens=False)["input_ids"] for t in (texts if batch else [texts])]
    else:
        raise ValueError("one of input_ids or text is required")
    if not prompts or any(not p for p in prompts):
        raise ValueError("empty prompt")
    sp = body.get("sampling_params") or {}
    sps = sp if isinstance(sp, list) else [sp] * len(prompts)
    if len(sps) != len(prompts):
        raise ValueError(f"{len(sps)} sampling_params for {len(prompts)} prompts")
    rid = body.get("rid")
    rids_in = rid if isinstance(rid, list) else [f"{rid}_{i}" if batch and rid else (rid or new_rid())
                                                  for i in range(len(prompts))]
    shared = not isinstance(sp, list)
    exp_ids, exp_params, exp_rids = [], [], []
    for row, (p, s, r) in enumerate(zip(prompts, sps, rids_in)):
        n = int(s.get("n", 1))
        rp = _row_params(s)
        for k in range(n):
            exp_ids.append([int(t) for t in p])
            # n samples must differ, and so must the rows of a batch that shares one seed
            seed = None if rp.seed is None else rp.seed + (row * n if shared else 0) + k
            exp_params.append(RowParams(**{**rp.__dict__, "seed": seed}))
            exp_rids.append(r if n == 1 else f"{r}_{k}")
    is_list = batch or len(exp_ids) > 1
    return GenerateRequest(exp_ids, exp_params, exp_rids, bool(body.get("return_logprob", False))), is_list


class StagingArea:
    """Buckets handed over out of band (see module docstring), keyed by a one-time key."""

    def __init__(self) -> None:
        # safetensors bytes (load_format ray_staged) or a CUDA IPC handle dict (cuda_ipc)
        self._items: dict[str, Any] = {}
        self._lock = threading.Lock()

    def put(self, key: str, payload: Any) -> None:
        with self._lock:
            self._items[key] = payload

    def pop(self, key: str) -> Any:
        with self._lock:
            if key not in self._items:
                raise KeyError(f"no staged bucket {key!r} (stage it before posting its handle)")
            return self._items.pop(key)


def create_app(core: EngineCore, server_args: dict[str, Any] | None = None,
               staging: StagingArea | None = None, pd: Any = None) -> FastAPI:
    """pd: the engine's PDRole (slime/rollout/engines/pd.py), None for a regular engine."""
    staging = staging or StagingArea()
    app = FastAPI(title="slime embedded engine")
    state = {"ready": True, "paused": False}
    groups: dict[str, Any] = {}
    transfer: dict[str, Any] = {}  # "rx": this engine's Mooncake receiver (slime/sync/mooncake.py)

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request):
        try:
            body = await request.json()
            disagg = pd is not None and isinstance(body, dict) and pd.wants(body)
            if not disagg:
                req, is_list = _parse_generate(body, core)
        except Exception as e:  # noqa: BLE001 - every parse problem is a schema error
            return _schema_error(str(e))
        while state["paused"]:  # /pause_generation: new requests wait for /continue_generation
            await asyncio.sleep(0.01)
        if disagg:  # prefill: compute and hand over the KV; decode: fetch it, then generate as usual
            try:
                if pd.mode == "prefill":
                    return JSONResponse(await run_in_threadpool(pd.prefill, body, _parse_generate))
                req, is_list = await run_in_threadpool(pd.decode_request, body, _parse_generate)
            except EngineError as e:
                return _handler_error(str(e), e.status)
            except (ValueError, TypeError, KeyError) as e:
                return _schema_error(str(e))
        if body.get("stream"):
            return StreamingResponse(_sse(core, req, is_list), media_type="text/event-stream")
        try:
            outs = await run_in_threadpool(core.generate, req)
        except EngineError as e:
            return _handler_error(str(e), e.status)
        return JSONResponse(outs if is_list else outs[0])

    @app.get("/health")
    async def health():
        return PlainTextResponse("", status_code=200 if state["ready"] else 503)

    @app.get("/health_generate")
    async def health_generate():
        if core.released:
            return PlainTextResponse("", status_code=503)
        req = GenerateRequest([[core.pad_id]], [RowParams(max_new_tokens=1)], [new_rid()], False)
        await run_in_threadpool(core.generate, req)
        return PlainTextResponse("", status_code=200)

    @app.post("/pause_generation")
    async def pause_generation(request: Request):
        body = await _json_or_empty(request)
        state["paused"] = True
        if body.get("mode", "abort") == "abort":
            core.abort(abort_all=True)
        return {"message": "Generation paused.", "status": "ok"}

    @app.post("/continue_generation")
    async def continue_generation():
        state["paused"] = False
        return {"message": "Generation continued.", "status": "ok"}

    @app.get("/get_load")
    async def get_load():
        # SGLang's (deprecated, still polled by sglang-router) shape: one entry per DP rank.
        return [{"dp_rank": 0, "num_reqs": core.busy, "num_waiting_reqs": 0, "num_tokens": core.busy}]

    @app.get("/v1/loads")
    async def loads():
        return {"timestamp": time.time(), "version": "embedded-0.1", "accelerator": core.device.type,
                "num_accelerators": 1, "loads": [{"dp_rank": 0, "num_running_reqs": core.busy,
                                                  "num_waiting_reqs": 0}]}

    @app.post("/init_weights_update_group")
    async def init_group(request: Request):
        from slime.sync.dist_group import WeightGroup

        body = await _json_or_empty(request)
        try:
            backend = body.get("backend", "nccl")
            if backend == "nccl" and core.device.type != "cuda":
                return _control(False, "backend nccl needs a GPU engine; this embedded engine runs on CPU: use gloo")
            name = body.get("group_name", "weight_update_group")
            groups[name] = await run_in_threadpool(
                WeightGroup, body["master_address"], int(body["master_port"]), int(body["rank_offset"]),
                int(body["world_size"]), name, backend)
        except Exception as e:  # noqa: BLE001 - joining failed: say why, in the control shape
            return _control(False, f"init_weights_update_group failed: {e!r}")
        return _control(True, f"joined {name} as rank {body['rank_offset']} of {body['world_size']}")

    @app.post("/destroy_weights_update_group")
    async def destroy_group(request: Request):
        body = await _json_or_empty(request)
        g = groups.pop(body.get("group_name", "weight_update_group"), None)
        if g is not None:
            g.destroy()
        return _control(True, "destroyed" if g else "no such group")

    @app.post("/update_weights_from_distributed")
    async def update_from_distributed(request: Request):
        import torch

        from slime.sync.dist_group import DTYPES

        body = await _json_or_empty(request)
        g = groups.get(body.get("group_name", "weight_update_group"))
        if g is None:
            return _control(False, f"no weight update group {body.get('group_name')!r}: "
                                   f"POST /init_weights_update_group first")
        names, dtypes, shapes = body.get("names", []), body.get("dtypes", []), body.get("shapes", [])
        if not len(names) == len(dtypes) == len(shapes):
            return _schema_error("names, dtypes and shapes must have the same length")

        def receive() -> dict[str, Any]:
            return {n: g.broadcast(torch.empty(tuple(s), dtype=DTYPES[d], device=g.device))
                    for n, d, s in zip(names, dtypes, shapes)}

        named = await run_in_threadpool(receive)
        try:
            await run_in_threadpool(core.update_from_named, named, body.get("weight_version"),
                                    bool(body.get("is_last_bucket", True)))
        except (EngineError, KeyError, ValueError) as e:
            return _control(False, f"update_weights_from_distributed failed: {e}")
        return _control(True, "ok")

    @app.post("/init_weights_transfer_engine")
    async def init_transfer_engine(request: Request):
        """Mooncake receive buffers, one per bucket size (slime/sync/mooncake.py)."""
        from slime.sync.mooncake import MooncakeError, MooncakeReceiver

        body = await _json_or_empty(request)
        sizes = body.get("bucket_sizes")
        if not isinstance(sizes, list) or not all(isinstance(n, int) and n >= 0 for n in sizes):
            return _schema_error("bucket_sizes must be a list of byte counts")
        try:
            if "rx" not in transfer:
                host = request.url.hostname or "127.0.0.1"
                transfer["rx"] = await run_in_threadpool(MooncakeReceiver, host, body.get("protocol") or "tcp",
                                                         body.get("device_name") or "")
            info = await run_in_threadpool(transfer["rx"].register, sizes)
        except MooncakeError as e:
            return _control(False, f"init_weights_transfer_engine failed: {e}")
        return _control(True, f"{len(sizes)} buffers registered", **info)

    @app.post("/update_weights_from_transfer_engine")
    async def update_from_transfer_engine(request: Request):
        body = await _json_or_empty(request)
        rx = transfer.get("rx")
        if rx is None:
            return _control(False, "no Mooncake buffers: POST /init_weights_transfer_engine first")
        try:
            named = rx.bucket(int(body.get("bucket", -1)), body.get("metadata") or [])
            await run_in_threadpool(core.update_from_named, named, body.get("weight_version"),
                                    bool(body.get("is_last_bucket", True)))
        except (EngineError, KeyError, ValueError, TypeError, RuntimeError) as e:
            return _control(False, f"update_weights_from_transfer_engine failed: {e}")
        return _control(True, "ok")

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info():
        return {"model_path": core.hf_checkpoint, "tp_size": 1, "dp_size": 1, "ep_size": 1,
                "weight_version": core.weight_version,
                "max_req_input_len": int(getattr(core.model.config, "max_position_embeddings", 0) or 0),
                "weight_update_endpoints": SUPPORTED_UPDATES, "tensor_load_formats": TENSOR_FORMATS,
                "weight_update_backends": ["gloo", "nccl"] if core.device.type == "cuda" else ["gloo"],
                "engine": "slime-embedded", "version": "embedded-0.1", **(server_args or {}),
                # what it serves, whatever --sglang-* fields it was handed (see the docstring)
                **(pd.info() if pd is not None else {"disaggregation_mode": "null",
                                                     "disaggregation_bootstrap_port": None})}

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info():
        return core.model_info()

    @app.get("/get_weight_version")
    @app.get("/weight_version")
    async def weight_version():
        return {"weight_version": core.weight_version}

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        try:
            core.flush_cache()
        except EngineError as e:
            return PlainTextResponse(str(e), status_code=400)
        return PlainTextResponse("Cache flushed.", status_code=200)

    @app.post("/abort_request")
    async def abort_request(request: Request):
        body = await _json_or_empty(request)
        core.abort(str(body.get("rid", "")), bool(body.get("abort_all", False)))
        return PlainTextResponse("", status_code=200)

    @app.api_route("/release_memory_occupation", methods=["GET", "POST"])
    async def release(request: Request):
        body = await _json_or_empty(request)
        try:
            await run_in_threadpool(core.release, body.get("tags"))
        except EngineError as e:
            return _handler_error(str(e), e.status)
        return JSONResponse(None)

    @app.api_route("/resume_memory_occupation", methods=["GET", "POST"])
    async def resume(request: Request):
        body = await _json_or_empty(request)
        await run_in_threadpool(core.resume, body.get("tags"))
        return JSONResponse(None)

    @app.post("/update_weights_from_disk")
    async def update_from_disk(request: Request):
        body = await _json_or_empty(request)
        if "model_path" not in body:
            return _schema_error("model_path is required")
        try:
            await run_in_threadpool(core.update_from_disk, body["model_path"], body.get("weight_version"))
        except (EngineError, FileNotFoundError, KeyError, ValueError) as e:
            return _control(False, f"update_weights_from_disk failed: {e}")
        return _control(True, f"loaded {body['model_path']}", num_paused_requests=0)

    @app.post("/update_weights_from_tensor")
    async def update_from_tensor(request: Request):
        body = await _json_or_empty(request)
        entries = body.get("serialized_named_tensors")
        fmt = body.get("load_format") or "safetensors"
        if not isinstance(entries, list) or len(entries) != 1:
            return _schema_error("serialized_named_tensors must be a list with one entry (one TP rank)")
        if fmt not in TENSOR_FORMATS:
            return _schema_error(f"load_format {fmt!r} not supported; use one of {TENSOR_FORMATS}")
        try:
            last = bool(body.get("is_last_bucket", True))
            if fmt == "cuda_ipc":
                await run_in_threadpool(_update_from_ipc, core, staging.pop(entries[0]), body.get("weight_version"),
                                        last)
            else:
                payload = staging.pop(entries[0]) if fmt == "ray_staged" else base64.b64decode(entries[0])
                await run_in_threadpool(core.update_from_bytes, payload, body.get("weight_version"), last)
        except (EngineError, KeyError, ValueError) as e:
            return _control(False, f"update_weights_from_tensor failed: {e}")
        return _control(True, "ok")

    return app


async def _sse(core: EngineCore, req: GenerateRequest, is_list: bool):
    """SSE frames of one generate request (see module docstring); errors as an error frame.

    The batcher reports each new token; every wake-up sends one cumulative frame per row that
    grew (one token, or the few that arrived meanwhile), finish_reason null. The final frame of
    each row is the non-streamed answer itself (an abort's included). A client that goes away
    aborts its rows, as SGLang does on disconnect."""
    import json

    loop = asyncio.get_running_loop()
    news: asyncio.Queue = asyncio.Queue()

    def on_token(i: int, result: Any) -> None:  # the batcher's thread: hand over, nothing more
        n = len(result.output_ids)
        try:
            loop.call_soon_threadsafe(news.put_nowait, (i, result, n))
        except RuntimeError:  # the event loop is gone (server stopping)
            pass

    def frame(i: int, out: dict[str, Any]) -> str:
        return f"data: {json.dumps({**out, 'index': i} if is_list else out)}\n\n"

    task = asyncio.ensure_future(run_in_threadpool(core.generate, req, on_token))
    getter: asyncio.Future | None = None
    finished = False
    try:
        while not task.done():
            getter = asyncio.ensure_future(news.get())
            await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                continue
            i, res, n = getter.result()
            latest = {i: (res, n)}
            while not news.empty():
                i, res, n = news.get_nowait()
                latest[i] = (res, n)
            for i, (res, n) in sorted(latest.items()):
                yield frame(i, core.output(req.rids[i], req.input_ids[i], res.output_ids[:n], res.logprobs[:n],
                                           None, core.weight_version, req.return_logprob))
        try:
            outs = task.result()
        except EngineError as e:
            yield f"data: {json.dumps({'error': {'message': str(e), 'code': e.status}})}\n\n"
        else:
            for i, o in enumerate(outs):
                yield frame(i, o)
        finished = True
        yield "data: [DONE]\n\n"
    finally:
        if getter is not None:
            getter.cancel()
        if not finished:  # the client disconnected mid-stream
            for rid in req.rids:
                core.abort(rid)


def _update_from_ipc(core: EngineCore, handle: dict[str, Any], version: Any, last: bool) -> None:
    """A bucket still in the trainer's GPU memory (slime/sync/cuda_ipc.py): copy, then let go."""
    if core.device.type != "cuda":
        raise EngineError("load_format cuda_ipc needs a GPU engine; this one runs on CPU: use ray_staged")
    import torch

    from slime.sync.cuda_ipc import open_bucket

    try:
        named = open_bucket(handle)
    except Exception as e:  # noqa: BLE001 - no IPC on this platform: the caller falls back
        raise EngineError(f"cannot open the CUDA IPC handle: {e!r}") from e
    core.update_from_named(named, version, last)
    torch.cuda.synchronize()  # copied before the trainer may free the buffer
    del named


async def _json_or_empty(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    import json

    data = json.loads(raw)
    return data if isinstance(data, dict) else {}


class EngineServer(ThreadedServer):
    """The engine's app with uvicorn in a daemon thread; `url` is ready when start() returns."""

    def __init__(self, core: EngineCore, host: str = "127.0.0.1", port: int | None = None,
                 server_args: dict[str, Any] | None = None):
        from slime.rollout.engines.pd import pd_role

        self.staging = StagingArea()
        self.core = core
        self.pd = pd_role(core, server_args, host)
        port = port or free_port(host)
        super().__init__(create_app(core, server_args, self.staging, self.pd), host, port, "engine-http")

    def stop(self) -> None:
        super().stop()
        if self.pd is not None:
            self.pd.stop()
