"""Trainer -> engines weight sync with an integer version (engines refuse a version that does
not increase; the client raises), and a post-sync check that each engine's log-probs match the
trainer's.

Transports (each in buckets of <= --update-weight-buffer-size bytes):
Every trainer rank takes part in each export (a sharded Megatron model's TP shards, PP stages and
EP experts meet on global rank 0, slime/backends/megatron/export.py); rank 0 alone streams.

- "disk": trainer rank 0 writes shards under --update-weight-disk-dir/v<version>, engines POST
  /update_weights_from_disk. Any layout with a shared filesystem (and external engines).
- "tensor": buckets through Ray's object store into each engine host (staging), then POST
  /update_weights_from_tensor with load_format "ray_staged"; the last bucket commits the
  version. On colocated GPUs the buckets stay in the trainer's CUDA memory and only CUDA IPC
  handles travel (load_format "cuda_ipc", slime/sync/cuda_ipc.py); where the platform refuses
  IPC the sync falls back to "ray_staged" and says so once (`ipc_fallback`).
- "http": the same buckets inline as base64 safetensors in the HTTP body (any reachable engine).
- "mooncake": Mooncake's transfer engine writes each bucket into buffers the engine registered
  once (slime/sync/mooncake.py); an engine that dies mid-sync is dropped from that sync.
- "broadcast" (`--update-weight-transport nccl`, or `gloo`): SGLang's
  /init_weights_update_group + /update_weights_from_distributed. Trainer rank 0 hosts a group of
  1 + engine ranks (gloo without GPUs, nccl with); per bucket the request goes to every engine
  first, then rank 0 broadcasts each tensor, then the replies are awaited. Reconnected after an
  engine restart. Colocated runs take "tensor" instead, as slime does (SYN-3).

Every transport runs pause_generation -> flush_cache -> buckets -> continue_generation, and the
embedded engine itself holds generation while a bucketed update is half applied: no request is
ever sampled on a mix of two versions.
"""

from __future__ import annotations

import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from slime.config import SyncConfig
from slime.rollout.client import EngineClient

if TYPE_CHECKING:
    from slime.sync.mooncake import MooncakeTransport

PROBE_PROMPT = [1, 2, 3, 4]
PROBE_TOKENS = 4


class WeightSyncError(RuntimeError):
    """An engine does not serve what the trainer holds after a sync."""


@dataclass
class EngineHandle:
    url: str
    actor: Any = None  # its Ray actor handle; None: an external engine (not ours to restart or stage into)
    gpus: int = 1  # ranks it contributes to a broadcast group (its TP size)
    others: list = field(default_factory=list)  # node ranks > 0 of a multi-node SGLang engine
    kind: str = "embedded"  # "sglang": buckets are applied through the actor (SGLang's own format)
    client: EngineClient = field(init=False)

    def __post_init__(self) -> None:
        self.client = EngineClient(self.url)


def default_transport(cfg: SyncConfig, colocate: bool) -> str:
    t = cfg.transport
    if t in ("nccl", "gloo"):
        return "tensor" if colocate else "broadcast"
    return t or ("tensor" if colocate else "disk")


class WeightSync:
    def __init__(self, cfg: SyncConfig, colocate: bool, trainers, engines: list[EngineHandle], default_disk_dir: str,
                 use_gpu: bool = False, check_tol: float | None = 1e-4, temperature: float = 1.0):
        """``trainers``: every trainer rank's actor (or one actor): each export and the post-sync
        check's log-probs are collective steps that every rank joins; rank 0 alone streams."""
        self.trainers = list(trainers) if isinstance(trainers, (list, tuple)) else [trainers]
        self.cfg, self.rank0, self.engines = cfg, self.trainers[0], engines
        self.transport = default_transport(cfg, colocate)
        self.backend = "gloo" if cfg.transport == "gloo" or not use_gpu else "nccl"
        self.disk_dir = Path(cfg.disk_dir or default_disk_dir)
        self.check_tol, self.temperature = check_tol, temperature
        self.version = 0
        self.lock = threading.RLock()  # one sync or engine restart at a time
        self.group_name = "slime-pp_0"
        self._connected: list[str] | None = None  # urls of the current broadcast group
        self.last_check: dict[str, float] = {}
        self.dropped: set[str] = set()  # engines that died during the last sync (restarted by the monitor)
        self.mooncake: MooncakeTransport | None = None
        if self.transport == "mooncake":
            from slime.sync.mooncake import MooncakeTransport

            self.mooncake = MooncakeTransport(self.trainers, cfg.buffer_size, cfg.mooncake_protocol,
                                              cfg.mooncake_device)
        # Colocated on GPUs: hand over CUDA memory (IPC handles) instead of host bytes.
        self.ipc = self.transport == "tensor" and colocate and use_gpu
        self.ipc_fallback: str | None = None  # why IPC was given up (then ray_staged)
        if self.transport == "tensor" and any(h.actor is None for h in engines):
            raise ValueError("--update-weight-transport tensor hands buckets to engine actors; external engines "
                             "take disk, http or nccl")

    def _collective(self, method: str, *args):
        """Call ``method`` on every trainer rank at once (TP gathers, PP stages and EP experts meet
        on the way to rank 0); rank 0's answer, the only complete one."""
        return ray.get([getattr(t, method).remote(*args) for t in self.trainers])[0]

    @property
    def clients(self) -> list[EngineClient]:
        return [h.client for h in self.engines]

    @staticmethod
    def _each(handles: list[EngineHandle], fn) -> None:
        if not handles:
            return
        with ThreadPoolExecutor(len(handles)) as pool:
            list(pool.map(fn, handles))

    # -- the sync ----------------------------------------------------------------------------------
    def sync(self, version: int) -> float:
        """Push the trainer's weights to every engine as `version`; returns seconds taken."""
        with self.lock:
            t0 = time.monotonic()
            self.dropped = set()
            self._push(self.engines, version)
            self.version = version
            took = time.monotonic() - t0
            self.check(version, [h for h in self.engines if h.url not in self.dropped])
            return took

    def sync_one(self, handle: EngineHandle) -> None:
        """A (re)started engine: bring it to the current version (others keep theirs)."""
        with self.lock:
            if self.version == 0:
                return
            self._push([handle], self.version, private=True)
            self.check(self.version, [handle])

    def _push(self, handles: list[EngineHandle], version: int, private: bool = False) -> None:
        t = self.transport
        if t == "disk":
            path = self.disk_dir / f"v{version}"
            if not (path / "model.safetensors.index.json").exists():
                path = Path(self._collective("write_weights_dir", str(path), self.cfg.buffer_size))
            self._paused(handles, lambda h: h.client.update_weights_from_disk(str(path), version))
            for old in self.disk_dir.glob("v*"):  # engines have loaded it: older versions are garbage
                if old.name != f"v{version}":
                    shutil.rmtree(old, ignore_errors=True)
        elif t == "tensor":
            self._paused(handles, lambda h: None, lambda: self._push_tensor(handles, version))
        elif t == "http":
            payloads = self._collective("export_bucket_bytes", self.cfg.buffer_size)

            def push() -> None:
                for b, payload in enumerate(payloads):
                    last = b == len(payloads) - 1
                    self._each(handles, lambda h: h.client.update_weights_from_tensor(payload, version, "safetensors",
                                                                                      last))
            self._paused(handles, lambda h: None, push)
        elif t == "broadcast":
            if private:  # a restarted engine: its own two-member group; the main group is rebuilt next sync
                name = f"slime-restart-{abs(hash(handles[0].url)) % 10**8}"
                self._connect(handles, name)
                self._paused(handles, lambda h: None, lambda: self._broadcast(handles, name, version))
                self._disconnect(handles, name)
                self._connected = None
            else:
                urls = [h.url for h in handles]
                if self._connected != urls:
                    if self._connected is not None:
                        self._disconnect(handles, self.group_name, missing_ok=True)
                    self._connect(handles, self.group_name)
                    self._connected = urls
                self._paused(handles, lambda h: None, lambda: self._broadcast(handles, self.group_name, version))
        elif t == "mooncake":
            assert self.mooncake is not None  # made in __init__ for this transport
            self.dropped |= self.mooncake.push(handles, version)
        else:
            raise ValueError(f"unknown weight transport {t!r}")

    def _push_tensor(self, handles: list[EngineHandle], version: int) -> None:
        if self.ipc:
            try:
                self._push_staged(handles, version, self._collective("export_ipc_buckets", self.cfg.buffer_size),
                                  "cuda_ipc")
                return
            except Exception as e:  # noqa: BLE001 - e.g. no CUDA IPC in this container: keep training
                self.ipc, self.ipc_fallback = False, repr(e)[:500]
                print(f"[slime] CUDA IPC weight hand-over failed ({self.ipc_fallback}); "
                      f"falling back to ray_staged (host copy)", flush=True)
            finally:
                ray.get([t.finish_ipc.remote() for t in self.trainers])
        refs = self._collective("export_bucket_refs", self.cfg.buffer_size)
        self._push_staged(handles, version, refs, "ray_staged")
        del refs  # the engines copied them: let the object store free the buckets

    def _push_staged(self, handles: list[EngineHandle], version: int, payloads: list, fmt: str) -> None:
        """Stage each bucket in every engine's host actor, then commit it (the last one commits
        the version). A bucket that fails is resent whole by the next attempt (same version)."""
        for b, payload in enumerate(payloads):
            key = f"v{version}-b{b}"
            last = b == len(payloads) - 1
            ray.get([h.actor.stage_bucket.remote(key, payload) for h in handles])

            def apply(h: EngineHandle) -> None:
                if h.kind == "sglang":  # SGLang takes its own serialized form: the actor posts it
                    ray.get(h.actor.apply_staged.remote(key, version, last, fmt))
                else:
                    h.client.update_weights_from_tensor(key, version, fmt, last)
            self._each(handles, apply)

    def _paused(self, handles: list[EngineHandle], per_engine, whole=None) -> None:
        """pause_generation -> flush_cache -> update -> continue_generation (sglang-protocol.md §3).
        Mode retract: running requests are requeued, not aborted (an async rollout in flight
        loses nothing); the embedded engine lets its running batch finish and holds new ones."""
        self._each(handles, lambda h: (h.client.pause_generation("retract"), h.client.flush_cache()))
        try:
            self._each(handles, per_engine)
            if whole is not None:
                whole()
        finally:
            self._each(handles, lambda h: h.client.continue_generation())

    # -- broadcast ---------------------------------------------------------------------------------
    def _connect(self, handles: list[EngineHandle], name: str) -> None:
        master = ray.get(self.rank0.master_address.remote())
        world = 1 + sum(h.gpus for h in handles)
        offsets = [1 + sum(h.gpus for h in handles[:i]) for i in range(len(handles))]
        with ThreadPoolExecutor(len(handles)) as pool:
            futs = [pool.submit(h.client.init_weights_update_group, master[0], master[1], off, world, name,
                                self.backend) for h, off in zip(handles, offsets)]
            ray.get(self.rank0.init_weight_group.remote(master, world, name, self.backend))
            for f in futs:
                f.result()

    def _disconnect(self, handles: list[EngineHandle], name: str, missing_ok: bool = False) -> None:
        def one(h: EngineHandle) -> None:
            try:
                h.client.destroy_weights_update_group(name)
            except Exception:  # noqa: BLE001 - a new engine never joined the old group
                if not missing_ok:
                    raise
        self._each(handles, one)
        ray.get(self.rank0.destroy_weight_group.remote(name))

    def _broadcast(self, handles: list[EngineHandle], name: str, version: int) -> None:
        metas = self._collective("prepare_broadcast", self.cfg.buffer_size)
        try:
            with ThreadPoolExecutor(len(handles)) as pool:
                for b, (names, dtypes, shapes) in enumerate(metas):
                    last = b == len(metas) - 1
                    # Post first (the engines answer after the last broadcast), then broadcast.
                    futs = [pool.submit(h.client.update_weights_from_distributed, names, dtypes, shapes, name,
                                        version, last) for h in handles]
                    ray.get(self.rank0.broadcast_bucket.remote(name, b))
                    for f in futs:
                        f.result()
        finally:
            ray.get([t.finish_broadcast.remote() for t in self.trainers])

    # -- the check ---------------------------------------------------------------------------------
    def check(self, version: int, handles: list[EngineHandle]) -> None:
        """Each engine samples a few tokens of a fixed probe; its version must be `version` and its
        log-probs the trainer's recomputation (float32 CPU: |diff| ~1e-7, tolerance check_tol)."""
        if self.check_tol is None:
            return
        from slime.data.train_data import TrainRecord

        params = {"max_new_tokens": PROBE_TOKENS, "temperature": self.temperature, "sampling_seed": version,
                  "ignore_eos": True}
        outs = {}

        def one(h: EngineHandle) -> None:
            outs[h.url] = h.client.generate([PROBE_PROMPT], params)[0]
        self._each(handles, one)
        bad = {u: o.weight_version for u, o in outs.items() if o.weight_version != str(version)}
        if bad:
            raise WeightSyncError(f"after sync to version {version}, engines serve other versions: {bad}")
        urls = list(outs)
        recs = [TrainRecord(PROBE_PROMPT + outs[u].output_ids, len(PROBE_PROMPT), 0.0, outs[u].output_logprobs,
                            [1] * len(outs[u].output_ids)) for u in urls]
        ref = self._collective("log_probs", recs)
        for u, r, lp in zip(urls, recs, ref):
            diff = max((abs(a - b) for a, b in zip(r.rollout_log_probs, lp)), default=0.0)
            self.last_check[u] = diff
            if diff > self.check_tol:
                raise WeightSyncError(f"engine {u}: log-probs differ from the trainer's by {diff:.3g} "
                                      f"(> {self.check_tol:g}) after sync to version {version} "
                                      f"({self.transport}): the engine does not serve the trained weights")

    # -- colocated phases --------------------------------------------------------------------------
    def release_engines(self) -> None:
        self._each(self.engines, lambda h: (h.client.flush_cache(), h.client.release_memory()))

    def resume_engines(self) -> None:
        self._each(self.engines, lambda h: h.client.resume_memory())
