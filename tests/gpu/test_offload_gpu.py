"""Offload on a GPU: storages go to host memory and come back bit for bit, and from the second
step on no host buffer is made (pinned allocations cost seconds per step at trainer sizes). Skips
without CUDA."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]


def test_offload_round_trips_and_reuses_its_pinned_host_buffers():
    from slime.backends.offload import DeviceOffloader

    g = torch.Generator(device="cuda").manual_seed(0)
    keep = [torch.randn(n, device="cuda", generator=g) for n in (1 << 20, 3 << 18, 1 << 20)]
    view = keep[0][10:20]  # a view into a kept storage stays valid across the round trip
    drop = [torch.randn(1 << 20, device="cuda", generator=g)]
    want = [t.clone() for t in keep]
    off = DeviceOffloader()
    for step in range(3):
        before = torch.cuda.memory_allocated()
        freed = off.offload(keep, drop)
        assert freed == sum(t.untyped_storage().nbytes() for t in want) + (1 << 22)
        assert torch.cuda.memory_allocated() <= before - freed
        off.onload()
        assert all(torch.equal(a, b) for a, b in zip(keep, want))
        assert torch.equal(view, want[0][10:20])
        assert off._host.allocated == 3, f"step {step}: host buffers made {off._host.allocated}"
        for t in keep:
            t.add_(1.0)
        want = [t.clone() for t in keep]
