"""Repair previews: for some findings, a set of field values that fixes them, shown before applying.

A `Repair` lists the values the user would set, the resulting field changes (dependent ones
included, each with its reason), the GPU allocation after it and the errors that would remain.
Nothing is applied here; applying one is `workspace.edit_many(ws, repair.values, repair.title)`:
one undoable entry, so Undo restores all of its fields together. RDMA devices and external engine
addresses are never proposed: they must come from the user's environment.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from pydantic import BaseModel, Field

from lab.derive import Derived, derive
from lab.experiment import Experiment
from lab.rules import ChangeError, FieldChange, Finding, validate
from lab.workspace import Workspace, edit_many


class Repair(BaseModel):
    fixes: str = Field(description="The finding id it repairs.")
    title: str
    values: dict[str, Any] = Field(description="Field path → value the user would set (one undoable entry).")
    changes: list[FieldChange] = Field(description="Every field that would change, dependents included.")
    derived: Derived = Field(description="Numbers after the repair (GPUs, engines, DP ...).")
    remaining: list[Finding] = Field(description="Errors still present after the repair.")


def _pd(exp: Experiment, d: Derived) -> list[tuple[str, dict[str, Any]]]:
    p, pd = exp.placement, exp.serving.pd
    e = max(p.engine_gpus, 1)
    out = []
    engines = p.rollout_gpus // e
    if engines >= 2:
        prefill = max(1, engines // 2)
        out.append((f"Split the {engines} engines of the rollout pool: {prefill} prefill + {engines - prefill} decode",
                    {"serving.pd.prefill_engines": prefill, "serving.pd.decode_engines": engines - prefill}))
    pf, dc = max(pd.prefill_engines, 1), max(pd.decode_engines, 1)
    need = (pf + dc) * e
    if p.ownership == "disaggregated" and need != p.rollout_gpus:
        values: dict[str, Any] = {"serving.pd.prefill_engines": pf, "serving.pd.decode_engines": dc, "placement.rollout_gpus": need}
        if p.gpus_per_node and p.train_gpus + need > p.nodes * p.gpus_per_node:
            values["placement.nodes"] = math.ceil((p.train_gpus + need) / p.gpus_per_node)
        out.append((f"Size the rollout pool for {pf} prefill + {dc} decode engines of {e} GPUs ({need} GPUs)", values))
    return out


def _idle(exp: Experiment, d: Derived) -> list[tuple[str, dict[str, Any]]]:
    p = exp.placement
    if p.ownership != "disaggregated" or not p.engine_gpus or not d.idle_rollout_gpus or not d.engines:
        return []
    return [(f"Use {d.engines * p.engine_gpus} rollout GPUs ({d.engines} whole engines)",
             {"placement.rollout_gpus": d.engines * p.engine_gpus})]


def _nodes(exp: Experiment, d: Derived) -> list[tuple[str, dict[str, Any]]]:
    return [(f"Declare {d.nodes_needed} nodes", {"placement.nodes": d.nodes_needed})] if d.nodes_needed > exp.placement.nodes else []


_PROPOSERS: dict[str, Callable[[Experiment, Derived], list[tuple[str, dict[str, Any]]]]] = {
    "SGL-4": _pd,
    "RES-4": _idle,
    "RES-2": _nodes,
    "COL-1": lambda e, d: [("Separate training and rollout pools", {"placement.ownership": "disaggregated"})],
    "BAT-3": lambda e, d: [("One optimizer step per rollout", {"task.num_steps_per_rollout": 1})],
    "BAT-6": lambda e, d: [("Eight samples per prompt", {"task.n_samples_per_prompt": 8})],
    "EVL-2": lambda e, d: [("Turn in-run evaluation off (schedule a separate eval job)", {"evaluation.enabled": False})],
    "LAB-HYB-1": lambda e, d: [("Keep the recurrent state in float32", {"precision.recurrent_state_dtype": "float32"})],
    "PRC-5": lambda e, d: [("Turn on TIS", {"corrections.tis": True})],
    "ASY-1": lambda e, d: [("Turn on TIS", {"corrections.tis": True})],
}


def propose_repairs(exp: Experiment) -> list[Repair]:
    """Previews for the current findings that have a mechanical repair (none is applied)."""
    d = derive(exp)
    ws = Workspace(b=exp)
    out: list[Repair] = []
    seen: set[str] = set()
    for finding in validate(exp):
        proposer = _PROPOSERS.get(finding.id)
        if proposer is None or finding.id in seen:
            continue
        seen.add(finding.id)
        for title, values in proposer(exp, d):
            try:
                after = edit_many(ws, values, title)
            except ChangeError:
                continue
            changes = after.undo[-1].changes if after.undo else []
            out.append(Repair(fixes=finding.id, title=title, values=values, changes=changes, derived=derive(after.b),
                              remaining=[f for f in validate(after.b) if f.level == "error"]))
    return out
