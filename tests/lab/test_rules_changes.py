"""apply_change: one change with its dependent changes, each with a reason; bad values refused."""
from __future__ import annotations

import pytest

from lab.core.change import ChangeError
from lab.core.experiment import PRIVATE_FIELDS, Experiment
from lab.core.recipes import all_recipes, get_recipe
from lab.rules.dependents import apply_change, new_experiment
from lab.rules.derive import derive
from lab.rules.validate import validate
from tests.lab.runtime_pending import without_pending

RECIPES = list(all_recipes())


def _expected(recipe):
    tr = recipe.training
    total = tr.nodes * tr.gpus_per_node
    if recipe.placement == "colocated":
        return total, total
    return tr.train_gpus, tr.rollout_gpus


@pytest.mark.parametrize("name", RECIPES)
def test_choosing_a_model_copies_its_recipe(name):
    r = all_recipes()[name]
    e = new_experiment(name)
    train, rollout = _expected(r)
    assert e.placement.ownership == r.placement
    assert (e.placement.nodes, e.placement.gpus_per_node) == (r.training.nodes, r.training.gpus_per_node)
    assert (e.placement.train_gpus, e.placement.rollout_gpus, e.placement.engine_gpus) == (train, rollout, r.rollout.engine_gpus)
    p = r.parallel
    assert (e.resources.tp, e.resources.pp, e.resources.cp, e.resources.ep) == (p.tp, p.pp, p.cp, p.ep)
    assert (e.resources.pp_first_stage_layers, e.resources.pp_last_stage_layers) == (p.pp_first_stage_layers, p.pp_last_stage_layers)
    assert (e.resources.cpu_adam, e.resources.recompute, e.resources.max_tokens_per_gpu) == (r.cpu_adam, r.recompute, r.max_tokens_per_gpu)
    assert (e.task.rollout_batch_size, e.task.n_samples_per_prompt) == (r.rollout_batch_size, r.n_samples_per_prompt)
    assert e.rollout.max_response_len == r.max_response_len
    # ordinary serving is every recipe's starting point; EAGLE's settings wait for the user to turn it on
    assert e.serving.eagle.enabled is False
    assert e.serving.eagle.enabled == bool(r.rollout.eagle and r.rollout.eagle.enabled)
    if r.rollout.eagle:
        eg = r.rollout.eagle
        assert (e.serving.eagle.head, e.serving.eagle.steps, e.serving.eagle.topk, e.serving.eagle.draft_tokens) == (
            eg.head, eg.steps, eg.topk, eg.draft_tokens)
    assert e.corrections.tis == r.rollout.tis
    assert e.serving.mem_fraction_static == r.rollout.mem_fraction_static
    assert e.precision.recurrent_state_dtype == ("float32" if r.kind == "hybrid" else None)


@pytest.mark.parametrize("name", [n for n in RECIPES if n != "glm4-9b"])
def test_model_change_is_one_step_with_reasons_and_keeps_private_paths(name):
    base = new_experiment("glm4-9b").model_copy(update={"paths": Experiment().paths.model_copy(update={"save": "/mine/ckpt"})})
    new, changes = apply_change(base, "model.recipe", name)
    assert changes[0].path == "model.recipe" and changes[0].reason is None
    assert all(c.reason for c in changes[1:]) and len(changes) > 3
    # Only paths still at the old recipe's default may follow the new recipe's default.
    defaults = get_recipe(name).default_paths
    assert all(c.path in defaults for c in changes if c.path in PRIVATE_FIELDS)
    assert new.paths.save == "/mine/ckpt"


def test_untouched_default_paths_follow_the_model_and_come_back():
    tiny, _ = apply_change(new_experiment("glm4-9b"), "model.recipe", "tiny-cpu")
    assert tiny.paths.hf_checkpoint == "runs/tiny-cpu/model"
    assert tiny.evaluation.enabled and tiny.evaluation.data_path == "runs/tiny-cpu/data/eval.jsonl"
    back, _ = apply_change(tiny, "model.recipe", "glm4-9b")
    assert back.paths == new_experiment("glm4-9b").paths
    mine, _ = apply_change(tiny, "paths.hf_checkpoint", "/home/me/tiny")
    again, _ = apply_change(mine, "model.recipe", "glm4-9b")
    assert again.paths.hf_checkpoint == "/home/me/tiny"


def test_apply_change_never_modifies_its_input():
    e = new_experiment("glm4.7-flash")
    before = e.model_dump()
    apply_change(e, "placement.scheduling", "async")
    assert e.model_dump() == before


def test_async_from_colocated_moves_to_separate_pools_in_one_change():
    e = new_experiment("qwen3.8-27b")
    new, changes = apply_change(e, "placement.scheduling", "async")
    paths = {c.path for c in changes}
    assert {"placement.scheduling", "placement.ownership", "placement.train_gpus", "placement.rollout_gpus"} <= paths
    assert new.placement.ownership == "disaggregated"
    d = derive(new)
    assert new.placement.train_gpus + new.placement.rollout_gpus <= d.declared_gpus
    assert new.placement.rollout_gpus % new.placement.engine_gpus == 0 and d.dp > 0
    assert not [f for f in without_pending(validate(new)) if f.level == "error"]


def test_async_split_adds_nodes_when_the_cluster_cannot_hold_both_pools():
    e = new_experiment("deepseek-r1")
    new, changes = apply_change(e, "placement.scheduling", "async")
    nodes = next(c for c in changes if c.path == "placement.nodes")
    assert nodes.new > 16 and "node" in nodes.reason
    assert derive(new).total_gpus <= derive(new).declared_gpus
    assert not [f for f in validate(new) if f.id in ("RES-2", "PAR-1", "PAR-2") or "--colocate" in f.message]


def test_colocated_restores_synchronous_scheduling():
    e, _ = apply_change(new_experiment("glm4-9b"), "placement.scheduling", "async")
    new, changes = apply_change(e, "placement.ownership", "colocated")
    assert new.placement.scheduling == "sync"
    sched = next(c for c in changes if c.path == "placement.scheduling")
    assert "synchronous" in sched.reason
    assert new.placement.train_gpus == new.placement.rollout_gpus == 8


def test_nodes_change_under_colocated_resizes_both_pools():
    new, changes = apply_change(new_experiment("glm4.7"), "placement.nodes", 4)
    assert new.placement.train_gpus == new.placement.rollout_gpus == 32
    assert {c.path for c in changes} == {"placement.nodes", "placement.train_gpus", "placement.rollout_gpus"}


def test_other_incompatibilities_are_not_rewritten():
    new, changes = apply_change(new_experiment("glm4-9b"), "resources.tp", 8)
    assert [c.path for c in changes] == ["resources.tp"]
    assert any(f.id == "PAR-1" for f in validate(new))


def test_unknown_field_is_named_with_close_names():
    with pytest.raises(ChangeError) as exc:
        apply_change(new_experiment(), "resources.tpp", 2)
    assert exc.value.field == "resources.tpp" and "resources.tp" in exc.value.message


def test_unknown_model_lists_the_known_models():
    with pytest.raises(ChangeError) as exc:
        apply_change(new_experiment(), "model.recipe", "llama-7b")
    assert exc.value.field == "model.recipe" and "glm4-9b" in exc.value.message


def test_out_of_range_value_names_the_allowed_range():
    with pytest.raises(ChangeError) as exc:
        apply_change(new_experiment(), "task.n_samples_per_prompt", 0)
    assert exc.value.field == "task.n_samples_per_prompt" and "≥ 1" in exc.value.message and "≤ 256" in exc.value.message


@pytest.mark.parametrize("path,value", [("resources.tp", "2"), ("resources.cpu_adam", 1), ("resources.tp", 2.5),
                                        ("placement.external_engine_addrs", "h:1"), ("placement.ownership", "shared")])
def test_wrong_type_or_choice_is_refused_with_the_field_named(path, value):
    with pytest.raises(ChangeError) as exc:
        apply_change(new_experiment(), path, value)
    assert exc.value.field == path


@pytest.mark.parametrize("value", ["/data/a\nrm -rf /", "/data/\x00x", "/data/a\rb"])
def test_paths_with_nul_or_newline_are_refused(value):
    with pytest.raises(ChangeError) as exc:
        apply_change(new_experiment(), "paths.save", value)
    assert exc.value.field == "paths.save" and "newline" in exc.value.message


@pytest.mark.parametrize("value", ["/data/my dir/x", "/data/'q'\"", "/data/$(whoami)", "/data/`id`"])
def test_shell_characters_in_paths_are_legal(value):
    new, _ = apply_change(new_experiment(), "paths.save", value)
    assert new.paths.save == value


def test_newline_in_a_hook_or_address_list_is_refused():
    with pytest.raises(ChangeError):
        apply_change(new_experiment(), "task.custom_reward_path", "a.b\nc")
    with pytest.raises(ChangeError):
        apply_change(new_experiment(), "placement.external_engine_addrs", ["h:1", "h:2\n"])
