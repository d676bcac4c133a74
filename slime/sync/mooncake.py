"""Weight sync over Mooncake's transfer engine (`--update-weight-transport mooncake`).

Three parts, one per process:
- MooncakeSender (trainer rank 0): the weights packed bucket by bucket (<= --update-weight-buffer-size
  bytes each) into send buffers that are allocated and registered with the transfer engine once,
  and re-packed in place at every sync. One transfer per bucket per engine.
- MooncakeReceiver (an engine's HTTP layer, slime/rollout/engines/embedded.py): receive buffers of
  the same sizes, registered once per engine start (a restarted engine registers anew), then
  `/update_weights_from_transfer_engine` loads a written bucket and commits the version with the
  last one.
- MooncakeTransport (the driver's WeightSync): registers each engine, moves the buckets inside
  pause_generation -> flush_cache -> ... -> continue_generation, retries a failed transfer a bounded
  number of times and then names the engine. An engine that died mid-sync is dropped from that sync
  (the fault monitor restarts it and brings it to the version), a live engine that keeps refusing
  stops the run.

The transfer engine runs in P2P-handshake mode (no metadata server): each side's session id is
host:rpc_port. Protocol `tcp` works anywhere (what the CPU tests use, on 127.0.0.1); `rdma` with
`--mooncake-device mlx5_0,...` on InfiniBand/RoCE clusters. Wheels: `mooncake-transfer-engine-non-cuda`
(CPU hosts; needs libibverbs1 at import) or `mooncake-transfer-engine` (CUDA hosts). Buffers are
host memory here; the engine endpoints are the embedded engine's (SGLang 0.5.x has no Mooncake
weight-update endpoint: its Mooncake use is PD KV transfer), so SGLang engines take nccl or disk.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

INSTALL_HINT = ("Mooncake's transfer engine is not installed: pip install mooncake-transfer-engine-non-cuda "
                "(CPU hosts; apt-get install libibverbs1) or mooncake-transfer-engine (CUDA hosts)")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64, "int64": torch.int64, "int32": torch.int32, "uint8": torch.uint8}


class MooncakeError(RuntimeError):
    pass


def mooncake_available() -> bool:
    try:
        from mooncake.engine import TransferEngine  # noqa: F401
    except (ImportError, OSError):
        return False
    return True


class Endpoint:
    """One process's transfer engine (P2P handshake) and the buffers it registered."""

    def __init__(self, host: str, protocol: str = "tcp", device: str = ""):
        try:
            from mooncake.engine import TransferEngine
        except (ImportError, OSError) as e:
            raise MooncakeError(f"{INSTALL_HINT} ({e})") from e
        self.engine = TransferEngine()
        rc = self.engine.initialize(host, "P2PHANDSHAKE", protocol, device)
        if rc != 0:
            raise MooncakeError(f"Mooncake transfer engine failed to start on {host} ({protocol}, device "
                                f"{device or 'auto'}): rc {rc}")
        self.session_id = f"{host}:{self.engine.get_rpc_port()}"
        self.buffers: list[torch.Tensor] = []

    def register(self, sizes: list[int]) -> list[int]:
        """Buffers of these sizes, registered once; kept while the sizes stay the same."""
        if [b.numel() for b in self.buffers] != list(sizes):
            for b in self.buffers:
                self.engine.unregister_memory(b.data_ptr())
            self.buffers = [torch.empty(max(1, n), dtype=torch.uint8) for n in sizes]
            for b in self.buffers:
                rc = self.engine.register_memory(b.data_ptr(), b.numel())
                if rc != 0:
                    raise MooncakeError(f"registering a {b.numel()}-byte buffer failed: rc {rc}")
        return [b.data_ptr() for b in self.buffers]

    def write(self, target_session: str, index: int, remote_ptr: int) -> int:
        b = self.buffers[index]
        return int(self.engine.transfer_sync_write(target_session, b.data_ptr(), remote_ptr, b.numel()))


def bucket_layout(bucket: dict[str, torch.Tensor]) -> tuple[int, list[dict[str, Any]]]:
    """Byte layout of one bucket: (total bytes, [{name, dtype, shape, offset, nbytes}]). Offsets
    are 16-byte aligned so every tensor can be viewed in place as its dtype."""
    meta, off = [], 0
    for name, t in bucket.items():
        off = -(-off // 16) * 16
        n = t.numel() * t.element_size()
        meta.append({"name": name, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                     "offset": off, "nbytes": n})
        off += n
    return off, meta


def unpack(buf: torch.Tensor, meta: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Tensors of a received bucket, viewing the buffer in place (no copy): the engine copies them
    into its parameters before answering, and the buffer is written again only at the next sync."""
    out = {}
    for m in meta:
        if m["dtype"] not in DTYPES:
            raise ValueError(f"{m['name']}: dtype {m['dtype']!r} not one of {sorted(DTYPES)}")
        raw = buf[m["offset"]:m["offset"] + m["nbytes"]]
        out[m["name"]] = raw.view(DTYPES[m["dtype"]]).view(tuple(m["shape"]))
    return out


class MooncakeSender:
    """Trainer rank 0's side (lives in the TrainerActor)."""

    def __init__(self, host: str, protocol: str, device: str):
        self.ep = Endpoint(host, protocol, device)
        self.metas: list[list[dict[str, Any]]] = []

    def prepare(self, named: dict[str, torch.Tensor], buffer_size: int) -> list[tuple[int, list[dict[str, Any]]]]:
        """Pack the current weights into the registered buffers; [(size, metadata)] per bucket."""
        from slime.hf.weights import bucketize

        buckets = bucketize(named, buffer_size)
        layouts = [bucket_layout(b) for b in buckets]
        self.ep.register([size for size, _ in layouts])
        for buf, bucket, (_, meta) in zip(self.ep.buffers, buckets, layouts):
            for m, t in zip(meta, bucket.values()):
                src = t.detach().to("cpu").contiguous().view(-1).view(torch.uint8)
                buf[m["offset"]:m["offset"] + m["nbytes"]].copy_(src)
        self.metas = [meta for _, meta in layouts]
        return layouts

    def send(self, index: int, target_session: str, remote_ptr: int) -> int:
        return self.ep.write(target_session, index, remote_ptr)


class MooncakeReceiver:
    """An engine's side: created on the first /init_weights_transfer_engine."""

    def __init__(self, host: str, protocol: str, device: str):
        self.ep = Endpoint(host, protocol, device)

    def register(self, sizes: list[int]) -> dict[str, Any]:
        return {"session_id": self.ep.session_id, "buffers": self.ep.register(sizes)}

    def bucket(self, index: int, meta: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if not 0 <= index < len(self.ep.buffers):
            raise ValueError(f"bucket {index}: {len(self.ep.buffers)} registered (POST /init_weights_transfer_engine)")
        return unpack(self.ep.buffers[index], meta)


@dataclass
class _Registration:
    handle: Any  # the EngineHandle registered: a restarted engine is a new handle (maybe on the same url)
    session_id: str
    buffers: list[int]
    sizes: list[int]


class MooncakeTransport:
    """The driver's side of a sync (called by WeightSync with its lock held)."""

    def __init__(self, trainers, buffer_size: int, protocol: str = "tcp", device: str = "", retries: int = 3,
                 backoff_s: float = 0.5, log: Callable[[str], None] = lambda m: print(m, flush=True)):
        # every trainer rank packs (a sharded model's export is collective); rank 0 alone sends
        self.trainers = list(trainers) if isinstance(trainers, (list, tuple)) else [trainers]
        self.rank0, self.buffer_size, self.protocol, self.device = self.trainers[0], buffer_size, protocol, device
        self.retries, self.backoff_s, self.log = retries, backoff_s, log
        self.registered: dict[str, _Registration] = {}  # engine url -> its receive buffers
        self.transfers = 0
        self.failed_transfers = 0
        self.registrations = 0
        self.on_bucket: Callable[[int], None] | None = None  # tests: act between buckets (kill an engine)

    def _register(self, h, sizes: list[int]) -> None:
        r = self.registered.get(h.url)
        if r is not None and r.handle is h and r.sizes == sizes:
            return
        info = h.client.init_weights_transfer_engine(sizes, self.protocol, self.device)
        self.registered[h.url] = _Registration(h, info["session_id"], [int(p) for p in info["buffers"]], sizes)
        self.registrations += 1

    def _send(self, h, index: int) -> None:
        import ray

        reg = self.registered[h.url]
        rc = -1
        for attempt in range(self.retries + 1):
            rc = ray.get(self.rank0.mooncake_send.remote(index, reg.session_id, reg.buffers[index]))
            self.transfers += 1
            if rc == 0:
                return
            self.failed_transfers += 1
            if attempt < self.retries:
                time.sleep(self.backoff_s * (2 ** attempt))
        raise MooncakeError(f"engine {h.url}: Mooncake transfer of bucket {index} to {reg.session_id} failed "
                            f"{self.retries + 1} times (rc {rc})")

    def push(self, handles: list, version: int) -> set[str]:
        """Every bucket to every engine as `version`; returns the urls of engines that died during
        the sync (dropped from it). Raises if a live engine cannot be updated."""
        import ray

        layouts = ray.get([t.mooncake_prepare.remote(self.buffer_size, self.protocol, self.device)
                           for t in self.trainers])[0]
        sizes = [size for size, _ in layouts]
        live = list(handles)
        dropped: set[str] = set()

        def each(fn) -> None:
            from concurrent.futures import ThreadPoolExecutor

            def guarded(h) -> None:
                try:
                    fn(h)
                except Exception as e:  # noqa: BLE001 - dead engine: drop it; live one: re-raise below
                    if h.client.health():
                        raise
                    self.log(f"[slime] engine {h.url} died during the Mooncake weight sync to version {version} "
                             f"({e}); dropped from this sync, the fault monitor restarts and re-syncs it")
                    dropped.add(h.url)
                    self.registered.pop(h.url, None)

            with ThreadPoolExecutor(max(1, len(live))) as pool:
                list(pool.map(guarded, list(live)))
            live[:] = [h for h in live if h.url not in dropped]

        each(lambda h: self._register(h, sizes))
        each(lambda h: (h.client.pause_generation("retract"), h.client.flush_cache()))
        try:
            for b, (_, meta) in enumerate(layouts):
                last = b == len(layouts) - 1

                def send(h: Any) -> None:
                    self._send(h, b)
                    h.client.update_weights_from_transfer_engine(b, meta, version, last)

                each(send)
                if self.on_bucket is not None:
                    self.on_bucket(b)
        finally:
            each(lambda h: h.client.continue_generation())
        if not live:
            raise MooncakeError(f"no engine survived the Mooncake weight sync to version {version}")
        return dropped
