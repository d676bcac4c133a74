"""Samples -> per-sample training records, split into optimizer steps, ranks and micro-batches.

Backend-neutral (no torch): the embedded trainer pads these into [B, T] tensors; a Megatron
backend would pack them. Advantages come from slime.data.batch_builder, the same function the
lab shows, and group normalization refuses a batch that is not whole groups of n.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slime.data.batch_builder import compute_advantages, pack_samples
from slime.data.sample import Sample


@dataclass
class TrainRecord:
    tokens: list[int]
    prompt_len: int
    advantage: float
    rollout_log_probs: list[float]  # one per response token
    response_mask: list[int]  # 1 where the policy generated the token
    # Per-token advantages, set by the trainer when they vary along the response (KL in the
    # reward, --normalize-advantages; slime/training/advantages.py). None: `advantage` everywhere.
    token_advantages: list[float] | None = field(default=None, repr=False)
    reward: float = 0.0  # the sample's reward (SC weighs it by the sequence ratio)
    group: int = 0  # the sample's prompt group in the rollout (0 .. rollout_batch_size - 1)
    # --advantage-estimator ppo: the critic's values before this rollout's update and the GAE
    # returns (its targets), one per response token (slime/training/advantages.py:ppo_targets).
    values: list[float] | None = field(default=None, repr=False)
    returns: list[float] | None = field(default=None, repr=False)

    @property
    def response_len(self) -> int:
        return len(self.tokens) - self.prompt_len


def build_records(samples: list[Sample], n: int, rollout_batch_size: int, estimator: str,
                  normalize: bool, std_normalization: bool) -> list[TrainRecord]:
    expected = rollout_batch_size * n
    if len(samples) != expected:
        raise ValueError(f"a rollout must hold rollout_batch_size x n = {rollout_batch_size} x {n} = "
                         f"{expected} samples, got {len(samples)}: group normalization would be wrong")
    for g in range(rollout_batch_size):  # groups must be consecutive and whole
        ids = {s.group_index for s in samples[g * n:(g + 1) * n]}
        if len(ids) != 1:
            raise ValueError(f"samples {g * n}..{(g + 1) * n - 1} mix groups {sorted(ids)}")
    rewards = [float(s.reward) for s in samples]  # type: ignore[arg-type]  # scored before the batch; None raises here
    advantages = compute_advantages(rewards, n, estimator, normalize, std_normalization)
    records = []
    for i, (s, a) in enumerate(zip(samples, advantages)):
        mask = list(s.loss_mask) if s.loss_mask is not None else [1] * s.response_length
        if len(mask) != s.response_length:
            raise ValueError(f"loss mask of {len(mask)} tokens for a response of {s.response_length}: {s.describe()}")
        records.append(TrainRecord(s.tokens, len(s.prompt_tokens), a, list(s.rollout_log_probs), mask,
                                   reward=rewards[i], group=i // n))
    return records


def split_steps(records: list[TrainRecord], num_steps: int) -> list[list[TrainRecord]]:
    """Consecutive slices of equal size (validate() guarantees divisibility)."""
    size = len(records) // num_steps
    return [records[i * size:(i + 1) * size] for i in range(num_steps)]


def rank_shard(step: list[TrainRecord], rank: int, world_size: int, balance: bool = False) -> list[TrainRecord]:
    """This data-parallel rank's share of a step: consecutive slices, or with `balance`
    (--balance-data) equal counts whose token totals are as even as a greedy split makes them."""
    size = len(step) // world_size
    if not balance or world_size == 1:
        return step[rank * size:(rank + 1) * size]
    return [step[i] for i in balanced_partition([len(r.tokens) for r in step], world_size)[rank]]


def balanced_partition(lengths: list[int], parts: int) -> list[list[int]]:
    """Indices split into `parts` groups of len(lengths) // parts each (a remainder is left out, as
    the plain split leaves it), longest first into the group with the fewest tokens that has room.
    Deterministic: ties go to the lower group and the lower index, so every rank computes the same
    split without talking to the others."""
    size = len(lengths) // parts
    groups: list[list[int]] = [[] for _ in range(parts)]
    totals = [0] * parts
    for i in sorted(range(size * parts), key=lambda i: (-lengths[i], i)):
        g = min((k for k in range(parts) if len(groups[k]) < size), key=lambda k: (totals[k], k))
        groups[g].append(i)
        totals[g] += lengths[i]
    return [sorted(g) for g in groups]


def micro_batches(shard: list[TrainRecord], micro_batch_size: int,
                  max_tokens: int | None) -> list[list[TrainRecord]]:
    """Fixed-size micro-batches, or packs of <= max_tokens tokens (--use-dynamic-batch-size)."""
    if max_tokens:
        packs = pack_samples([len(r.tokens) for r in shard], max_tokens)
        return [[shard[i] for i in p] for p in packs]
    return [shard[i:i + micro_batch_size] for i in range(0, len(shard), micro_batch_size)]
