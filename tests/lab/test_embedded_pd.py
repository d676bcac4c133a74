"""PD on the embedded engine (tiny-cpu, tiny-gpu): the lab renders the prefill and decode groups the
runtime launches (slime.ray.runtime.embedded_pd_specs on the very flags experiment.sh passes), shows
them in the placement plan, and refuses with the runtime what the runtime cannot launch."""
from __future__ import annotations

import pytest

from lab.core import workspace as W
from lab.core.argv import runtime_argv
from lab.rules import edit as E
from lab.rules import validate as lab_rules
from lab.rules.dependents import new_experiment
from lab.rules.runtime_verdict import placement, placement_lines
from lab.web.export import experiment_files
from slime.args import parse_args, validate
from slime.ray.runtime import embedded_pd_specs
from slime.rollout.engines.sglang import TranslationError

POOL = {"tiny-cpu": {}, "tiny-gpu": {"placement.gpus_per_node": 4, "placement.rollout_gpus": 3}}


def _pd(recipe: str, ownership: str, prefill: int = 1, decode: int = 2):
    ws = E.edit(W.Workspace(b=new_experiment(recipe)), "placement.ownership", ownership)
    values = {"serving.pd.enabled": True, "serving.pd.prefill_engines": prefill, "serving.pd.decode_engines": decode}
    return E.edit_many(ws, {**values, **(POOL[recipe] if ownership == "disaggregated" else {})}, "pd").b


@pytest.mark.parametrize("recipe", ["tiny-cpu", "tiny-gpu"])
def test_the_rendered_flags_launch_the_groups_the_lab_shows(recipe):
    exp = _pd(recipe, "disaggregated")
    assert [f.id for f in lab_rules.validate(exp) if f.level == "error"] == []  # no RDMA names needed: Mooncake over TCP
    cfg = parse_args(runtime_argv(exp))
    assert validate(cfg, environment=False) == []
    assert [s.worker_type for s in embedded_pd_specs(cfg)] == ["prefill", "decode", "decode"]
    assert cfg.cluster.use_sglang_router  # the runtime refuses embedded PD behind its own router
    sh = experiment_files(exp)["experiment.sh"]
    assert "--prefill-num-servers 1" in sh and "--use-sglang-router" in sh
    lines = placement_lines(placement(exp))
    assert any(x.startswith("prefill engine 0") for x in lines) and any(x.startswith("decode engines 1-2") for x in lines)


@pytest.mark.parametrize("recipe", ["tiny-cpu", "tiny-gpu"])
def test_colocated_pd_is_refused_as_the_runtime_would(recipe):
    exp = _pd(recipe, "colocated")
    errors = [f for f in lab_rules.validate(exp) if f.level == "error"]
    assert [(f.id, f.fields) for f in errors] == [("SGL-4", ["serving.pd.enabled", "placement.ownership"])]
    with pytest.raises(TranslationError):  # the runtime would stop at launch: no engine left to decode
        embedded_pd_specs(parse_args(runtime_argv(exp)))


def test_a_pool_that_does_not_add_up_is_named_before_launch():
    exp = _pd("tiny-gpu", "disaggregated", prefill=2, decode=2)  # 4 engines on a pool of 3 GPUs
    assert "SGL-4" in [f.id for f in lab_rules.validate(exp) if f.level == "error"]


@pytest.mark.parametrize("recipe", ["tiny-cpu", "tiny-gpu"])
def test_without_pd_nothing_of_it_is_rendered(recipe):
    sh = experiment_files(new_experiment(recipe))["experiment.sh"]
    assert "--prefill-num-servers" not in sh and "--use-sglang-router" not in sh
