"""A weight-update process group between trainer rank 0 and engines, outside the default group.

What SGLang's `/init_weights_update_group` builds: its own TCP store (the trainer, rank 0, hosts
it at master_address:master_port) and a process group of 1 + engine ranks. Gloo on CPU; NCCL on
GPU (# UNTESTED on GPU). Broadcasts are from rank 0, one tensor per name, in list order.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


class WeightGroup:
    def __init__(self, master_address: str, master_port: int, rank: int, world_size: int, group_name: str,
                 backend: str = "gloo", timeout_s: float = 120.0):
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend {backend!r}: gloo or nccl")
        timeout = timedelta(seconds=timeout_s)
        self.rank, self.world_size, self.backend, self.name = rank, world_size, backend, group_name
        store = dist.TCPStore(master_address, int(master_port), world_size, rank == 0, timeout=timeout)
        self.store: dist.TCPStore | None = store  # None once destroyed
        prefix = dist.PrefixStore(group_name, store)
        # Any: torch's stubs declare neither backend's collectives (allreduce, broadcast)
        self.pg: Any
        if backend == "gloo":
            self.pg = dist.ProcessGroupGloo(prefix, rank, world_size, timeout)
            self.device = torch.device("cpu")
        else:  # UNTESTED on GPU
            self.pg = dist.ProcessGroupNCCL(prefix, rank, world_size)  # type: ignore[call-arg]  # options has a default
            self.device = torch.device("cuda")
        self.barrier()  # every member has joined when the constructor returns (protocol: init blocks)

    def barrier(self) -> None:
        t = torch.zeros(1, device=self.device)
        self.pg.allreduce([t]).wait()

    def broadcast(self, t: torch.Tensor) -> torch.Tensor:
        self.pg.broadcast(t, 0).wait()
        return t

    def destroy(self) -> None:
        self.pg = None
        self.store = None


DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64, "int64": torch.int64, "int32": torch.int32, "uint8": torch.uint8}


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")
