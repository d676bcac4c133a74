"""The trainer's offload keeps its host buffers for the next step (pinning is slow; see
slime/backends/offload.py). The pool itself runs anywhere; the GPU round trip is in
tests/gpu/test_offload_gpu.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from slime.backends.offload import HostBuffers  # noqa: E402


def test_a_returned_host_buffer_serves_the_next_offload_of_the_same_size():
    pool = HostBuffers()
    a, b = pool.take(1024), pool.take(4096)
    assert pool.allocated == 2
    pool.give(a)
    pool.give(b)
    assert pool.take(4096) is b and pool.take(1024) is a
    assert pool.allocated == 2


def test_a_buffer_in_use_is_never_handed_out_twice():
    pool = HostBuffers()
    first = pool.take(64)
    second = pool.take(64)  # `first` not given back yet: a new one
    assert second is not first and pool.allocated == 2
    assert first.numel() == second.numel() == 64 and first.dtype == torch.uint8
