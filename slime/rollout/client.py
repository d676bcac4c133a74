"""The one way the runtime talks to an engine: SGLang's HTTP protocol over httpx.

Works the same against the embedded engine and a real SGLang server. Connection errors are
retried (an engine may be starting); an HTTP error answer is never retried blindly: it raises
EngineRequestError with the engine's own message.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from slime.refusals import declare

_R = declare("engine", {"not_healthy": ("url", "seconds")})


class EngineRequestError(RuntimeError):
    def __init__(self, url: str, status: int, message: str):
        super().__init__(f"{url}: HTTP {status}: {message}")
        self.url, self.status, self.message = url, status, message


@dataclass
class GenerateResult:
    text: str
    output_ids: list[int]
    output_logprobs: list[float]
    finish_type: str  # "stop" | "length" | "abort"
    weight_version: str
    prompt_tokens: int
    rid: str
    meta_info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "GenerateResult":
        meta = d.get("meta_info", {})
        lps = meta.get("output_token_logprobs") or []
        ids = d.get("output_ids") or [t[1] for t in lps]
        fr = meta.get("finish_reason") or {}
        return cls(d.get("text", ""), list(ids), [float(t[0]) for t in lps], fr.get("type", "abort"),
                   str(meta.get("weight_version", "")), int(meta.get("prompt_tokens", 0)),
                   str(meta.get("id", "")), meta)


def _error_message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text or resp.reason_phrase
    if isinstance(body, dict):
        if isinstance(body.get("error"), dict):
            return str(body["error"].get("message"))
        if "message" in body:
            return str(body["message"])
    return str(body)


class EngineClient:
    def __init__(self, url: str, timeout: float = 600.0, retries: int = 5, backoff: float = 0.5):
        self.url = url.rstrip("/")
        self.retries, self.backoff = retries, backoff
        self.http = httpx.Client(timeout=httpx.Timeout(timeout, connect=10.0), trust_env=False)

    def close(self) -> None:
        self.http.close()

    def _request(self, method: str, path: str, json: Any = None, headers: dict[str, str] | None = None,
                 timeout: float | None = None) -> httpx.Response:
        for attempt in range(self.retries + 1):
            try:
                resp = self.http.request(method, self.url + path, json=json, headers=headers,
                                         timeout=timeout if timeout else httpx.USE_CLIENT_DEFAULT)
            except (httpx.ConnectError, httpx.RemoteProtocolError):
                if attempt == self.retries:
                    raise
                time.sleep(self.backoff * (2**attempt))
                continue
            if resp.status_code >= 400:
                raise EngineRequestError(self.url + path, resp.status_code, _error_message(resp))
            return resp
        raise AssertionError("unreachable")

    def _control(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        data = self._request("POST", path, body).json()
        if isinstance(data, dict) and data.get("success") is False:
            raise EngineRequestError(self.url + path, 400, str(data.get("message")))
        return data

    # -- generation ----------------------------------------------------------------------------
    def generate(self, input_ids: list[list[int]], sampling_params: dict[str, Any] | list[dict[str, Any]],
                 rid: str | None = None, routing_key: str | None = None) -> list[GenerateResult]:
        """A batch of prompts (each expanded by sampling_params['n']); results in request order.
        routing_key: session affinity through a router (X-SMG-Routing-Key)."""
        # One prompt goes flat, as SGLang's own clients send it (a router parses either form).
        ids: Any = input_ids[0] if len(input_ids) == 1 and not isinstance(sampling_params, list) else input_ids
        body: dict[str, Any] = {"input_ids": ids, "sampling_params": sampling_params, "return_logprob": True}
        if rid:
            body["rid"] = rid
        headers = {"X-SMG-Routing-Key": routing_key} if routing_key else None
        data = self._request("POST", "/generate", body, headers=headers).json()
        return [GenerateResult.from_json(d) for d in (data if isinstance(data, list) else [data])]

    # -- control -------------------------------------------------------------------------------
    def health(self) -> bool:
        try:
            return self.http.get(self.url + "/health").status_code == 200
        except httpx.HTTPError:
            return False

    def wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.http.get(self.url + "/health_generate").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(_R("not_healthy", url=self.url, seconds=timeout))

    def health_generate(self, timeout: float) -> bool:
        """One probe of GET /health_generate (the fault-tolerance heartbeat)."""
        try:
            return self.http.get(self.url + "/health_generate", timeout=timeout).status_code == 200
        except httpx.HTTPError:
            return False

    def server_info(self) -> dict[str, Any]:
        return self._request("GET", "/server_info").json()

    def model_info(self) -> dict[str, Any]:
        return self._request("GET", "/model_info").json()

    def flush_cache(self, attempts: int = 60) -> None:
        for i in range(attempts):  # refused while busy; retried like slime does
            try:
                self._request("GET", "/flush_cache")
                return
            except EngineRequestError:
                if i == attempts - 1:
                    raise
                time.sleep(1.0)

    def abort(self, rid: str = "", abort_all: bool = False) -> None:
        self._request("POST", "/abort_request", {"rid": rid, "abort_all": abort_all})

    def release_memory(self, tags: list[str] | None = None) -> None:
        self._request("POST", "/release_memory_occupation", {"tags": tags} if tags else {})

    def resume_memory(self, tags: list[str] | None = None) -> None:
        self._request("POST", "/resume_memory_occupation", {"tags": tags} if tags else {})

    def update_weights_from_disk(self, model_path: str, weight_version: int) -> None:
        self._control("/update_weights_from_disk", {"model_path": model_path,
                                                    "weight_version": str(weight_version)})

    def update_weights_from_tensor(self, payload: bytes | str, weight_version: int, load_format: str,
                                   is_last_bucket: bool = True) -> None:
        """payload: safetensors bytes ("safetensors") or a staging key ("ray_staged")."""
        entry = payload if isinstance(payload, str) else base64.b64encode(payload).decode("ascii")
        self._control("/update_weights_from_tensor", {
            "serialized_named_tensors": [entry],
            "load_format": load_format, "flush_cache": False,
            "weight_version": str(weight_version), "is_last_bucket": is_last_bucket})

    def pause_generation(self, mode: str = "abort") -> None:
        self._request("POST", "/pause_generation", {"mode": mode})

    def continue_generation(self) -> None:
        self._request("POST", "/continue_generation", {})

    # -- distributed weight update (trainer rank 0 broadcasts; sglang-protocol.md §3) ---------------
    def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                  group_name: str, backend: str, timeout: float = 120.0) -> None:
        """Blocks until every member joined: call it concurrently with the trainer's join."""
        data = self._request("POST", "/init_weights_update_group", {
            "master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
            "world_size": world_size, "group_name": group_name, "backend": backend}, timeout=timeout).json()
        if isinstance(data, dict) and data.get("success") is False:
            raise EngineRequestError(self.url + "/init_weights_update_group", 400, str(data.get("message")))

    def destroy_weights_update_group(self, group_name: str) -> None:
        self._control("/destroy_weights_update_group", {"group_name": group_name})

    def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                        group_name: str, weight_version: int, is_last_bucket: bool = True) -> None:
        """Answers only after every broadcast arrived: post it first, then broadcast."""
        self._control("/update_weights_from_distributed", {
            "names": names, "dtypes": dtypes, "shapes": shapes, "group_name": group_name, "flush_cache": False,
            "weight_version": str(weight_version), "is_last_bucket": is_last_bucket})

    # -- Mooncake transfer-engine weight update (slime extension; slime/sync/mooncake.py) -----------
    def init_weights_transfer_engine(self, sizes: list[int], protocol: str, device: str) -> dict[str, Any]:
        """Receive buffers of these sizes (registered once): {session_id, buffers: [address]}."""
        return self._control("/init_weights_transfer_engine", {"bucket_sizes": sizes, "protocol": protocol,
                                                               "device_name": device})

    def update_weights_from_transfer_engine(self, bucket: int, metadata: list[dict[str, Any]], weight_version: int,
                                            is_last_bucket: bool = True) -> None:
        self._control("/update_weights_from_transfer_engine", {
            "bucket": bucket, "metadata": metadata, "flush_cache": False, "weight_version": str(weight_version),
            "is_last_bucket": is_last_bucket})


class RouterAdmin:
    """Worker registration on a router (ours or sglang-router 0.3.x: same endpoints). sglang-router
    queues a registration (202) and answers `worker_id`; ours registers at once and answers `id`:
    wait_workers() covers both."""

    def __init__(self, url: str, timeout: float = 30.0):
        self.url = url.rstrip("/")
        self.http = httpx.Client(timeout=timeout, trust_env=False)

    def add_worker(self, url: str, worker_type: str = "regular", bootstrap_port: int | None = None) -> str:
        body: dict[str, Any] = {"url": url, "worker_type": worker_type}
        if bootstrap_port is not None:
            body["bootstrap_port"] = bootstrap_port
        resp = self.http.post(self.url + "/workers", json=body)
        if resp.status_code >= 400:
            raise EngineRequestError(self.url + "/workers", resp.status_code, _error_message(resp))
        data = resp.json()
        return str(data.get("worker_id") or data.get("id") or url)

    def list_workers(self) -> list[dict[str, Any]]:
        return self.http.get(self.url + "/workers").json()["workers"]

    def wait_workers(self, urls: list[str], timeout: float = 120.0, present: bool = True) -> None:
        """Until every url is listed and healthy (present) or none is listed (not present)."""
        want = {u.rstrip("/") for u in urls}
        deadline = time.monotonic() + timeout
        while True:
            ws = {w["url"].rstrip("/"): w for w in self.list_workers()}
            if present and all(u in ws and ws[u].get("is_healthy", True) for u in want):
                return
            if not present and not want & set(ws):
                return
            if time.monotonic() > deadline:
                state = {u: (ws[u].get("is_healthy") if u in ws else "not listed") for u in want}
                raise TimeoutError(f"router {self.url}: workers not {'ready' if present else 'removed'} "
                                   f"after {timeout:g} s: {state}")
            time.sleep(0.1)

    def remove_worker(self, url: str) -> None:
        for w in self.list_workers():
            if w["url"].rstrip("/") == url.rstrip("/"):
                self.http.delete(f"{self.url}/workers/{w['id']}")

    def close(self) -> None:
        self.http.close()
