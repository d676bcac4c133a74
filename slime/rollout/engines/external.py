"""External engines (`--rollout-external-engine-addrs host:port ...`): engines another deployment
started and owns. slime reserves no GPUs for them and never restarts them (SGL-9); before
anything is reserved it checks that each one can serve this run, and refuses with the engine's
address and the mismatch:

- reachable: GET /server_info and GET /model_info answer;
- the model: `architectures` and `model_type` equal --hf-checkpoint's config.json, and
  `model_path` names the same checkpoint (same path, or at least the same directory name: an
  engine host may mount it elsewhere);
- a generation model (`is_generation`), not in PD mode (`disaggregation_mode` null: PD pairs
  are reached through their router, not as single engines);
- weight updates for the chosen transport: SGLang >= 0.5 has every endpoint slime uses; an
  engine that lists `weight_update_endpoints` (the embedded engine) must list the transport's;
- `tensor` transport is refused: it hands buckets to engine actors slime owns.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import httpx

from slime.refusals import declare

_R = declare("external", {
    "unreachable": ("addr", "error"),
    "not_sglang": ("addr", "server_status", "model_status"),
    "architectures": ("addr", "served", "checkpoint", "want"),
    "model_type": ("addr", "served", "want"),
    "model_path": ("addr", "served", "checkpoint"),
    "not_generation": ("addr",),
    "pd_mode": ("addr", "mode"),
    "tensor": ("addr",),
    "endpoints": ("addr", "missing", "transport"),
    "no_backend": ("addr",),
    "version": ("addr", "version", "minimum"),
})

ENDPOINTS = {"disk": ["update_weights_from_disk"], "http": ["update_weights_from_tensor"],
             "broadcast": ["init_weights_update_group", "update_weights_from_distributed"],
             "mooncake": ["init_weights_transfer_engine", "update_weights_from_transfer_engine"]}
MIN_SGLANG = (0, 5)


def normalize_addr(addr: str) -> str:
    return addr.rstrip("/") if addr.startswith(("http://", "https://")) else f"http://{addr.rstrip('/')}"


def _version_tuple(v: str) -> tuple[int, ...] | None:
    m = re.match(r"(\d+)\.(\d+)", v or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_engine(addr: str, hf_checkpoint: str, transport: str, timeout: float = 10.0) -> list[str]:
    url = normalize_addr(addr)
    try:
        with httpx.Client(timeout=timeout, trust_env=False) as http:
            info = http.get(url + "/server_info")
            if info.status_code == 404:
                info = http.get(url + "/get_server_info")
            minfo = http.get(url + "/model_info")
    except httpx.HTTPError as e:
        return [_R("unreachable", addr=addr, error=f"{type(e).__name__}: {e}")]
    if info.status_code != 200 or minfo.status_code != 200:
        return [_R("not_sglang", addr=addr, server_status=info.status_code, model_status=minfo.status_code)]
    si: dict[str, Any] = info.json()
    mi: dict[str, Any] = minfo.json()
    problems: list[str] = []
    cfg_path = Path(hf_checkpoint) / "config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
    want_arch = list(cfg.get("architectures") or [])
    if want_arch and list(mi.get("architectures") or []) != want_arch:
        problems.append(_R("architectures", addr=addr, served=str(mi.get("architectures")), checkpoint=hf_checkpoint,
                           want=str(want_arch)))
    if cfg.get("model_type") and mi.get("model_type") and mi["model_type"] != cfg["model_type"]:
        problems.append(_R("model_type", addr=addr, served=mi["model_type"], want=cfg["model_type"]))
    served = str(mi.get("model_path") or si.get("model_path") or "")
    if served and os.path.realpath(served) != os.path.realpath(hf_checkpoint) \
            and Path(served.rstrip("/")).name != Path(hf_checkpoint.rstrip("/")).name:
        problems.append(_R("model_path", addr=addr, served=served, checkpoint=hf_checkpoint))
    if mi.get("is_generation") is False:
        problems.append(_R("not_generation", addr=addr))
    mode = si.get("disaggregation_mode")
    if mode not in (None, "null"):
        problems.append(_R("pd_mode", addr=addr, mode=mode))
    if transport == "tensor":
        problems.append(_R("tensor", addr=addr))
    listed = si.get("weight_update_endpoints")
    need = ENDPOINTS.get(transport, [])
    if isinstance(listed, list):
        missing = [e for e in need if e not in listed]
        if missing:
            problems.append(_R("endpoints", addr=addr, missing=str(missing), transport=transport))
        backends = si.get("weight_update_backends")
        if transport == "broadcast" and isinstance(backends, list) and not backends:
            problems.append(_R("no_backend", addr=addr))
    else:
        version = str(si.get("version", ""))
        vt = _version_tuple(version)
        if vt is None or vt < MIN_SGLANG:
            problems.append(_R("version", addr=addr, version=version or "unknown", minimum=".".join(map(str, MIN_SGLANG))))
    return problems


def check_external_engines(addrs: list[str], hf_checkpoint: str, transport: str) -> list[str]:
    problems: list[str] = []
    for a in addrs:
        problems.extend(check_engine(a, hf_checkpoint, transport))
    return problems
