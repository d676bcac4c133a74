"""The collective weight export (slime/backends/megatron/export.py) over real gloo ranks: rank 0
gets every owned tensor of every rank exactly once, in buckets, with uneven bucket counts per
rank; other ranks get nothing; a name owned by two ranks is refused, not silently overwritten."""

from __future__ import annotations

import os
import socket

import pytest

torch = pytest.importorskip("torch")


def _expected(world: int) -> set[str]:
    return {f"w.{r}.{b}" for r in range(world) for b in range(r + 1)} | {"replica.0"}


def _rank(rank: int, world: int, port: int, duplicate: bool, q, withhold: bool = False) -> None:
    import torch.distributed as dist

    from slime.backends.megatron.export import gather_to_rank0

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    # rank r walks r + 1 buckets; each holds one tensor it owns and one it does not
    buckets = [[(f"w.{rank}.{b}", torch.full((2, b + 1), float(rank), dtype=torch.float32 if b % 2 else torch.bfloat16)),
                (f"replica.{b}", torch.zeros(1))] for b in range(rank + 1)]
    if duplicate and rank == 1:
        buckets.append([("w.0.0", torch.zeros(2, 1, dtype=torch.bfloat16))])
    # withhold: the last rank owns nothing of its own (as an EP rank that kept its experts did)
    owns = (lambda n: rank == 0) if withhold and rank == world - 1 else (lambda n: n.startswith("w.") or rank == 0)
    try:
        got = [[(n, t.float().tolist(), str(t.dtype)) for n, t in b]
               for b in gather_to_rank0(iter(buckets), owns, "cpu", _expected(world))]
        q.put((rank, "ok", got))
    except RuntimeError as e:
        q.put((rank, str(e), []))
    finally:
        dist.destroy_process_group()


def _gather(world: int, duplicate: bool = False, withhold: bool = False) -> dict:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, world, port, duplicate, q, withhold)) for r in range(world)]
    for p in procs:
        p.start()
    out = {}
    for _ in range(world if not duplicate else 1):  # a refused export leaves the others waiting
        rank, status, got = q.get(timeout=120)
        out[rank] = (status, got)
    for p in procs:
        p.join(timeout=5 if duplicate else 60)
        if p.is_alive():
            p.kill()
    return out


def test_rank0_receives_every_owned_tensor_once_and_other_ranks_nothing():
    out = _gather(3)
    assert all(status == "ok" for status, _ in out.values())
    flat = {n: (v, dt) for b in out[0][1] for n, v, dt in b}
    want = _expected(3)
    assert set(flat) == want and sum(len(b) for b in out[0][1]) == len(want)
    assert flat["w.2.1"] == ([[2.0, 2.0], [2.0, 2.0]], "torch.float32") and flat["w.1.0"][1] == "torch.bfloat16"
    assert out[1][1] == [] and out[2][1] == []


def test_a_tensor_owned_by_two_ranks_is_refused():
    out = _gather(2, duplicate=True)
    (status, _), = out.values()
    assert "came from two ranks" in status and "w.0.0" in status


def test_an_export_that_misses_a_rank_s_tensors_fails_on_rank0():
    """EP is never silently wrong again: the last rank sends nothing; rank 0 names what is missing
    (the other ranks finish their rounds normally)."""
    out = _gather(3, withhold=True)
    assert out[1][0] == "ok" and out[2][0] == "ok"
    assert "weight export incomplete: 3 of 7 tensors missing" in out[0][0] and "w.2.0" in out[0][0], out[0][0]
