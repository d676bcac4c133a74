"""Weight export of the whole model-parallel group: every trainer rank takes part, rank 0 ends up
with every HF tensor exactly once, bucket by bucket (what weight sync streams to the engines).

Each rank walks its own stage's weights (``model.iter_hf_tensors``: TP shards are all-gathered
there, so the ranks of one TP group walk in step, and PP stages / EP ranks name their layers and
experts globally). Of what a rank walks it keeps only the tensors it *owns*, so each tensor has
one owner in the whole world:

- an expert's weights (``mlp.experts.<e>.``): the rank with expert-data-parallel rank 0 and
  expert-tensor-parallel rank 0 among the ranks holding that expert;
- everything else: the rank with data-parallel rank 0 (context-parallel included) and
  tensor-parallel rank 0 of its pipeline stage.

Then round by round (one local bucket per rank per round) every rank announces its kept
(name, dtype, shape) list over the default group, and each owner other than rank 0 sends its
tensors to rank 0 point to point. Rank 0 yields its own bucket and each received one as separate
buckets (each <= the bucket size) and refuses a name it has already seen; the other ranks yield
nothing. Every rank must consume the iterator to the end: the rounds are collectives. Given the
names the model holds, rank 0 checks at the end that it received each of them.
"""

from __future__ import annotations

import re
from typing import Callable, Collection, Iterator

import torch
import torch.distributed as dist

Bucket = list[tuple[str, torch.Tensor]]
_EXPERT = re.compile(r"\.mlp\.experts\.\d+\.")


def is_expert(hf_name: str) -> bool:
    return _EXPERT.search(hf_name) is not None


def owner_rule() -> Callable[[str], bool]:
    """Whether this rank owns an HF-named tensor of the stage it walks (module docstring)."""
    from megatron.core import parallel_state as ps

    dense = ps.get_data_parallel_rank(with_context_parallel=True) == 0 and ps.get_tensor_model_parallel_rank() == 0
    expert = ps.get_expert_data_parallel_rank() == 0 and ps.get_expert_tensor_parallel_rank() == 0
    return lambda name: expert if is_expert(name) else dense


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.removeprefix("torch."))


def gather_to_rank0(local_buckets: Iterator[Bucket], owns: Callable[[str], bool],
                    device: torch.device | str, expected: Collection[str] | None = None) -> Iterator[Bucket]:
    """Rank 0: every owned tensor of every rank, once, in buckets; other ranks: nothing.

    ``expected``: the names the export must hold. Rank 0 raises after the last bucket when any is
    missing (an EP rank that kept its experts, an owner rule that owns nothing) or unexpected: a
    partial export is never taken for a whole one."""
    if expected is None:
        yield from _gather(local_buckets, owns, device)
        return
    got: set[str] = set()
    for bucket in _gather(local_buckets, owns, device):
        got.update(n for n, _ in bucket)
        yield bucket
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    missing, extra = sorted(set(expected) - got), sorted(got - set(expected))
    if missing or extra:
        raise RuntimeError(f"weight export incomplete: {len(missing)} of {len(set(expected))} tensors missing "
                           f"{missing[:5]}, {len(extra)} not in the model {extra[:5]} (slime/backends/megatron/export.py)")


def _gather(local_buckets: Iterator[Bucket], owns: Callable[[str], bool],
            device: torch.device | str) -> Iterator[Bucket]:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        yield from local_buckets
        return
    rank, world = dist.get_rank(), dist.get_world_size()
    it = iter(local_buckets)
    exhausted = False
    seen: set[str] = set()
    while True:
        mine: Bucket = []
        if not exhausted:
            try:
                mine = [(n, t) for n, t in next(it) if owns(n)]
            except StopIteration:
                exhausted = True
        meta = (exhausted, [(n, str(t.dtype), tuple(t.shape)) for n, t in mine])
        metas: list = [None] * world
        dist.all_gather_object(metas, meta)
        if all(done for done, _ in metas):
            return
        if rank == 0:
            for src in range(world):
                if src == 0:
                    got = mine
                else:
                    got = []
                    for n, dt, shape in metas[src][1]:
                        t = torch.empty(shape, dtype=_dtype(dt), device=device)
                        dist.recv(t, src)
                        got.append((n, t))
                for n, _ in got:
                    if n in seen:
                        raise RuntimeError(f"weight export: {n} came from two ranks (rank {src} again); "
                                           f"the ownership rule of slime/backends/megatron/export.py is broken")
                    seen.add(n)
                if got:
                    yield got
        else:
            for _, t in mine:
                dist.send(t.contiguous(), 0)
