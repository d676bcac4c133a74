"""Repair previews: what each shows before anything is applied, and applying one is ONE undo step."""
from __future__ import annotations

import pytest

from lab.core import workspace as W
from lab.core.change import ChangeError, validated
from lab.core.experiment import PRIVATE_FIELDS, set_path
from lab.core.recipes import all_recipes, get_recipe
from lab.rules import edit as E
from lab.rules.dependents import apply_change, new_experiment
from lab.rules.repair import apply_repair, propose_repairs
from lab.rules.validate import validate
from tests.lab.runtime_pending import without_pending


def _exp(recipe: str, **values):
    data = new_experiment(recipe).model_dump(mode="json")
    for path, value in values.items():
        set_path(data, path.replace("__", "."), value)
    return validated(data)


def _by_id(exp):
    return {r.id: r for r in propose_repairs(exp)}


def test_pd_lacking_resources_on_a_shared_pool_grows_it_from_the_recipe_engine_size():
    exp, _ = apply_change(new_experiment("glm4.7-flash"), "serving.pd.enabled", True)
    engine = get_recipe("glm4.7-flash").rollout.engine_gpus
    r = _by_id(exp)["SGL-4:pd_grow_shared"]
    assert r.fixes == "SGL-4" and r.finding.id == "SGL-4"
    assert r.values == {"placement.nodes": 2, "serving.pd.prefill_engines": 1, "serving.pd.decode_engines": 1}
    # the field changes (dependents included, with reasons) and the allocation after it
    changed = {c.path: (c.old, c.new) for c in r.changes}
    assert changed["placement.nodes"] == (1, 2) and changed["placement.train_gpus"] == (8, 16)
    assert all(c.reason for c in r.changes if c.path != "placement.nodes")
    assert r.allocation["engines"] == 2 and r.allocation["engine_gpus"] == engine
    assert r.allocation["prefill_gpus"] == engine and r.allocation["decode_gpus"] == engine
    assert r.allocation["total_gpus"] == 16 and r.derived.total_gpus == 16
    # RDMA devices are required, never proposed; SGL-4 is gone, SGL-5 (the devices) remains
    assert [q.key for q in r.requires] == ["rdma_devices", "mooncake"]
    assert [f.id for f in without_pending(r.remaining)] == ["SGL-5"]
    assert exp == apply_change(new_experiment("glm4.7-flash"), "serving.pd.enabled", True)[0]  # nothing applied


@pytest.mark.parametrize("recipe", [n for n in all_recipes() if n != "tiny-cpu"])
def test_every_pd_repair_fixes_its_finding_and_invents_no_machine_field(recipe):
    for decode in (1, 3):
        exp = _exp(recipe, serving__pd__enabled=True, serving__pd__decode_engines=decode)
        for r in propose_repairs(exp):
            assert not PRIVATE_FIELDS & set(r.values), r.id
            after = E.edit_many(W.Workspace(b=exp), r.values, r.title).b
            assert r.finding not in validate(after), r.id
            if r.fixes == "SGL-4":
                assert after.serving.pd.rdma_devices == [] and any(q.key == "rdma_devices" for q in r.requires)


def test_parallelism_that_does_not_divide_the_gpus_offers_the_recipe_layout_or_a_tiled_pool():
    flash, _ = apply_change(new_experiment("glm4.7-flash"), "resources.tp", 8)
    rs = _by_id(flash)
    assert rs["PAR-1:par_recipe"].values == {"resources.tp": 2} and without_pending(rs["PAR-1:par_recipe"].remaining) == []
    nine, _ = apply_change(new_experiment("glm4-9b"), "placement.train_gpus", 3)
    pool = _by_id(nine)["PAR-1:par_pool"]
    unit = get_recipe("glm4-9b").parallel
    assert pool.values == {"placement.train_gpus": unit.tp * unit.pp * unit.cp}
    assert pool.allocation["dp"] == 1 and not [f for f in pool.remaining if f.id == "PAR-1"]


def test_async_on_a_shared_pool_offers_separate_pools_sized_from_the_recipe_or_sync():
    data = new_experiment("glm4.7-flash").model_dump(mode="json")
    data["placement"]["scheduling"] = "async"
    exp = validated(data)
    rs = _by_id(exp)
    split = rs["COL-1:col_split"]
    assert split.values == {"placement.ownership": "disaggregated"}
    engine = get_recipe("glm4.7-flash").rollout.engine_gpus
    assert split.allocation["rollout_gpus"] % engine == 0 and split.allocation["rollout_gpus"] >= engine
    assert split.allocation["dp"] >= 1 and not [f for f in split.remaining if "--colocate" in f.message]
    assert rs["COL-1:col_sync"].values == {"placement.scheduling": "sync"}


def test_staleness_from_several_steps_per_rollout_is_repaired_with_one_step_and_tis():
    exp, _ = apply_change(new_experiment("glm4-9b"), "placement.scheduling", "async")
    exp, _ = apply_change(exp, "task.num_steps_per_rollout", 2)
    r = _by_id(exp)["LAB-ASY-STEPS:async_one_step_tis"]
    assert r.values == {"task.num_steps_per_rollout": 1, "corrections.tis": True}
    assert "LAB-ASY-STEPS" not in {f.id for f in validate(E.edit_many(W.Workspace(b=exp), r.values, r.title).b)}


def test_apply_repair_is_one_undo_step_and_a_stays_fixed():
    exp, _ = apply_change(new_experiment("glm4.7-flash"), "serving.pd.enabled", True)
    ws = W.save_a(W.Workspace(b=exp))
    a = ws.a
    applied = apply_repair(ws, "SGL-4:pd_grow_shared")
    assert len(applied.undo) == 1 and applied.b.placement.nodes == 2 and applied.a == a
    assert {c.path for c in applied.undo[-1].changes} >= {"placement.nodes", "placement.train_gpus", "placement.rollout_gpus"}
    back = W.undo(applied)
    assert back.b == exp and back.a == a
    assert W.redo(back).b == applied.b


def test_a_stale_repair_id_is_refused_and_changes_nothing():
    ws = W.Workspace(b=new_experiment("glm4-9b"))
    before = ws.model_dump()
    with pytest.raises(ChangeError) as err:
        apply_repair(ws, "SGL-4:pd_split")
    assert err.value.field == "action.id" and "does not apply" in err.value.message
    assert ws.model_dump() == before


def test_repair_ids_are_unique_and_stable():
    exp = _exp("glm4-9b", placement__scheduling="async", task__num_steps_per_rollout=2, task__n_samples_per_prompt=1)
    ids = [r.id for r in propose_repairs(exp)]
    assert len(ids) == len(set(ids)) and ids == [r.id for r in propose_repairs(exp)]


def _fits_and_is_accepted(exp) -> None:
    from lab.rules.memory import estimate_memory
    from lab.rules.runtime_verdict import judge

    assert judge(exp).errors == []
    assert estimate_memory(exp).training.fits is not False


def test_the_default_experiments_cp_refusal_repairs_to_the_nearest_layout_the_runtime_accepts():
    exp = new_experiment("glm4-9b")  # the page's first experiment: TP 2 and CP 2; CP needs Transformer Engine
    refused = {f.params.get("code") for f in validate(exp) if f.id == "RUNTIME" and f.level == "error"}
    assert refused == {"megatron.context_parallel"}  # TP > 1 runs in the loop now (issue 24)
    (r,) = [r for r in propose_repairs(exp) if r.fixes == "RUNTIME"]
    # the nearest layout: drop CP only, keep TP 2 (and sequence parallel); 4 GPUs → DP 2
    assert r.id == "MEG-CP:layout" and r.values == {"resources.cp": 1}
    assert r.remaining == [] and r.derived.dp == 2
    ws = apply_repair(W.Workspace(b=exp), r.id)
    assert [f for f in validate(ws.b) if f.level == "error"] == []
    _fits_and_is_accepted(ws.b)
    assert len(ws.undo) == 1


def test_a_layout_repair_keeps_model_parallelism_where_whole_weights_cannot_fit_a_gpu():
    for recipe in ("glm4.7", "glm5.3", "deepseek-r1", "qwen3.8-27b", "glm4.7-flash"):
        exp = _exp(recipe, resources__cpu_adam=False, resources__tp=1)  # 80 GiB GPUs: does not fit
        assert [f for f in validate(exp) if f.id == "LAB-MEM-1"], recipe
        r = [r for r in propose_repairs(exp) if r.fixes == "LAB-MEM-1"][0]
        after = apply_repair(W.Workspace(b=exp), r.id).b
        assert after.resources.tp * after.resources.pp * after.resources.ep > 1, (recipe, r.values)
        _fits_and_is_accepted(after)
        assert not [f for f in validate(after) if f.id == "LAB-MEM-1"], recipe


def test_the_memory_warnings_advice_is_the_layout_its_repair_sets_and_the_runtime_accepts():
    exp = _exp("glm4-9b", resources__tp=1, resources__cp=1)  # whole weights on each of 4 GPUs: 91 GiB
    (warning,) = [f for f in validate(exp) if f.id == "LAB-MEM-1"]
    r = [r for r in propose_repairs(exp) if r.fixes == "LAB-MEM-1"][0]
    after = apply_repair(W.Workspace(b=exp), r.id).b
    res = after.resources
    assert f"TP {res.tp}, PP {res.pp}, CP {res.cp}, EP {res.ep}" in warning.fix and "raise TP" not in warning.fix
    assert set(r.values) <= {f"resources.{k}" for k in ("tp", "pp", "cp", "ep", "cpu_adam", "pp_first_stage_layers",
                                                        "pp_last_stage_layers")}
    _fits_and_is_accepted(after)


def test_without_a_fitting_layout_the_memory_warning_says_so_and_offers_no_layout():
    exp = _exp("deepseek-r1", placement__train_gpus=8, placement__nodes=2, resources__tp=1, resources__pp=1,
               resources__ep=8, resources__pp_last_stage_layers=None)
    (warning,) = [f for f in validate(exp) if f.id == "LAB-MEM-1"]
    assert "No layout of these 8 training GPUs" in warning.fix
    assert not [r for r in propose_repairs(exp) if r.fixes == "LAB-MEM-1"]


def test_the_layout_search_follows_the_runtime_verdict(monkeypatch):
    """Stand-in: the runtime's Megatron capability check is wrapped to refuse TP > 1 as the Ray loop
    once did (it accepts TP now); the lab must then propose no TP > 1, with no lab rule changed."""
    from lab.rules import memory_fit, runtime_verdict
    from slime.backends.megatron import capabilities
    from slime.refusals import Refusal

    real = capabilities.megatron_trainer_errors

    def refuses_tp(cfg):
        tp = int(cfg.megatron.get("tensor_model_parallel_size", 1) or 1)
        return real(cfg) + ([Refusal("megatron.dp_whole", {"ranks": 0, "model": tp})] if tp > 1 else [])

    exp = _exp("glm4-9b", resources__tp=1, resources__cp=1)
    memos = (runtime_verdict._JUDGED, runtime_verdict._FOUND, memory_fit._FOUND)
    for memo in memos:
        memo.clear()
    monkeypatch.setattr(capabilities, "megatron_trainer_errors", refuses_tp)
    try:
        fits = memory_fit.nearest_fits(exp, limit=3)
        assert fits and all(f.layout.tp == 1 for f in fits)
        assert memory_fit.nearest_fits(exp, limit=1) != []
    finally:
        for memo in memos:
            memo.clear()


@pytest.mark.parametrize("recipe,values,repair_id", [
    ("glm4.7-flash", {"corrections.tis": True, "corrections.icepop": True}, "COR-TIS-ICEPOP:keep_icepop"),
    ("glm4.7-flash", {"corrections.tis": True, "corrections.icepop": True}, "COR-TIS-ICEPOP:keep_tis"),
    ("glm4.7", {"corrections.sc": True}, "COR-SC:sc_without_tis"),  # the recipe turns TIS on
    ("glm4.7", {"rollout.over_sampling_batch_size": 64}, "BAT-7:over_sampling_2x"),  # below its batch of 128
])
def test_a_refused_variant_repairs_to_what_the_runtime_accepts(recipe, values, repair_id):
    from lab.rules.runtime_verdict import judge

    exp = new_experiment(recipe)
    for path, value in values.items():
        exp, _ = apply_change(exp, path, value)
    assert judge(exp).errors
    after = apply_repair(W.Workspace(b=exp), repair_id).b
    assert judge(after).errors == []
