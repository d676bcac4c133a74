"""One flag contract between the lab and the runtime.

Every field declares its runtime flag (or why it has none); the simple flag lines of experiment.sh
come from those declarations; the choice lists are the runtime's registries; every recipe ×
ownership × scheduling with the main toggles is accepted by the runtime's dry-run pre-flight
(file existence left out: the paths point at a cluster); every runtime flag is reachable from a
field or through the additional-flags field.
"""
from __future__ import annotations

import itertools
import shlex
import typing

import pytest

from lab.core.argv import runtime_argv
from lab.core.change import ChangeError
from lab.core.experiment import EXTRA_FLAGS_PATH, FIELD_FLAGS, LAB_ONLY, LEAF_FIELDS, SIMPLE_FLAG, Experiment
from lab.core.recipes import all_recipes
from lab.core.runtime_choices import advantage_estimators, kl_estimators, reward_types
from lab.rules.dependents import apply_change, new_experiment
from lab.rules.runtime_verdict import advanced_flags, judge
from lab.rules.validate import validate
from lab.web.export import experiment_files
from slime.args import MEGATRON_FLAGS, MEGATRON_PREFIXES
from slime.dry_run import dry_run
from slime.flags import describe
from tests.lab.runtime_pending import is_pending

RUNTIME_FLAGS = {f.name for f in describe()}


def _runtime_knows(flag: str) -> bool:
    return flag in RUNTIME_FLAGS or flag in MEGATRON_FLAGS or flag.startswith(MEGATRON_PREFIXES) \
        or flag.startswith("--sglang-")


@pytest.mark.parametrize("path", sorted(LEAF_FIELDS))
def test_every_field_declares_its_flag_or_says_why_it_has_none(path):
    assert bool(FIELD_FLAGS[path]) != bool(LAB_ONLY.get(path)), path
    for flag in FIELD_FLAGS[path]:
        if path == EXTRA_FLAGS_PATH:
            continue
        assert _runtime_knows(flag), f"{path} declares {flag}, which the runtime does not know"


def test_simple_flag_lines_come_from_the_declarations():
    exp = new_experiment("glm4-9b")
    for path, value in (("rollout.partial_rollout", True), ("rollout.over_sampling_batch_size", 64),
                        ("corrections.tis", True), ("task.advantage_estimator", "gspo")):
        exp, _ = apply_change(exp, path, value)
    argv = runtime_argv(exp)
    data = exp.model_dump()
    for path, flag in SIMPLE_FLAG.items():
        value = data
        for part in path.split("."):
            value = value[part]
        if value is None or value is False:
            assert flag not in argv, flag
        elif value is True:
            assert flag in argv, flag
        else:
            assert flag in argv and str(argv[argv.index(flag) + 1]) in (str(value), repr(value).rstrip("0").rstrip(".")), flag
    sh = experiment_files(exp)["experiment.sh"]
    assert "  --partial-rollout\n" in sh and "  --over-sampling-batch-size 64\n" in sh


def test_choice_lists_are_the_runtime_registries():
    from slime.rewards import REWARD_TYPES, TEST_ONLY_REWARDS

    task = Experiment.model_fields["task"].annotation.model_fields
    assert typing.get_args(task["rm_type"].annotation) == reward_types()
    assert set(reward_types()) == set(REWARD_TYPES) - TEST_ONLY_REWARDS and "dapo" not in reward_types() or \
        "dapo" in REWARD_TYPES
    assert typing.get_args(task["advantage_estimator"].annotation) == advantage_estimators()
    assert "low_var_kl" in kl_estimators()


TOGGLES = {
    "plain": {},
    "pd": {"serving.pd.enabled": True, "serving.pd.rdma_devices": ["mlx5_0"]},
    "eagle": {"serving.eagle.enabled": True},
    "fp8": {"precision.rollout": "fp8"},
    "tis": {"corrections.tis": True},
    "icepop": {"corrections.tis": False, "corrections.icepop": True},
    "sc": {"corrections.tis": False, "corrections.icepop": False, "corrections.sc": True},
    "partial": {"rollout.partial_rollout": True},
    "straw": {"rollout.queue": True, "rollout.queue_state_dir": "/data/straw"},
}


def _combos():
    # The six tiny-gpu-<family> twins share one recipe shape (only the model spec differs, and each
    # spec's flags are those of a seeded recipe of the same family): the first twin runs every
    # combination, the others their defaults.
    twins = [r for r in all_recipes() if r.startswith("tiny-gpu-")]
    for recipe, ownership, scheduling, toggle in itertools.product(
            all_recipes(), ("colocated", "disaggregated", "external"), ("sync", "async"), TOGGLES):
        if recipe in twins[1:] and (ownership, scheduling, toggle) != ("colocated", "sync", next(iter(TOGGLES))):
            continue
        yield pytest.param(recipe, ownership, scheduling, toggle, id=f"{recipe}-{ownership}-{scheduling}-{toggle}")


def _build(recipe, ownership, scheduling, toggle):
    exp = new_experiment(recipe)
    steps = [("placement.ownership", ownership), ("placement.scheduling", scheduling)]
    if ownership == "external":
        steps.insert(0, ("placement.external_engine_addrs", ["10.0.0.5:30000", "10.0.0.6:30000"]))
    steps += list(TOGGLES[toggle].items())
    for path, value in steps:
        exp, _ = apply_change(exp, path, value)
    if exp.serving.pd.enabled:  # PD groups that fill the rollout pool: the lab's own SGL-4 repair, as a user applies it
        from lab.rules.repair import propose_repairs

        fix = next((r for r in propose_repairs(exp) if r.fixes == "SGL-4"), None)
        for path, value in (fix.values if fix else {}).items():
            exp, _ = apply_change(exp, path, value)
    return exp


@pytest.mark.parametrize("recipe,ownership,scheduling,toggle", list(_combos()))
def test_runtime_dry_run_accepts_every_recipe_layout_and_toggle(recipe, ownership, scheduling, toggle):
    try:
        exp = _build(recipe, ownership, scheduling, toggle)
    except ChangeError as exc:
        pytest.skip(f"the lab refuses this combination at the field: {exc}")
    if scheduling == "async" and ownership == "colocated":
        assert exp.placement.ownership == "disaggregated"  # the lab moves async off a shared pool
    from lab.core.argv import server_groups
    from lab.core.recipes import get_recipe

    result = dry_run(runtime_argv(exp), async_mode=exp.placement.scheduling == "async", environment=False,
                     groups=server_groups(exp, get_recipe(recipe)))
    assert result.cfg is not None, result.errors
    # The lab shows exactly the runtime's refusals (the same argv, the same judge).
    shown = {f.params.get("reason") for f in validate(exp) if f.id == "RUNTIME" and f.level == "error"}
    assert shown == set(result.errors)
    pending = [e for e in result.errors if is_pending(e)]
    if pending and pending == result.errors:
        # the lab repairs a pending refusal to a layout the runtime accepts now
        from lab.rules.repair import propose_repairs

        fixes = [r for r in propose_repairs(exp) if r.fixes == "RUNTIME" and r.id.startswith("MEG-")]
        assert fixes, pending
        after = exp.model_copy(deep=True)
        for path, value in fixes[0].values.items():
            after, _ = apply_change(after, path, value)
        assert judge(after).errors == []
        pytest.xfail(f"a runtime capability is pending; the lab shows its refusal: {pending[0][:120]}")
    assert result.errors == []
    assert result.plan and sum(s.role == "trainer" for s in result.plan) == result.cfg.cluster.num_trainer_ranks


def _sample_value(flag: str) -> list[str]:
    info = next((f for f in describe() if f.name == flag), None)
    if info is None:  # a Megatron pass-through flag: a value is whatever follows
        return [flag, "1"]
    if info.kind == "switch":
        return [flag]
    if info.choices:
        return [flag, info.choices[0]]
    if info.type in ("int", "float"):
        return [flag, "1"]
    if info.type == "json":
        return [flag, "{}"]
    return [flag] + ["x"] * (2 if info.kind == "list" and flag == "--eval-prompt-data" else 1)


@pytest.mark.parametrize("flag", advanced_flags())
def test_every_runtime_flag_no_control_owns_is_reachable_through_the_extra_flags(flag):
    exp, _ = apply_change(new_experiment("tiny-cpu"), EXTRA_FLAGS_PATH, shlex.join(_sample_value(flag)))
    result = judge(exp)
    assert result.cfg is not None, result.errors  # the runtime's parser reads it
    owned = [f for f in validate(exp) if f.message_id == "RUNTIME.extra_owned"]
    assert owned == []


def test_a_flag_a_control_owns_is_refused_and_points_at_the_control():
    exp, _ = apply_change(new_experiment("tiny-cpu"), EXTRA_FLAGS_PATH, "--rm-type f1")
    hits = [f for f in validate(exp) if f.message_id == "RUNTIME.extra_owned"]
    assert hits and hits[0].fields == [EXTRA_FLAGS_PATH, "task.rm_type"] and "task.rm_type" in hits[0].fix


def test_an_unknown_extra_flag_names_the_closest_real_flag():
    exp, _ = apply_change(new_experiment("tiny-cpu"), EXTRA_FLAGS_PATH, "--eps-clipp 0.3")
    hits = [f for f in validate(exp) if f.id == "RUNTIME" and EXTRA_FLAGS_PATH in f.fields]
    assert hits and hits[0].params["code"] == "usage.unknown_flag_hint"
    assert hits[0].params["text"]["params"]["close"] == "--eps-clip"
    # the rest of the verdict is still shown while the user types
    assert new_experiment("tiny-cpu").model_dump()["task"] == exp.model_dump()["task"]


def test_an_extra_flag_missing_its_value_is_named():
    exp, _ = apply_change(new_experiment("tiny-cpu"), EXTRA_FLAGS_PATH, "--eps-clip")
    hits = [f for f in validate(exp) if f.id == "RUNTIME" and EXTRA_FLAGS_PATH in f.fields]
    assert hits and "--eps-clip" in hits[0].message


def test_extra_flags_are_private_in_share_links():
    from lab.core.experiment import PRIVATE_FIELDS

    assert EXTRA_FLAGS_PATH in PRIVATE_FIELDS


@pytest.mark.parametrize("recipe,changes", [
    ("glm4.7", {"placement.nodes": 8}),
    ("glm4-9b", {"serving.pd.enabled": True, "serving.pd.rdma_devices": ["mlx5_0"]}),
    ("qwen3.8-27b", {}),
])
def test_the_pages_layout_diagram_is_the_runtimes_placement_plan(recipe, changes):
    from lab.render.gpu_layout import gpu_layout as _layout
    from lab.rules.runtime_verdict import placement

    exp = new_experiment(recipe)
    for path, value in changes.items():
        exp, _ = apply_change(exp, path, value)
    plan = placement(exp)
    layout = _layout(exp, plan)
    for slot in plan:
        if slot["role"] == "trainer":
            assert layout["nodes"][slot["node"]][slot["gpus"][0]][0] in ("train", "shared")
        elif slot["role"] in ("engine", "prefill", "decode"):
            cell = layout["nodes"][slot["node"]][slot["gpus"][0]]
            assert cell[0] in ("rollout", "shared") and cell[1] == slot["index"]
    drawn_trainers = sum(c[0] in ("train", "shared") for n in layout["nodes"] for c in n)
    assert drawn_trainers == sum(s["role"] == "trainer" for s in plan)
