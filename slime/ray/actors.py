"""Ray actors: an engine host (embedded engine + its HTTP server), a trainer rank, and the
rollout manager. Each wraps a plain class; only placement and process boundaries live here."""

from __future__ import annotations

import os
import socket
from typing import Any

import ray

from slime.rollout.manager import RolloutManager


def _limit_threads(n: int = 1) -> None:
    # Every actor otherwise starts one intra-op thread per core; on a 2-core machine with 3+
    # actors that oversubscribes the CPU and slows everything down.
    import torch

    torch.set_num_threads(max(1, n))


@ray.remote
class EngineActor:
    def __init__(self, hf_checkpoint: str, seed: int, threads: int = 1, server_args: dict | None = None):
        _limit_threads(threads)
        from slime.backends.embedded.engine_core import EngineCore
        from slime.rollout.engines.embedded import EngineServer

        self.core = EngineCore(hf_checkpoint, seed=seed)
        self.server = EngineServer(self.core, server_args=server_args)
        self.url = self.server.start()

    def get_url(self) -> str:
        return self.url

    def stage_bucket(self, key: str, payload: bytes) -> None:
        """Out-of-band half of load_format "ray_staged" (the payload came through the object store)."""
        self.server.staging.put(key, payload)

    def shutdown(self) -> None:
        self.server.stop()


@ray.remote
class TrainerActor:
    def __init__(self, rank: int, world_size: int, threads: int = 1):
        _limit_threads(threads)
        self.rank, self.world_size = rank, world_size
        self.trainer = None

    def master_address(self) -> tuple[str, int]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def init(self, master: tuple[str, int], hf_checkpoint: str, weights_path: str | None,
             ref_path: str | None, optim, loss, batch, seed: int, optimizer_from: str | None) -> dict:
        from slime.backends.embedded.trainer import EmbeddedTrainer, init_process_group
        from slime.checkpoint import resolve_checkpoint, restore_rng

        init_process_group(self.rank, self.world_size, master[0], master[1])
        weights = resolve_checkpoint(weights_path, "--load" if optimizer_from else "--ref-load").weights() \
            if weights_path else None
        ref = resolve_checkpoint(ref_path, "--ref-load").weights() if (ref_path and loss.use_kl_loss) else None
        self.trainer = EmbeddedTrainer(hf_checkpoint, weights, ref, optim, loss, batch,
                                       self.rank, self.world_size, seed)
        state = {}
        if optimizer_from:
            ckpt = resolve_checkpoint(optimizer_from, "--load")
            opt = ckpt.optimizer_state()
            if opt is not None:
                self.trainer.optimizer.load_state_dict(opt)
            if self.rank == 0 and "rng" in ckpt.state:
                restore_rng(ckpt.state["rng"])
            state = ckpt.state
        return state

    def train(self, records, num_steps: int) -> dict[str, float]:
        return self.trainer.train(records, num_steps)

    def log_probs(self, records) -> list[list[float]]:
        return self.trainer.log_probs(records)

    def offload(self) -> None:
        self.trainer.offload()

    def onload(self) -> None:
        self.trainer.onload()

    # -- weight export (rank 0) ------------------------------------------------------------------
    def write_weights_dir(self, path: str, buffer_size: int) -> str:
        from slime.backends.embedded.weights import write_weights_dir

        return str(write_weights_dir(self.trainer.named_weights(), path, buffer_size))

    def export_bucket_refs(self, buffer_size: int) -> list:
        """Buckets of safetensors bytes put into the object store; the caller passes the refs on
        and drops them after the engines have loaded (then Ray frees them)."""
        from slime.backends.embedded.weights import bucketize, encode_bucket

        return [ray.put(encode_bucket(b)) for b in bucketize(self.trainer.named_weights(), buffer_size)]

    def export_bucket_bytes(self, buffer_size: int) -> list[bytes]:
        from slime.backends.embedded.weights import bucketize, encode_bucket

        return [encode_bucket(b) for b in bucketize(self.trainer.named_weights(), buffer_size)]

    def save(self, root: str, iteration: int, state: dict[str, Any]) -> str:
        from slime.checkpoint import encode_rng, save_checkpoint

        d = save_checkpoint(root, iteration, self.trainer.named_weights(),
                            self.trainer.optimizer.state_dict(), {**state, "rng": encode_rng()})
        return str(d)

    def pid(self) -> int:
        return os.getpid()


RolloutManagerActor = ray.remote(num_cpus=0)(RolloutManager)
