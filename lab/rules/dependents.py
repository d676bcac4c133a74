"""A user's change and every field that must change with it: choosing a model copies its recipe's
parallelism, engine size, node counts ...; async from colocated moves to separate pools; colocated
restores sync.

CONTRACT (other modules and the page rely on these names and shapes):
- `apply_change(exp, path, value) -> (Experiment, list[FieldChange])`: sets one field and every
  field that must change with it. Raises `ChangeError(field, message)` for an unknown field or an
  invalid value; the input experiment is never modified.
- `new_experiment(recipe) -> Experiment`: the defaults of a recipe.

Only the dependencies listed in `_dependents` are rewritten, each with a `reason`; any other
incompatibility stays visible as a finding (lab/rules/validate.py), so the lab never silently
exports a different algorithm.
"""
from __future__ import annotations

import math
from typing import Any

from lab.core.change import ChangeError, FieldChange, check_text, unknown_field_error, validated
from lab.core.experiment import LEAF_FIELDS, Experiment, get_path, iter_field_paths, set_path
from lab.core.messages import Text, text
from lab.core.model_spec import kind_of
from lab.core.recipes import Recipe, RecipeError, all_recipes, get_recipe
from lab.rules.derive import ETP

_FIELD_INFO = dict(iter_field_paths())


def new_experiment(recipe: str = "glm4-9b") -> Experiment:
    exp, _ = apply_change(Experiment(), "model.recipe", recipe)
    return exp


def _lcm(a: int, b: int) -> int:
    return a * b // math.gcd(a, b)


def _train_unit(data: dict[str, Any], recipe: Recipe | None) -> int:
    """Smallest training pool that the parallel layout tiles: lcm(TP·PP·CP, EP·PP) for MoE."""
    r = data["resources"]
    unit = r["tp"] * r["pp"] * r["cp"]
    if recipe is not None and kind_of(data, recipe) == "moe":
        unit = _lcm(unit, ETP * r["ep"] * r["pp"])
    return unit


def split_pools(data: dict[str, Any], recipe: Recipe | None) -> list[tuple[str, Any, Text]]:
    """Separate training and rollout pools: rollout from the engine size, training the rest.

    Adds nodes when nodes × gpus_per_node cannot hold one engine plus the smallest training pool.
    """
    p = data["placement"]
    gpn = p["gpus_per_node"]
    engine = p["engine_gpus"]
    if gpn == 0 or engine == 0:  # CPU (embedded) run: pools are processes, nothing to split
        return []
    unit = _train_unit(data, recipe)
    nodes = p["nodes"]
    out: list[tuple[str, Any, Text]] = []
    if nodes * gpn - engine < unit:
        need = math.ceil((unit + engine) / gpn)
        out.append(("placement.nodes", need,
                    text("change.split.nodes", nodes=nodes, gpn=gpn, engine=engine, unit=unit, need=need)))
        nodes = need
    total = nodes * gpn
    t = data["task"]
    gbs = max(t["rollout_batch_size"] * t["n_samples_per_prompt"] // t["num_steps_per_rollout"], 1)
    k = max((total - engine) // unit, 1)
    while k > 1 and gbs % k:  # keep DP a divisor of the global batch (BAT-4)
        k -= 1
    train = unit * k
    rollout = engine * ((total - train) // engine)
    out.append(("placement.train_gpus", train, text("change.split.train", train=train, total=total, dp=k, unit=unit)))
    out.append(("placement.rollout_gpus", rollout,
                text("change.split.rollout", rollout=rollout, engines=rollout // engine, engine=engine)))
    return out


def _recipe_values(recipe: Recipe, data: dict[str, Any]) -> list[tuple[str, Any, Text]]:
    name = recipe.display_name

    def why(what: str, **params: Any) -> Text:
        return text(f"change.recipe.{what}", recipe=name, **params)

    tr = recipe.training
    total = tr.nodes * tr.gpus_per_node
    if recipe.placement == "colocated":
        train, rollout = total, total
    else:
        train = tr.train_gpus if tr.train_gpus is not None else total
        rollout = tr.rollout_gpus if tr.rollout_gpus is not None else 0
    eagle = recipe.rollout.eagle
    eagle_on = bool(eagle and eagle.enabled)
    kind_dtype = "float32" if recipe.kind == "hybrid" else None
    vals: list[tuple[str, Any, Text]] = [
        ("placement.ownership", recipe.placement, why("ownership", ownership=recipe.placement)),
        ("placement.nodes", tr.nodes, why("nodes")),
        ("placement.gpus_per_node", tr.gpus_per_node, why("gpus_per_node")),
        ("placement.train_gpus", train, why("train_gpus")),
        ("placement.rollout_gpus", rollout, why("rollout_gpus")),
        ("placement.engine_gpus", recipe.rollout.engine_gpus, why("engine_gpus")),
        ("resources.tp", recipe.parallel.tp, why("tp")),
        ("resources.pp", recipe.parallel.pp, why("pp")),
        ("resources.cp", recipe.parallel.cp, why("cp")),
        ("resources.ep", recipe.parallel.ep, why("ep")),
        ("resources.pp_first_stage_layers", recipe.parallel.pp_first_stage_layers, why("pp_layers")),
        ("resources.pp_last_stage_layers", recipe.parallel.pp_last_stage_layers, why("pp_layers")),
        ("resources.cpu_adam", recipe.cpu_adam, why("cpu_adam")),
        ("resources.recompute", recipe.recompute, why("recompute")),
        ("resources.max_tokens_per_gpu", recipe.max_tokens_per_gpu, why("max_tokens_per_gpu")),
        ("task.rollout_batch_size", recipe.rollout_batch_size, why("rollout_batch_size")),
        ("task.n_samples_per_prompt", recipe.n_samples_per_prompt, why("n_samples_per_prompt")),
        ("rollout.max_response_len", recipe.max_response_len, why("max_response_len")),
        ("serving.eagle.enabled", eagle_on, why("eagle_on" if eagle_on else "eagle_off")),
        ("corrections.tis", recipe.rollout.tis, why("tis_on" if recipe.rollout.tis else "tis_off")),
        ("serving.mem_fraction_static", recipe.rollout.mem_fraction_static, why("mem_fraction_static")),
        ("precision.recurrent_state_dtype", kind_dtype,
         text("change.recipe.hybrid_state") if kind_dtype else why("no_state")),
    ]
    vals += [
        ("task.num_rollout", recipe.num_rollout, why("num_rollout", n=recipe.num_rollout)),
        ("paths.save_interval", recipe.save_interval, why("save_interval")),
    ]
    if recipe.evaluation is not None:
        ev = recipe.evaluation
        vals += [(f"evaluation.{f}", v, why("evaluation", name=ev.name))
                 for f, v in (("enabled", True), ("name", ev.name), ("interval", ev.interval), ("n_samples", ev.n_samples))]
    if recipe.rm_type is not None:
        vals.append(("task.rm_type", recipe.rm_type, why("rm_type", rm_type=recipe.rm_type)))
    if eagle is not None:
        vals += [
            ("serving.eagle.head", eagle.head, why("eagle_head")),
            ("serving.eagle.steps", eagle.steps, why("eagle_steps")),
            ("serving.eagle.topk", eagle.topk, why("eagle_topk")),
            ("serving.eagle.draft_tokens", eagle.draft_tokens, why("eagle_draft_tokens")),
        ]
    return vals


def _default_paths(old_recipe: Recipe | None, recipe: Recipe, old: Experiment) -> list[tuple[str, Any, Text]]:
    """Private paths that still hold the previous recipe's default follow the new recipe's default.

    A path the user edited is never replaced: paths belong to the user, not to the model.
    """
    old_data = old.model_dump(mode="json")
    out: list[tuple[str, Any, Text]] = []
    for path in sorted(set(recipe.default_paths) | set(old_recipe.default_paths if old_recipe else {})):
        field_default = _FIELD_INFO[path].get_default(call_default_factory=True)
        was = (old_recipe.default_paths.get(path, field_default) if old_recipe else field_default)
        new = recipe.default_paths.get(path, field_default)
        if get_path(old_data, path) == was and new != was:
            out.append((path, new, text("change.recipe.default_path", recipe=recipe.display_name)))
    return out


def _dependents(path: str, value: Any, data: dict[str, Any], old: Experiment) -> list[tuple[str, Any, Text]]:
    """Fields that change together with `path`, as (path, value, reason), applied in order."""
    p = data["placement"]
    if path == "model.recipe":
        chosen = get_recipe(value)
        deps = _recipe_values(chosen, data) + _default_paths(_safe_recipe(old.model.recipe), chosen, old)
        for dep_path, dep_value, _ in deps:
            set_path(data, dep_path, dep_value)
        if p["scheduling"] == "async" and p["ownership"] == "colocated":
            deps.append(("placement.ownership", "disaggregated", text("change.async_recipe")))
            set_path(data, "placement.ownership", "disaggregated")
            deps += split_pools(data, chosen)
        return deps
    recipe = _safe_recipe(data["model"]["recipe"])
    if path == "placement.scheduling" and value == "async" and p["ownership"] == "colocated":
        set_path(data, "placement.ownership", "disaggregated")
        return [("placement.ownership", "disaggregated", text("change.async"))] + split_pools(data, recipe)
    if path == "placement.ownership" and value == "colocated":
        n = p["nodes"] * p["gpus_per_node"]
        deps = []
        if p["scheduling"] == "async":
            deps.append(("placement.scheduling", "sync", text("change.colocated.sync")))
        deps += [("placement.train_gpus", n, text("change.colocated.train", n=n)),
                 ("placement.rollout_gpus", n, text("change.colocated.rollout", n=n))]
        return deps
    if path == "placement.ownership" and value == "disaggregated" and old.placement.ownership == "colocated":
        if p["train_gpus"] + p["rollout_gpus"] > p["nodes"] * p["gpus_per_node"]:
            return split_pools(data, recipe)
        return []
    if path in ("placement.nodes", "placement.gpus_per_node") and p["ownership"] == "colocated":
        n = p["nodes"] * p["gpus_per_node"]
        return [("placement.train_gpus", n, text("change.colocated.nodes_train", n=n)),
                ("placement.rollout_gpus", n, text("change.colocated.nodes_rollout", n=n))]
    if path in ("placement.train_gpus", "placement.rollout_gpus") and p["ownership"] == "colocated":
        other = "placement.rollout_gpus" if path == "placement.train_gpus" else "placement.train_gpus"
        return [(other, value, text("change.colocated.equal"))]
    return []


def _safe_recipe(name: str) -> Recipe | None:
    try:
        return get_recipe(name)
    except RecipeError:
        return None


def apply_change(exp: Experiment, path: str, value: Any) -> tuple[Experiment, list[FieldChange]]:
    if path not in LEAF_FIELDS:
        raise unknown_field_error(path)
    check_text(path, value)
    if path == "model.recipe" and (not isinstance(value, str) or value not in all_recipes()):
        raise ChangeError(path, key="error.unknown_model", params={"value": repr(value), "choices": ", ".join(all_recipes())})
    data = exp.model_dump(mode="json")
    old_data = exp.model_dump(mode="json")
    set_path(data, path, value)
    new = validated(data, path)  # the user's own value first, so its error names its field
    deps = _dependents(path, value, data, exp)
    for dep_path, dep_value, _ in deps:
        set_path(data, dep_path, dep_value)
    if deps:  # without dependents `data` is what was just validated: no second pass
        new = validated(data, path)
    changes = [FieldChange(path=path, old=get_path(old_data, path), new=value)]
    seen = {path}
    reasons: dict[str, Text] = {}
    for dep_path, _, reason in deps:  # the last reason for a field wins (it set the final value)
        reasons[dep_path] = reason
    for dep_path, _, _ in deps:
        if dep_path in seen:
            continue
        seen.add(dep_path)
        before, after = get_path(old_data, dep_path), get_path(data, dep_path)
        if before != after:
            changes.append(FieldChange.because(dep_path, before, after, reasons[dep_path]))
    return new, changes
