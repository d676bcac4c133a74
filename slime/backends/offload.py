"""Give a trainer's GPU memory back while the colocated engines sample, and take it again after.

The storages behind the parameters and optimizer state are copied to pinned host memory and
resized to 0 bytes in place; gradients are dropped (every step zeroes them first). Tensors keep
their identity, so views (Megatron's params and main_grads into its contiguous buffers, the
optimizer's references) stay valid once the storages are resized back and refilled: the same
in-place trick FSDP uses, with no allocator hooks (torch_memory_saver is not needed).

The pinned host buffers are kept here for the next offload, by exact size: the same storages go
out at every step, so from the second step on no memory is pinned (page-locking is far slower
than the copy), whatever the settings of torch's caching host allocator, which rounds each block
up to a power of two.
"""

from __future__ import annotations

from typing import Iterable

import torch

GIB = 2**30


def memory_figures(prefix: str) -> dict[str, float]:
    """This process's allocated/peak and the whole device's used memory, in GiB ({} on CPU)."""
    if not torch.cuda.is_available():
        return {}
    free, total = torch.cuda.mem_get_info()
    return {f"{prefix}_allocated_gib": torch.cuda.memory_allocated() / GIB,
            f"{prefix}_peak_gib": torch.cuda.max_memory_allocated() / GIB,
            f"{prefix}_device_used_gib": (total - free) / GIB}


def optimizer_tensors(opt) -> Iterable[torch.Tensor]:
    """Master params and state of a torch optimizer, a megatron-core one, or a chain of them."""
    for o in getattr(opt, "chained_optimizers", None) or [opt]:
        inner = getattr(o, "optimizer", o)
        for group in getattr(inner, "param_groups", []):
            yield from group["params"]
        for st in getattr(inner, "state", {}).values():
            yield from (v for v in st.values() if torch.is_tensor(v))


class HostBuffers:
    """Host buffers by size, kept between offloads (pinned where CUDA is present)."""

    def __init__(self) -> None:
        self._free: dict[int, list[torch.Tensor]] = {}
        self.allocated = 0  # buffers made, over the pool's life (a test reads it)

    def take(self, nbytes: int) -> torch.Tensor:
        free = self._free.get(nbytes)
        if free:
            return free.pop()
        self.allocated += 1
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=torch.cuda.is_available())

    def give(self, buf: torch.Tensor) -> None:
        """Return a buffer once no copy from or into it is pending."""
        self._free.setdefault(buf.numel(), []).append(buf)


class DeviceOffloader:
    def __init__(self) -> None:
        self._saved: list[tuple[torch.UntypedStorage, torch.Tensor | None, int]] = []
        self._host = HostBuffers()

    @property
    def offloaded(self) -> bool:
        return bool(self._saved)

    def offload(self, keep: Iterable[torch.Tensor], drop: Iterable[torch.Tensor] = ()) -> int:
        """Free the CUDA storages of `keep` (saved to host first) and `drop` (not saved).
        Returns the bytes freed."""
        if self._saved:
            return 0
        seen: set[int] = set()
        for tensors, save in ((keep, True), (drop, False)):
            for t in tensors:
                if t is None or not t.is_cuda:
                    continue
                st = t.untyped_storage()
                ptr, n = st.data_ptr(), st.nbytes()
                if n == 0 or ptr in seen:
                    continue
                seen.add(ptr)
                host = None
                if save:
                    host = self._host.take(n)
                    host.untyped_storage().copy_(st, non_blocking=True)
                self._saved.append((st, host, n))
        torch.cuda.synchronize()
        for st, _, _ in self._saved:
            st.resize_(0)
        torch.cuda.empty_cache()
        return sum(n for _, _, n in self._saved)

    def onload(self) -> int:
        restored = 0
        for st, host, n in self._saved:
            st.resize_(n)
            if host is not None:
                st.copy_(host.untyped_storage(), non_blocking=True)
            restored += n
        if self._saved:
            torch.cuda.synchronize()
        for _, host, _ in self._saved:
            if host is not None:
                self._host.give(host)  # the copies above are done: the buffer serves the next offload
        self._saved = []
        return restored
