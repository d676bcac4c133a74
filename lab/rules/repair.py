"""Repair previews: for findings with a mechanical fix, the field values that fix them, shown before
anything is applied.

A `Repair` carries everything the page shows in a preview: a stable `id`, the finding it fixes
(`fixes` + `finding`), the values the user would set, every field that would change (dependent
changes included, each with its reason), the GPU allocation after it (`allocation`, from
`derive`), what is still required from the user's environment (`requires`) and the errors that
would remain. Nothing is applied here; `apply_repair(ws, id)` applies one as
`lab.rules.edit.edit_many(ws, repair.values, repair.title)`: ONE undoable entry, so one Undo restores
all of its fields together.

Resource changes derive from the recipe: the engine size is the recipe's `rollout.engine_gpus`,
the smallest training pool is the parallel layout's tile (TP·PP·CP, and EP·PP for MoE), and
parallelism repairs offer the recipe's own layout. A runtime refusal of the layout (by its code)
and the memory warning are repaired to the nearest layout the runtime accepts and the memory
estimate fits (lab.rules.memory_fit: the runtime and the estimate are asked, no rule is copied). RDMA device names and external engine
addresses are never proposed or invented: they come from the user's environment and stay listed
in `requires` (a test enforces it).

`title_id` + `params` name the title in the message catalogue (`repair.*`); `title` is its English
rendering (history label, CLI). POST /api/workspace renders the key in the page's language, and
the history entry a repair makes carries the same key as its label.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from pydantic import BaseModel, Field

from lab.core.change import ChangeError, FieldChange
from lab.core.experiment import Experiment
from lab.core.findings import Finding
from lab.core.messages import Text, text
from lab.core.recipes import Recipe, RecipeError, get_recipe
from lab.core.workspace import Workspace
from lab.rules.derive import ETP, Derived, derive
from lab.rules.edit import edit_many
from lab.rules.validate import validate
from slime.limits import MAX_NODES
from slime.parallel_sizes import train_unit

# Fields a repair must never set: they describe the user's machines.
NEVER_PROPOSED = frozenset({"serving.pd.rdma_devices", "placement.external_engine_addrs"})


class Requirement(BaseModel):
    key: str = Field(description="Locale key suffix (req_<key>): rdma_devices, mooncake, external_addrs.")
    field: str | None = Field(None, description="The field the user fills in, when there is one.")
    text: str = Field(description="English text.")


class Repair(BaseModel):
    id: str = Field(description="Stable id, '<finding id>:<kind>'; the page applies a repair by it.")
    fixes: str = Field(description="The finding id it repairs.")
    finding: Finding | None = Field(None, description="The finding it repairs (id, level, fields, message, fix).")
    kind: str = Field("", description="What kind of repair (the second half of its id).")
    title_id: str = Field(description="Catalogue key of the title (repair.*).")
    params: dict[str, Any] = Field(default_factory=dict, description="str.format parameters of the title.")
    title: str = Field(description="The title in English (rendered from title_id).")
    values: dict[str, Any] = Field(description="Field path → value the user would set (one undoable entry).")
    changes: list[FieldChange] = Field(description="Every field that would change, dependents included.")
    derived: Derived = Field(description="Numbers after the repair (GPUs, engines, DP ...).")
    allocation: dict[str, int] = Field(default_factory=dict, description="The GPU allocation after the repair.")
    requires: list[Requirement] = Field(default_factory=list, description="Still required from your environment.")
    remaining: list[Finding] = Field(description="Errors still present after the repair.")


# A proposal: (kind, title, values).
Proposal = tuple[str, Text, dict[str, Any]]


def _recipe(exp: Experiment) -> Recipe | None:
    try:
        return get_recipe(exp.model.recipe)
    except RecipeError:
        return None


def _engine_size(exp: Experiment) -> int:
    """The recipe's engine size (what the model needs per engine); the experiment's without a recipe."""
    recipe = _recipe(exp)
    return recipe.rollout.engine_gpus if recipe is not None else exp.placement.engine_gpus


def _train_unit(exp: Experiment, tp: int, pp: int, cp: int, ep: int) -> int:
    """The smallest training pool the parallel layout tiles: TP·PP·CP, and lcm with EP·PP for MoE."""
    recipe = _recipe(exp)
    return train_unit(tp, pp, cp, moe=recipe is not None and recipe.kind == "moe", etp=ETP, ep=ep)


def _with_engine(exp: Experiment, e: int, values: dict[str, Any]) -> dict[str, Any]:
    if e != exp.placement.engine_gpus:
        return {"placement.engine_gpus": e, **values}
    return values


def _colocated_nodes(exp: Experiment, at_least: int, multiples: list[int]) -> int | None:
    """Smallest node count ≥ at_least whose shared pool (nodes × GPUs per node) every multiple divides."""
    gpn = exp.placement.gpus_per_node
    if gpn <= 0:
        return None
    for k in range(max(1, math.ceil(at_least / gpn)), MAX_NODES + 1):
        if all(m > 0 and (k * gpn) % m == 0 for m in multiples):
            return k
    return None


# --- proposers: (experiment, derived) → proposals ---------------------------------------------------

def _pd(exp: Experiment, d: Derived) -> list[Proposal]:
    p, pd = exp.placement, exp.serving.pd
    if p.ownership == "external":
        return [("pd_off", text("repair.pd_off"), {"serving.pd.enabled": False})]
    e = _engine_size(exp)
    if e <= 0:
        return []
    out: list[Proposal] = []
    engines = p.rollout_gpus // e
    if engines >= 2:  # split the engines the pool already holds
        prefill = max(1, engines // 2)
        values: dict[str, Any] = {"serving.pd.prefill_engines": prefill, "serving.pd.decode_engines": engines - prefill}
        if p.rollout_gpus % e and p.ownership == "disaggregated":
            values["placement.rollout_gpus"] = engines * e
        out.append(("pd_split", text("repair.pd_split", engines=engines, prefill=prefill, decode=engines - prefill),
                    _with_engine(exp, e, values)))
    pf, dc = max(pd.prefill_engines, 1), max(pd.decode_engines, 1)
    need = (pf + dc) * e
    if p.ownership == "disaggregated" and need != p.rollout_gpus:
        values = {"serving.pd.prefill_engines": pf, "serving.pd.decode_engines": dc, "placement.rollout_gpus": need}
        if p.gpus_per_node and p.train_gpus + need > p.nodes * p.gpus_per_node:
            values["placement.nodes"] = math.ceil((p.train_gpus + need) / p.gpus_per_node)
        out.append(("pd_grow", text("repair.pd_grow", prefill=pf, decode=dc, e=e, gpus=need),
                    _with_engine(exp, e, values)))
    elif p.ownership == "colocated" and need > p.rollout_gpus:
        r = exp.resources
        nodes = _colocated_nodes(exp, need, [e, _train_unit(exp, r.tp, r.pp, r.cp, r.ep)])
        if nodes is not None:
            pool = nodes * p.gpus_per_node
            dc = pool // e - pf
            out.append(("pd_grow_shared", text("repair.pd_grow_shared", prefill=pf, decode=dc, e=e, gpus=pool, nodes=nodes),
                        _with_engine(exp, e, {"placement.nodes": nodes, "serving.pd.prefill_engines": pf,
                                              "serving.pd.decode_engines": dc})))
    return out


def _idle(exp: Experiment, d: Derived) -> list[Proposal]:
    p = exp.placement
    if p.ownership != "disaggregated" or not p.engine_gpus or not d.idle_rollout_gpus or not d.engines:
        return []
    gpus = d.engines * p.engine_gpus
    return [("idle", text("repair.idle", gpus=gpus, engines=d.engines), {"placement.rollout_gpus": gpus})]


def _nodes(exp: Experiment, d: Derived) -> list[Proposal]:
    if d.nodes_needed <= exp.placement.nodes:
        return []
    return [("nodes", text("repair.nodes", nodes=d.nodes_needed), {"placement.nodes": d.nodes_needed})]


def _parallel(exp: Experiment, d: Derived) -> list[Proposal]:
    """Parallelism that does not divide the GPUs: the recipe's layout, or a training pool it tiles."""
    p, r = exp.placement, exp.resources
    out: list[Proposal] = []
    recipe = _recipe(exp)
    if recipe is not None:
        rp = recipe.parallel
        mine = {"resources.tp": r.tp, "resources.pp": r.pp, "resources.cp": r.cp, "resources.ep": r.ep,
                "resources.pp_first_stage_layers": r.pp_first_stage_layers, "resources.pp_last_stage_layers": r.pp_last_stage_layers}
        theirs = {"resources.tp": rp.tp, "resources.pp": rp.pp, "resources.cp": rp.cp, "resources.ep": rp.ep,
                  "resources.pp_first_stage_layers": rp.pp_first_stage_layers, "resources.pp_last_stage_layers": rp.pp_last_stage_layers}
        unit = _train_unit(exp, rp.tp, rp.pp, rp.cp, rp.ep)
        if mine != theirs and p.train_gpus and p.train_gpus % unit == 0:
            out.append(("par_recipe", text("repair.par_recipe", model=recipe.display_name, tp=rp.tp, pp=rp.pp, cp=rp.cp, ep=rp.ep),
                        {k: v for k, v in theirs.items() if mine[k] != v}))
    unit = _train_unit(exp, r.tp, r.pp, r.cp, r.ep)
    if not p.train_gpus or p.train_gpus % unit == 0:
        return out
    if p.ownership == "colocated":
        nodes = _colocated_nodes(exp, max(p.train_gpus, unit), [unit, max(p.engine_gpus, 1)])
        if nodes is not None:
            pool = nodes * p.gpus_per_node
            out.append(("par_pool_shared", text("repair.par_pool_shared", gpus=pool, nodes=nodes, unit=unit),
                        {"placement.nodes": nodes}))
        return out
    train = max(unit, (p.train_gpus // unit) * unit)
    values: dict[str, Any] = {"placement.train_gpus": train}
    if p.gpus_per_node:
        total = train + (p.rollout_gpus if p.ownership == "disaggregated" else 0)
        if total > p.nodes * p.gpus_per_node:
            values["placement.nodes"] = math.ceil(total / p.gpus_per_node)
    out.append(("par_pool", text("repair.par_pool", gpus=train, unit=unit), values))
    return out


def _colocated_async(exp: Experiment, d: Derived) -> list[Proposal]:
    return [("col_split", text("repair.col_split"), {"placement.ownership": "disaggregated"}),
            ("col_sync", text("repair.col_sync"), {"placement.scheduling": "sync"})]


def _async_steps(exp: Experiment, d: Derived) -> list[Proposal]:
    values: dict[str, Any] = {"task.num_steps_per_rollout": 1}
    if not (exp.corrections.tis or exp.corrections.icepop):
        values["corrections.tis"] = True
    if len(values) > 1:
        return [("async_one_step_tis", text("repair.async_one_step_tis"), values)]
    return [("async_one_step", text("repair.one_step"), values)]


def _nearest_layout(repairing: str | None) -> Callable[[Experiment, Derived], list[Proposal]]:
    """The nearest layout (TP, PP, CP, EP, CPU Adam) that the runtime accepts without the refusal
    `repairing` (None: without a new one) and whose training phase fits the memory estimate
    (lab.rules.memory_fit asks the runtime and the estimate; no rule is restated here)."""
    from lab.rules.memory_fit import describe, nearest_fits

    def propose(exp: Experiment, d: Derived) -> list[Proposal]:
        out: list[Proposal] = []
        for fit in nearest_fits(exp, repairing):  # the nearest one: its id (rule:layout) stays stable
            kind = "layout_cpu_adam" if fit.layout.cpu_adam and not exp.resources.cpu_adam else "layout"
            out.append((kind, text(f"repair.{kind}", **describe(fit)), fit.values))
        return out

    return propose


_PROPOSERS: dict[str, Callable[[Experiment, Derived], list[Proposal]]] = {
    "SGL-4": _pd,
    "RES-4": _idle,
    "RES-2": _nodes,
    "PAR-1": _parallel,
    "PAR-2": _parallel,
    "LAB-ASY-STEPS": _async_steps,
    "ASY-1": lambda e, d: [("tis", text("repair.tis"), {"corrections.tis": True})],
    "PRC-5": lambda e, d: [("tis", text("repair.tis"), {"corrections.tis": True})],
    "LAB-HYB-1": lambda e, d: [("state_fp32", text("repair.state_fp32"), {"precision.recurrent_state_dtype": "float32"})],
    "LAB-MEM-1": _nearest_layout(None),
}

# The runtime's refusals (lab.rules.runtime_verdict) that have a mechanical repair, by the refusal's
# code (slime/refusals.py; the rule itself stays in slime/args.py). Repair ids keep the rule's name.
_RUNTIME_PROPOSERS: list[tuple[str, str, Callable[[Experiment, Derived], list[Proposal]]]] = [
    ("args.async_colocate", "COL-1", _colocated_async),
    ("args.gbs_divides", "BAT-3",
     lambda e, d: [("one_step", text("repair.one_step"), {"task.num_steps_per_rollout": 1})]),
    ("megatron.context_parallel", "MEG-CP", _nearest_layout("megatron.context_parallel")),
    ("megatron.dp_whole", "MEG-DP", _nearest_layout("megatron.dp_whole")),
    ("args.tis_icepop", "COR-TIS-ICEPOP",
     lambda e, d: [("keep_icepop", text("repair.keep_icepop"), {"corrections.tis": False}),
                   ("keep_tis", text("repair.keep_tis"), {"corrections.icepop": False})]),
    ("args.sc_ratio", "COR-SC",
     lambda e, d: [("sc_without_tis", text("repair.sc_without_tis"), {"corrections.tis": False})]),
    ("args.over_sampling", "BAT-7",
     lambda e, d: [("over_sampling_2x", text("repair.over_sampling_2x", over=2 * e.task.rollout_batch_size),
                    {"rollout.over_sampling_batch_size": 2 * e.task.rollout_batch_size})]),
    ("args.one_sample_group", "BAT-6",
     lambda e, d: [("eight_samples", text("repair.eight_samples"), {"task.n_samples_per_prompt": 8})]),
]


def _proposer(finding: Finding) -> tuple[str, Callable[[Experiment, Derived], list[Proposal]] | None]:
    if finding.id != "RUNTIME":
        return finding.id, _PROPOSERS.get(finding.id)
    for code, rule, proposer in _RUNTIME_PROPOSERS:
        if finding.params.get("code") == code:
            return rule, proposer
    return finding.id, None


# --- what a repair leaves to the user ---------------------------------------------------------------

def requirements(exp: Experiment) -> list[Requirement]:
    """What the user must still provide from their environment (never proposed by a repair)."""
    p, pd = exp.placement, exp.serving.pd
    out: list[Requirement] = []
    if pd.enabled and p.ownership != "external":
        if not pd.rdma_devices:
            out.append(Requirement(key="rdma_devices", field="serving.pd.rdma_devices",
                                   text="RDMA (InfiniBand) device names of your nodes for Mooncake (see ibv_devices); "
                                        "the lab never invents them."))
        out.append(Requirement(key="mooncake", text="The Mooncake transfer engine installed on every node (KV transfer)."))
    if p.ownership == "external" and not p.external_engine_addrs:
        out.append(Requirement(key="external_addrs", field="placement.external_engine_addrs",
                               text="host:port of each external SGLang engine, from your deployment."))
    return out


ALLOCATION_KEYS = ("nodes", "gpus_per_node", "train_gpus", "rollout_gpus", "engine_gpus")
DERIVED_ALLOCATION_KEYS = ("engines", "prefill_gpus", "decode_gpus", "idle_rollout_gpus", "total_gpus", "declared_gpus", "dp")


def allocation(exp: Experiment, d: Derived) -> dict[str, int]:
    p = exp.placement
    out = {k: getattr(p, k) for k in ALLOCATION_KEYS}
    out.update({k: getattr(d, k) for k in DERIVED_ALLOCATION_KEYS})
    return out


def propose_repairs(exp: Experiment, d: Derived | None = None, findings: list[Finding] | None = None) -> list[Repair]:
    """Previews for the current findings that have a mechanical repair (none is applied).

    A proposal is kept only if it changes something, sets no private machine field and makes the
    finding it targets go away (the same finding, same message, must not remain). `d` and
    `findings`, when given, must be `derive(exp)` and `validate(exp)` (passed on, not recomputed)."""
    d = derive(exp) if d is None else d
    ws = Workspace(b=exp)
    findings = validate(exp) if findings is None else findings
    out: list[Repair] = []
    seen_ids: set[str] = set()
    seen_values: set[str] = set()
    for finding in findings:
        rule, proposer = _proposer(finding)
        if proposer is None:
            continue
        for kind, title, values in proposer(exp, d):
            rid = f"{rule}:{kind}"
            key = repr(sorted(values.items()))
            if rid in seen_ids or key in seen_values or NEVER_PROPOSED & set(values):
                continue
            try:
                after = edit_many(ws, values, title)
            except ChangeError:
                continue
            if not after.undo:  # changes nothing
                continue
            after_d = derive(after.b)
            after_findings = validate(after.b, after_d)
            if any(f.id == finding.id and f.message == finding.message for f in after_findings):
                continue
            seen_ids.add(rid)
            seen_values.add(key)
            out.append(Repair(id=rid, fixes=finding.id, finding=finding, kind=kind, title_id=title.key,
                              params=title.params, title=title.en(),
                              values=values, changes=after.undo[-1].changes, derived=after_d,
                              allocation=allocation(after.b, after_d), requires=requirements(after.b),
                              remaining=[f for f in after_findings if f.level == "error"]))
    return out


def apply_repair(ws: Workspace, repair_id: str) -> Workspace:
    """Apply the repair with this id, recomputed for the workspace's current B, as ONE undoable entry.

    Raises ChangeError when no current repair has this id (the page's preview is stale)."""
    for r in propose_repairs(ws.b):
        if r.id == repair_id:
            return edit_many(ws, r.values, Text(key=r.title_id, params=r.params))
    raise ChangeError("action.id", key="error.repair_stale", params={"id": repr(repair_id)})
