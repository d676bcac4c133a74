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

    def set_step_delay(self, seconds: float) -> None:
        """Tests and benchmarks: sleep this long per decoding step (to act mid-request)."""
        self.core.step_delay_s = float(seconds)

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
        ref = resolve_checkpoint(ref_path, "--ref-load").weights() if (ref_path and loss.needs_ref) else None
        self.trainer = EmbeddedTrainer(hf_checkpoint, weights, ref, optim, loss, batch,
                                       self.rank, self.world_size, seed)
        state = {}
        if optimizer_from:
            ckpt = resolve_checkpoint(optimizer_from, "--load")
            opt = ckpt.optimizer_state()
            if opt is not None:
                self.trainer.optimizer.load_state_dict(opt)
                self.trainer.resume_lr_schedule()
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

    # -- distributed weight update (rank 0 broadcasts; slime/sync/dist_group.py) -------------------
    def init_weight_group(self, master: tuple[str, int], world_size: int, group_name: str, backend: str) -> None:
        """Joins as rank 0 and returns once every engine has joined (they are posted concurrently)."""
        from slime.sync.dist_group import WeightGroup

        self._groups = getattr(self, "_groups", {})
        old = self._groups.pop(group_name, None)
        if old is not None:
            old.destroy()
        self._groups[group_name] = WeightGroup(master[0], master[1], 0, world_size, group_name, backend)

    def destroy_weight_group(self, group_name: str) -> None:
        g = getattr(self, "_groups", {}).pop(group_name, None)
        if g is not None:
            g.destroy()

    def prepare_broadcast(self, buffer_size: int) -> list[tuple[list[str], list[str], list[list[int]]]]:
        """Snapshot the weights in buckets; (names, dtypes, shapes) per bucket for the requests."""
        from slime.backends.embedded.weights import bucketize
        from slime.sync.dist_group import dtype_name

        self._bcast = bucketize(self.trainer.named_weights(), buffer_size)
        return [(list(b), [dtype_name(t.dtype) for t in b.values()], [list(t.shape) for t in b.values()])
                for b in self._bcast]

    def broadcast_bucket(self, group_name: str, index: int) -> None:
        g = self._groups[group_name]
        for t in self._bcast[index].values():
            g.broadcast(t.to(g.device))

    def finish_broadcast(self) -> None:
        self._bcast = None

    # -- Mooncake transfer engine (rank 0 writes into engine buffers; slime/sync/mooncake.py) -----
    def mooncake_prepare(self, buffer_size: int, protocol: str, device: str) -> list:
        from slime.sync.mooncake import MooncakeSender

        if getattr(self, "_mooncake", None) is None:
            self._mooncake = MooncakeSender(ray.util.get_node_ip_address(), protocol, device)
        return self._mooncake.prepare(self.trainer.named_weights(), buffer_size)

    def mooncake_send(self, index: int, target_session: str, remote_ptr: int) -> int:
        return self._mooncake.send(index, target_session, remote_ptr)

    def save(self, root: str, iteration: int, state: dict[str, Any]) -> str:
        from slime.checkpoint import encode_rng, save_checkpoint

        d = save_checkpoint(root, iteration, self.trainer.named_weights(),
                            self.trainer.optimizer.state_dict(), {**state, "rng": encode_rng()})
        return str(d)

    def pid(self) -> int:
        return os.getpid()


RolloutManagerActor = ray.remote(num_cpus=0)(RolloutManager)


@ray.remote(num_cpus=0)
class RouterActor:
    """Our router (slime/rollout/router.py) served over HTTP from its own process."""

    def __init__(self, concurrency: int, policy: str, retry_timeout: float = 600.0):
        from slime.rollout.router import RouterServer

        host = ray.util.get_node_ip_address()
        self.server = RouterServer(host=host, concurrency=concurrency, policy=policy, retry_timeout=retry_timeout)
        self.url = self.server.start()

    def get_url(self) -> str:
        return self.url

    def shutdown(self) -> None:
        self.server.stop()


@ray.remote(num_cpus=0)
class SGLangRouterActor:
    """sglang-router (slime/rollout/router.py: SGLangRouterProcess) as a child of this actor: the
    same endpoints as RouterActor for the runtime, and it stops when the actor is killed."""

    def __init__(self, policy: str, health_interval_s: float, health_timeout_s: float, log_path: str | None = None,
                 worker_urls: list[str] | None = None):
        from slime.rollout.router import SGLangRouterProcess

        self.proc = SGLangRouterProcess(ray.util.get_node_ip_address(), None, policy, health_interval_s,
                                        health_timeout_s, log_path, worker_urls)
        self.url = self.proc.start()

    def get_url(self) -> str:
        return self.url

    def pid(self) -> int:
        return self.proc.proc.pid

    def shutdown(self) -> None:
        self.proc.stop()
