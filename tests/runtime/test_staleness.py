"""Staleness is measured per sample from the versions of its tokens, and the limit drops whole groups."""

from __future__ import annotations

from slime.data.sample import Sample
from slime.rollout.staleness import drop_stale_groups, sample_staleness, staleness_metrics


def _s(group: int, versions: list[int]) -> Sample:
    return Sample(prompt_id=group, group_index=group, prompt="p", prompt_tokens=[1], response_tokens=[2] * len(versions),
                  token_versions=versions, weight_version=str(versions[-1]) if versions else "3")


def test_staleness_counts_from_the_oldest_token_of_a_sample():
    assert sample_staleness(_s(0, [3, 3]), 3) == 0
    assert sample_staleness(_s(0, [2, 3]), 3) == 1  # a partial sample continued after a sync
    assert sample_staleness(_s(0, []), 4) == 1  # no tokens: the version it finished with


def test_metrics_report_mean_max_and_off_policy_share():
    m = staleness_metrics([_s(0, [3]), _s(0, [2]), _s(1, [1]), _s(1, [3])], 3)
    assert m == {"rollout/staleness_mean": 0.75, "rollout/staleness_max": 2.0, "rollout/offpolicy_sample_frac": 0.5}


def test_limit_drops_whole_groups_and_counts_samples():
    samples = [_s(0, [3]), _s(0, [2]), _s(1, [3]), _s(1, [3])]
    kept, dropped = drop_stale_groups(samples, 2, 3, 0)
    assert kept == samples[2:] and dropped == 2
    assert drop_stale_groups(samples, 2, 3, 1) == (samples, 0)
    assert drop_stale_groups(samples, 2, 3, None) == (samples, 0)
