"""How stale a rollout's samples are, and the --max-weight-staleness limit (train_async.py).

Versions are the trainer's policy versions: the start-up weights are version 1 (a resumed run
continues above its saved version) and every training step on a rollout makes the next one.
Engines serve the version of their last sync, and every sample carries the version that
generated each of its tokens (``token_versions``; the loop never syncs while a request is in
flight, so a request's tokens share one version; a continued partial sample keeps the versions
of each segment).

A sample's staleness is ``trainer version - the oldest version among its tokens``: 0 is
on-policy. Plain Python; the loops log :func:`staleness_metrics` and apply :func:`drop_stale_groups`.
"""

from __future__ import annotations

from typing import Sequence


def _version(v) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return 0


def sample_staleness(sample, trainer_version: int) -> int:
    versions = list(getattr(sample, "token_versions", None) or []) or [_version(sample.weight_version)]
    return max(0, trainer_version - min(versions))


def staleness_metrics(samples: Sequence, trainer_version: int) -> dict[str, float]:
    """``rollout/staleness_mean`` / ``_max`` (versions behind the weights being trained) and
    ``rollout/offpolicy_sample_frac`` (share of samples with staleness > 0)."""
    values = [sample_staleness(s, trainer_version) for s in samples] or [0]
    return {"rollout/staleness_mean": sum(values) / len(values), "rollout/staleness_max": float(max(values)),
            "rollout/offpolicy_sample_frac": sum(v > 0 for v in values) / len(values)}


def drop_stale_groups(samples: list, n: int, trainer_version: int, limit: int | None) -> tuple[list, int]:
    """Keep the groups (n consecutive samples) whose every sample is at most ``limit`` versions
    stale; a whole group goes, so group normalization stays right. Returns (kept, samples dropped)."""
    if limit is None:
        return samples, 0
    kept: list = []
    for g in range(0, len(samples), n):
        group = samples[g:g + n]
        if all(sample_staleness(s, trainer_version) <= limit for s in group):
            kept.extend(group)
    return kept, len(samples) - len(kept)
