"""The master port a trainer (or critic) rank 0 hands out stays reserved until its process group's
store listens (slime/ray/actors.py: _Rendezvous). Before, the port was closed as soon as it was
picked, and a second group picking a free port meanwhile could get the same one: its TCPStore
then failed with EADDRINUSE. Real sockets and torch's real TCPStore, no Ray needed."""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ray")


def test_a_reserved_master_port_is_never_handed_out_again_and_its_store_still_binds_it():
    import torch.distributed as dist

    from slime.ray.actors import _Rendezvous

    first, second = _Rendezvous(), _Rendezvous()
    master = first.master_address()
    port = master[1]
    # other groups picking a free port meanwhile (the kernel's bind(0), what any picker does)
    others = {second.master_address()[1] for _ in range(50)}
    for _ in range(2000):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            others.add(s.getsockname()[1])
    assert port not in others, "a reserved master port was handed to another group"
    # rank 0's store (what init_process_group and WeightGroup create) binds the reserved port
    store = dist.TCPStore("127.0.0.1", port, 1, True, timeout=timedelta(seconds=10))
    store.set("k", "v")
    assert store.get("k") == b"v"
    first.formed(master)  # released: only the store holds the port now
    with pytest.raises(OSError):
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    del store
