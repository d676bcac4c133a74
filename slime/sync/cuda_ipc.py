"""Colocated weight hand-over on one GPU without a host copy: CUDA IPC handles.

The trainer packs a bucket of HF-named tensors into one flat CUDA buffer and exports its IPC
handle (torch.multiprocessing's reduce_tensor); the engine process on the same GPU opens the
handle, copies the views into its parameters and drops them. Only the handle and the
(name, dtype, shape, offset) table travel (through Ray), never the bytes. The trainer keeps the
buffer alive until every engine has answered (TrainerActor.finish_ipc).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

ALIGN = 256  # every view starts on an aligned offset (any dtype may view it)


@dataclass
class PackedBucket:
    flat: torch.Tensor
    handle: dict[str, Any]


def pack_bucket(bucket: dict[str, torch.Tensor]) -> PackedBucket:
    from torch.multiprocessing.reductions import reduce_tensor

    meta, off = [], 0
    for name, t in bucket.items():
        n = t.numel() * t.element_size()
        meta.append((name, str(t.dtype).removeprefix("torch."), list(t.shape), off, n))
        off += -(-n // ALIGN) * ALIGN
    device = next(iter(bucket.values())).device
    flat = torch.empty(max(off, 1), dtype=torch.uint8, device=device)
    for (_name, _, _, o, n), t in zip(meta, bucket.values()):
        flat[o:o + n].copy_(t.detach().contiguous().view(-1).view(torch.uint8))
    torch.cuda.current_stream(device).synchronize()  # the receiver reads on its own stream
    return PackedBucket(flat, {"ipc": reduce_tensor(flat), "meta": meta})


def open_bucket(handle: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Views (no copy) into the sender's buffer; valid while the sender keeps it."""
    fn, args = handle["ipc"]
    flat = fn(*args)
    return {name: flat[o:o + n].view(getattr(torch, dt)).view(shape) for name, dt, shape, o, n in handle["meta"]}
