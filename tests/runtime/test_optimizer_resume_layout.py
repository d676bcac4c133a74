"""Resuming the distributed optimizer's state at another TP/PP/EP layout is refused before the
load, naming the layouts and both ways forward; the CPU mode's (non-distributed) optimizer state
reshards like the weights (tests/runtime/test_megatron_ray_moe_mla_cpu.py resumes it across TP,
PP and EP) and is never refused. A pure rule over the layout record save() writes."""

from __future__ import annotations

import pytest


def _layout(**kw):
    base = {"tp": 1, "pp": 1, "cp": 1, "ep": 2, "etp": 1, "vpp": None, "dp": 4, "distributed_optimizer": True}
    return {**base, **kw}


def test_an_ep_change_with_the_distributed_optimizer_is_refused_with_its_remedies():
    from slime.backends.megatron.optimizer_resume import optimizer_resume_refusal

    why = optimizer_resume_refusal(_layout(), _layout(ep=1, dp=1))
    assert why is not None and why.code == "megatron.resume.distributed_layout"
    assert why.params["changes"] == "EP 2 -> 1"  # only what changed is named
    assert "--no-load-optim" in why


@pytest.mark.parametrize("saved,now", [
    (_layout(), _layout(dp=8)),  # data parallelism alone: what dp_reshardable reshards
    (_layout(distributed_optimizer=False), _layout(ep=1, distributed_optimizer=False)),  # the CPU mode
    (None, _layout(tp=2)),  # a checkpoint saved before the record existed
])
def test_what_reshards_is_not_refused(saved, now):
    from slime.backends.megatron.optimizer_resume import optimizer_resume_refusal

    assert optimizer_resume_refusal(saved, now) is None


def test_a_moe_saved_at_ep2_resumed_at_ep1_with_its_optimizer_state_is_refused_whatever_the_optimizer():
    """megatron-core chains a separate optimizer for the routed experts at EP > 1 and builds one at
    EP 1 (seen loading an EP 2 save at one rank: 'chained_0.optimizer.state...' saved, 'optimizer.state...'
    asked); the loader fails deep inside with a KeyError. The refusal comes first, in plain words."""
    from slime.backends.megatron.optimizer_resume import optimizer_resume_refusal

    saved = _layout(distributed_optimizer=False, optimizers=2)
    why = optimizer_resume_refusal(saved, _layout(ep=1, dp=1, distributed_optimizer=False, optimizers=1))
    assert why is not None and why.code == "megatron.resume.optimizer_count"
    assert (why.params["ep_saved"], why.params["ep_now"]) == (2, 1) and "--no-load-optim" in why
    assert optimizer_resume_refusal(saved, _layout(ep=2, tp=2, distributed_optimizer=False, optimizers=2)) is None
