"""Repair previews: shown before applying; one repair = one undoable entry."""
from __future__ import annotations

from lab.core import workspace as W
from lab.core.change import validated
from lab.core.experiment import set_path
from lab.rules import edit as E
from lab.rules.dependents import new_experiment
from lab.rules.repair import propose_repairs
from lab.rules.validate import validate
from tests.lab.runtime_pending import without_pending


def _pd_short(recipe="glm4-9b"):
    data = new_experiment(recipe).model_dump(mode="json")
    set_path(data, "serving.pd.enabled", True)
    set_path(data, "serving.pd.decode_engines", 2)
    set_path(data, "serving.pd.rdma_devices", ["mlx5_0"])
    return validated(data)


def test_pd_repair_preview_lists_changes_allocation_and_remaining_errors():
    exp = _pd_short()
    repairs = [r for r in propose_repairs(exp) if r.fixes == "SGL-4"]
    assert len(repairs) == 2
    split, grow = repairs
    assert split.values == {"serving.pd.prefill_engines": 1, "serving.pd.decode_engines": 1} and without_pending(split.remaining) == []
    assert grow.values["placement.rollout_gpus"] == 6 and grow.values["placement.nodes"] == 2
    assert grow.derived.total_gpus == 10 and not [f for f in grow.remaining if f.id == "SGL-4"]
    assert exp == _pd_short()  # nothing applied


def test_applying_a_repair_is_one_entry_and_undo_restores_all_its_fields():
    exp = _pd_short()
    grow = [r for r in propose_repairs(exp) if r.fixes == "SGL-4"][1]
    ws = E.edit_many(W.Workspace(b=exp), grow.values, grow.title)
    assert len(ws.undo) == 1 and not [f for f in validate(ws.b) if f.id == "SGL-4"]
    assert W.undo(ws).b == exp


def test_repairs_never_propose_rdma_devices_or_addresses():
    data = new_experiment("glm4-9b").model_dump(mode="json")
    set_path(data, "serving.pd.enabled", True)
    for r in propose_repairs(validated(data)):
        assert "serving.pd.rdma_devices" not in r.values and "placement.external_engine_addrs" not in r.values
