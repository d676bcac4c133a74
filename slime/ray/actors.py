"""Ray actors: an engine host (embedded engine + its HTTP server), a trainer rank, and the
rollout manager. Each wraps a plain class; only placement and process boundaries live here."""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any

import ray

from slime.rollout.manager import RolloutManager

if TYPE_CHECKING:
    from slime.backends.protocol import CriticBackend, TrainerBackend
    from slime.sync.cuda_ipc import PackedBucket
    from slime.sync.mooncake import MooncakeSender


def _limit_threads(n: int = 1) -> None:
    # Every actor otherwise starts one intra-op thread per core; on a 2-core machine with 3+
    # actors that oversubscribes the CPU and slows everything down.
    import torch

    torch.set_num_threads(max(1, n))


@ray.remote
class EngineActor:
    def __init__(self, hf_checkpoint: str, seed: int, threads: int = 1, server_args: dict | None = None):
        _limit_threads(threads)
        from slime.inference.engine_core import EngineCore
        from slime.rollout.engines.embedded import EngineServer

        self.core = EngineCore(hf_checkpoint, seed=seed, dtype=(server_args or {}).get("dtype"))
        self.server = EngineServer(self.core, server_args=server_args)
        self.url = self.server.start()

    def get_url(self) -> str:
        return self.url

    def set_step_delay(self, seconds: float) -> None:
        """Tests and benchmarks: sleep this long per decoding step (to act mid-request)."""
        self.core.step_delay_s = float(seconds)

    def stage_bucket(self, key: str, payload) -> None:
        """Out-of-band half of load_format "ray_staged" (bytes that came through the object store)
        or "cuda_ipc" (a CUDA IPC handle of a bucket in the trainer's GPU memory)."""
        self.server.staging.put(key, payload)

    def memory(self, reset_peak: bool = False) -> dict[str, float]:
        from slime.backends.offload import memory_figures

        out = memory_figures("engine")
        if reset_peak and out:
            import torch

            torch.cuda.reset_peak_memory_stats()
        return out

    def shutdown(self) -> None:
        self.server.stop()


def _reserve_port() -> socket.socket:
    """A free port, held until the process group's store listens on it.

    Picking a free port and closing it lets a second group started meanwhile (the critic's, a
    weight-update group) pick the same one: the later store then fails with EADDRINUSE. The port
    stays bound here instead, with SO_REUSEADDR and not listening: the kernel never hands a bound
    port to another ``bind(0)``, while torch's TCPStore (SO_REUSEADDR too) may still bind it. The
    caller closes the socket once its store listens (:func:`_release`)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", 0))
    return s


def _release(reserved: socket.socket | None) -> None:
    if reserved is not None:
        reserved.close()


class _Rendezvous:
    """The master address of a process group whose rank 0 lives in this actor: the port is
    reserved from :meth:`master_address` until the group is formed (:meth:`formed`)."""

    def __init__(self) -> None:
        self._reserved: dict[int, socket.socket] = {}

    def master_address(self) -> tuple[str, int]:
        s = _reserve_port()
        port = s.getsockname()[1]
        self._reserved[port] = s
        return ray.util.get_node_ip_address(), port

    def formed(self, master: tuple[str, int]) -> None:
        _release(self._reserved.pop(int(master[1]), None))


@ray.remote
class TrainerActor:
    trainer: TrainerBackend  # built by init(), which the runtime calls before anything else
    _mooncake: MooncakeSender  # made by the first mooncake_prepare()

    def __init__(self, rank: int, world_size: int, threads: int = 1):
        _limit_threads(threads)
        self.rank, self.world_size = rank, world_size
        self._rdv = _Rendezvous()
        self._ipc: list[PackedBucket] = []  # kept alive from export_ipc_buckets() to finish_ipc()
        self._bcast: list[dict[str, Any]] = []  # from prepare_broadcast() to finish_broadcast()

    def master_address(self) -> tuple[str, int]:
        """Called on rank 0: its address and a port reserved until init() (or the weight group) forms."""
        return self._rdv.master_address()

    def init(self, master: tuple[str, int], cfg) -> dict:
        """Build what the registry names for --train-backend (slime/backends/registry.py); returns
        the runtime state of --load ({} when fresh)."""
        from slime.backends.registry import backend_class

        cls = backend_class(cfg.cluster.train_backend)
        try:
            self.trainer = cls.build(cfg, self.rank, self.world_size, master)
        finally:  # the group's store listens now (or never will): the reservation has done its job
            self._rdv.formed(master)
        return self.trainer.resume_state

    def train(self, records, num_steps: int) -> dict[str, float]:
        return self.trainer.train(records, num_steps)

    def log_probs(self, records, use_ref: bool = False) -> list[list[float]]:
        """Every rank is called (a collective step for a sharded model); a bystander answers []."""
        if self._bystander():
            return []
        return self.trainer.log_probs(records, use_ref)

    def offload(self) -> dict[str, float]:
        return self.trainer.offload()

    def onload(self) -> dict[str, float]:
        return self.trainer.onload()

    def memory(self, reset_peak: bool = False) -> dict[str, float]:
        out = self.trainer.memory()
        if reset_peak:
            import torch

            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
        return out

    # -- weight export: WeightSync calls every rank at once; rank 0's result is the export ----------
    def _bystander(self) -> bool:
        """A rank other than 0 of a backend whose export and log-probs need no peers (each rank
        holds the whole model: embedded DDP): nothing to do. A backend with ``collective = True``
        (Megatron: TP gathers, PP stages, EP experts meet on rank 0) has every rank iterate."""
        return self.rank != 0 and not getattr(self.trainer, "collective", False)

    def write_weights_dir(self, path: str, buffer_size: int) -> str:
        from slime.hf.weights import write_weights_dir

        if self._bystander():
            return path
        named = self.trainer.named_weights()  # collective; {} on ranks other than 0
        return str(write_weights_dir(named, path, buffer_size)) if self.rank == 0 else path

    def export_bucket_refs(self, buffer_size: int) -> list:
        """Buckets of safetensors bytes put into the object store; the caller passes the refs on
        and drops them after the engines have loaded (then Ray frees them)."""
        from slime.hf.weights import encode_bucket

        if self._bystander():
            return []
        return [ray.put(encode_bucket(b)) for b in self.trainer.export_buckets(buffer_size)]

    def export_bucket_bytes(self, buffer_size: int) -> list[bytes]:
        from slime.hf.weights import encode_bucket

        if self._bystander():
            return []
        return [encode_bucket(b) for b in self.trainer.export_buckets(buffer_size)]

    def export_ipc_buckets(self, buffer_size: int) -> list[dict]:
        """Colocated GPUs: the buckets stay in this process's CUDA memory; what leaves is a CUDA IPC
        handle per bucket (slime/sync/cuda_ipc.py). Kept alive until finish_ipc()."""
        from slime.sync.cuda_ipc import pack_bucket

        if self._bystander():
            self._ipc = []
            return []
        self._ipc = [pack_bucket(b) for b in self.trainer.export_buckets(buffer_size, device="cuda")]
        return [p.handle for p in self._ipc]

    def finish_ipc(self) -> None:
        self._ipc = []
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # -- distributed weight update (rank 0 broadcasts; slime/sync/dist_group.py) -------------------
    def init_weight_group(self, master: tuple[str, int], world_size: int, group_name: str, backend: str) -> None:
        """Joins as rank 0 and returns once every engine has joined (they are posted concurrently)."""
        from slime.sync.dist_group import WeightGroup

        self._groups = getattr(self, "_groups", {})
        old = self._groups.pop(group_name, None)
        if old is not None:
            old.destroy()
        try:
            self._groups[group_name] = WeightGroup(master[0], master[1], 0, world_size, group_name, backend)
        finally:
            self._rdv.formed(master)

    def destroy_weight_group(self, group_name: str) -> None:
        g = getattr(self, "_groups", {}).pop(group_name, None)
        if g is not None:
            g.destroy()

    def prepare_broadcast(self, buffer_size: int) -> list[tuple[list[str], list[str], list[list[int]]]]:
        """Snapshot the weights in buckets; (names, dtypes, shapes) per bucket for the requests."""
        from slime.sync.dist_group import dtype_name

        groups = getattr(self, "_groups", {})
        device = "cuda" if any(g.backend == "nccl" for g in groups.values()) else "cpu"
        if self._bystander():
            self._bcast = []
            return []
        self._bcast = list(self.trainer.export_buckets(buffer_size, device=device))
        return [(list(b), [dtype_name(t.dtype) for t in b.values()], [list(t.shape) for t in b.values()])
                for b in self._bcast]

    def broadcast_bucket(self, group_name: str, index: int) -> None:
        g = self._groups[group_name]
        for t in self._bcast[index].values():
            g.broadcast(t.to(g.device))

    def finish_broadcast(self) -> None:
        self._bcast = []

    # -- Mooncake transfer engine (rank 0 writes into engine buffers; slime/sync/mooncake.py) -----
    def mooncake_prepare(self, buffer_size: int, protocol: str, device: str) -> list:
        from slime.sync.mooncake import MooncakeSender

        if self._bystander():
            return []
        if self.rank != 0:  # take part in the collective export; rank 0 alone sends
            self.trainer.named_weights()
            return []
        if getattr(self, "_mooncake", None) is None:
            self._mooncake = MooncakeSender(ray.util.get_node_ip_address(), protocol, device)
        return self._mooncake.prepare(self.trainer.named_weights(), buffer_size)

    def mooncake_send(self, index: int, target_session: str, remote_ptr: int) -> int:
        return self._mooncake.send(index, target_session, remote_ptr)

    def save(self, root: str, iteration: int, state: dict[str, Any]) -> str:
        """Every rank calls it (a sharded save is collective); rank 0 writes the runtime state."""
        return self.trainer.save(root, iteration, state)

    def pid(self) -> int:
        return os.getpid()


@ray.remote
class CriticActor:
    """One critic rank of --advantage-estimator ppo, placed in the bundle of the trainer rank of
    the same index; the backend is the registry's `critic` of --train-backend."""

    critic: CriticBackend  # built by init(), which the runtime calls before anything else

    def __init__(self, rank: int, world_size: int, threads: int = 1):
        _limit_threads(threads)
        self.rank, self.world_size = rank, world_size
        self._rdv = _Rendezvous()

    def master_address(self) -> tuple[str, int]:
        return self._rdv.master_address()

    def init(self, master: tuple[str, int], cfg) -> None:
        from slime.backends.registry import critic_class

        try:
            self.critic = critic_class(cfg.cluster.train_backend).build(cfg, self.rank, self.world_size, master)
        finally:
            self._rdv.formed(master)

    def values(self, records) -> list[list[float]]:
        return self.critic.values(records)

    def train(self, records, num_steps: int) -> dict[str, float]:
        return self.critic.train(records, num_steps)

    def save(self, root: str, iteration: int, state: dict[str, Any]) -> str:
        return self.critic.save(root, iteration, state)

    def offload(self) -> dict[str, float]:
        return self.critic.offload()

    def onload(self) -> dict[str, float]:
        return self.critic.onload()


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
                 worker_urls: list[str] | None = None, prefill: list[tuple[str, int | None]] | None = None,
                 decode: list[str] | None = None):
        from slime.rollout.router import SGLangRouterProcess

        self.proc = SGLangRouterProcess(ray.util.get_node_ip_address(), None, policy, health_interval_s,
                                        health_timeout_s, log_path, worker_urls, prefill, decode)
        self.url = self.proc.start()

    def get_url(self) -> str:
        return self.url

    def pid(self) -> int:
        proc = self.proc.proc
        assert proc is not None, "started in __init__"
        return proc.pid

    def shutdown(self) -> None:
        self.proc.stop()
