"""Trainer -> engines weight sync with an integer version (engines refuse a version that does
not increase; the client raises).

Transports:
- "disk": trainer rank 0 writes shards of <= --update-weight-buffer-size bytes under
  --update-weight-disk-dir/v<version>, engines POST /update_weights_from_disk. Works for any
  layout with a shared filesystem.
- "tensor": buckets of <= buffer-size bytes through Ray's object store into each engine host
  (staging), then POST /update_weights_from_tensor with load_format "ray_staged" per bucket;
  the last bucket commits the version. For colocated pools (same node), like SGLang's CUDA IPC.
- "http": the same buckets inline as base64 safetensors in the HTTP body (any reachable engine).
"""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ray

from slime.config import SyncConfig
from slime.rollout.client import EngineClient


def default_transport(cfg: SyncConfig, colocate: bool) -> str:
    return cfg.transport or ("tensor" if colocate else "disk")


class WeightSync:
    def __init__(self, cfg: SyncConfig, colocate: bool, rank0, engine_actors: list, urls: list[str],
                 default_disk_dir: str):
        self.cfg, self.rank0, self.engine_actors = cfg, rank0, engine_actors
        self.transport = default_transport(cfg, colocate)
        self.clients = [EngineClient(u) for u in urls]
        self.disk_dir = Path(cfg.disk_dir or default_disk_dir)
        self.version = 0

    def _each(self, fn) -> None:
        with ThreadPoolExecutor(len(self.clients)) as pool:
            list(pool.map(fn, range(len(self.clients))))

    def sync(self, version: int) -> float:
        """Push the trainer's weights as `version`; returns seconds taken."""
        t0 = time.monotonic()
        if self.transport == "disk":
            path = ray.get(self.rank0.write_weights_dir.remote(str(self.disk_dir / f"v{version}"),
                                                                self.cfg.buffer_size))
            self._each(lambda i: self.clients[i].update_weights_from_disk(path, version))
            for old in self.disk_dir.glob("v*"):  # engines have loaded it: older versions are garbage
                if old.name != f"v{version}":
                    shutil.rmtree(old, ignore_errors=True)
        elif self.transport == "tensor":
            refs = ray.get(self.rank0.export_bucket_refs.remote(self.cfg.buffer_size))
            for b, ref in enumerate(refs):
                key = f"v{version}-b{b}"
                ray.get([a.stage_bucket.remote(key, ref) for a in self.engine_actors])
                last = b == len(refs) - 1
                self._each(lambda i: self.clients[i].update_weights_from_tensor(key, version, "ray_staged", last))
            del refs  # the engines copied them: let the object store free the buckets
        elif self.transport == "http":
            payloads = ray.get(self.rank0.export_bucket_bytes.remote(self.cfg.buffer_size))
            for b, payload in enumerate(payloads):
                last = b == len(payloads) - 1
                self._each(lambda i: self.clients[i].update_weights_from_tensor(payload, version, "safetensors", last))
        else:
            raise ValueError(f"--update-weight-transport {self.transport} is not available with embedded engines")
        self.version = version
        return time.monotonic() - t0

    def release_engines(self) -> None:
        self._each(lambda i: (self.clients[i].flush_cache(), self.clients[i].release_memory()))

    def resume_engines(self) -> None:
        self._each(lambda i: self.clients[i].resume_memory())
