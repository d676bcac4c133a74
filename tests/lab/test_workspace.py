"""Workspace: one action = one undoable entry; A stays fixed; bad input changes nothing."""
from __future__ import annotations

import pytest

from lab.core import workspace as W
from lab.core.change import ChangeError
from lab.core.experiment import PRIVATE_FIELDS
from lab.rules import edit as E
from lab.rules.dependents import new_experiment


def ws_for(recipe="glm4-9b"):
    return W.Workspace(b=new_experiment(recipe))


def test_async_from_colocated_is_one_entry_and_one_undo_restores_both_pools():
    ws = ws_for("glm4.7")
    before = ws.b
    ws = E.edit(ws, "placement.scheduling", "async")
    assert len(ws.undo) == 1 and ws.b.placement.ownership == "disaggregated"
    undone = W.undo(ws)
    assert undone.b == before
    assert undone.b.placement.ownership == "colocated" and undone.b.placement.scheduling == "sync"


def test_redo_reapplies_every_field_of_the_entry():
    ws = E.edit(ws_for("deepseek-r1"), "placement.scheduling", "async")
    after = ws.b
    assert W.redo(W.undo(ws)).b == after


def test_model_change_is_one_entry_and_undo_restores_the_previous_recipe_values():
    ws = ws_for("glm4-9b")
    ws2 = E.edit(ws, "model.recipe", "glm5.3")
    assert len(ws2.undo) == 1 and ws2.b.resources.pp == 8
    assert W.undo(ws2).b == ws.b


def test_new_edit_clears_redo():
    ws = W.undo(E.edit(ws_for(), "resources.tp", 4))
    assert ws.redo
    assert E.edit(ws, "resources.pp", 2).redo == []


def test_undo_on_empty_history_changes_nothing():
    ws = ws_for()
    assert W.undo(ws) == ws and W.redo(ws) == ws


def test_setting_the_same_value_adds_no_entry():
    ws = ws_for()
    assert E.edit(ws, "resources.tp", ws.b.resources.tp).undo == []


def test_history_is_bounded():
    ws = ws_for()
    for i in range(W.MAX_HISTORY + 5):
        ws = E.edit(ws, "task.num_rollout", i + 10)
    assert len(ws.undo) == W.MAX_HISTORY


def test_bad_value_raises_and_leaves_the_workspace_unchanged():
    ws = ws_for()
    snapshot = ws.model_dump()
    with pytest.raises(ChangeError) as exc:
        E.edit(ws, "placement.engine_gpus", -1)
    assert exc.value.field == "placement.engine_gpus"
    assert ws.model_dump() == snapshot


def test_apply_choices_with_one_bad_field_changes_nothing():
    ws = ws_for()
    snapshot = ws.model_dump()
    with pytest.raises(ChangeError) as exc:
        E.apply_choices(ws, {"resources": {"tp": 4}, "serving": {"concurrency": "lots"}}, "load")
    assert exc.value.field == "serving.concurrency"
    assert ws.model_dump() == snapshot


def test_apply_choices_names_an_unknown_key():
    with pytest.raises(ChangeError) as exc:
        E.apply_choices(ws_for(), {"resources": {"tpp": 4}}, "load")
    assert exc.value.field == "resources.tpp" and "resources.tp" in exc.value.message


def test_apply_choices_partial_is_one_entry_with_recipe_dependents():
    ws = E.apply_choices(ws_for(), {"model": {"recipe": "glm4.7"}, "resources": {"tp": 4}}, "load json")
    assert len(ws.undo) == 1 and ws.undo[0].label == "load json"
    assert ws.b.placement.nodes == 8 and ws.b.resources.tp == 4  # the recipe's nodes, the given TP
    assert W.undo(ws).b == ws_for().b


def test_apply_choices_full_payload_reproduces_it_exactly():
    src = E.edit(ws_for("qwen3.8-27b"), "placement.scheduling", "async").b
    ws = E.apply_choices(ws_for("glm4-9b"), src.model_dump(mode="json"), "load")
    assert ws.b == src


def test_reset_is_undoable_and_keeps_private_paths():
    ws = E.edit(ws_for("glm5.3"), "paths.save", "/mine/ckpt")
    ws = E.edit(ws, "placement.external_engine_addrs", ["10.0.0.1:30000"])
    reset = E.reset(ws)
    assert reset.b.model.recipe == "glm4-9b" and reset.b.paths.save == "/mine/ckpt"
    assert reset.b.placement.external_engine_addrs == ["10.0.0.1:30000"]
    assert all(c.path not in PRIVATE_FIELDS for c in reset.undo[-1].changes)
    assert W.undo(reset).b == ws.b


def test_a_stays_fixed_across_edits_undo_and_redo():
    ws = W.save_a(ws_for("glm4.7"))
    a = ws.a.model_copy(deep=True)
    ws = E.edit(ws, "placement.scheduling", "async")
    ws = E.edit(ws, "resources.tp", 4)
    ws = W.undo(ws)
    ws = W.redo(ws)
    ws = E.reset(ws)
    assert ws.a == a


def test_saving_and_clearing_a_is_not_in_b_history():
    ws = E.edit(ws_for(), "resources.tp", 4)
    assert W.save_a(ws).undo == ws.undo
    assert W.clear_a(W.save_a(ws)).a is None and W.clear_a(ws).undo == ws.undo


def test_restore_a_is_one_undoable_entry():
    ws = W.save_a(ws_for("glm4.7"))
    a = ws.a
    ws = E.edit(E.edit(ws, "model.recipe", "deepseek-r1"), "resources.tp", 4)
    edited = ws.b
    restored = W.restore_a(ws)
    assert restored.b == a and restored.a == a and len(restored.undo) == 3
    assert W.undo(restored).b == edited


def test_restore_a_without_a_is_refused():
    with pytest.raises(ChangeError):
        W.restore_a(ws_for())


def test_ab_diff_shows_dependent_changes():
    ws = E.edit(W.save_a(ws_for("glm4.7")), "placement.scheduling", "async")
    diff = {d["path"]: (d["a"], d["b"]) for d in W.ab_diff(ws)}
    assert diff["placement.scheduling"] == ("sync", "async")
    assert diff["placement.ownership"] == ("colocated", "disaggregated")
    assert W.ab_diff(ws_for()) == []


def test_workspace_round_trips_through_json():
    ws = W.save_a(E.edit(ws_for("glm4.7"), "placement.scheduling", "async"))
    again = W.Workspace.model_validate_json(ws.model_dump_json())
    assert again == ws and W.undo(again).b == W.undo(ws).b
