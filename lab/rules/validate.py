"""Validation: every incompatibility of an experiment as findings naming fields + fix (ids shared
with the runtime where it checks the same thing, LAB-* for the lab's own;
docs/en/lab.md#findings-and-rule-ids).

The lab's own checks (lab/rules/checks.py) run on the sizes lab/rules/derive.py derives; the
runtime's verdict (lab/rules/runtime_verdict.py) judges the argument list experiment.sh passes.
"""
from __future__ import annotations

from lab.core.experiment import Experiment
from lab.core.findings import Finding
from lab.core.model_spec import ModelSpecError, spec_of
from lab.core.recipes import RecipeError, all_recipes, get_recipe
from lab.rules.checks import CHECKS
from lab.rules.derive import Derived, derive
from lab.rules.memory_check import check_memory


def validate(exp: Experiment, d: Derived | None = None) -> list[Finding]:
    """Every incompatibility of `exp` as findings, errors first. `d`: `derive(exp)` when the caller has it."""
    try:
        recipe = get_recipe(exp.model.recipe)
    except RecipeError as exc:
        return [Finding.of("LAB-MODEL-1", "error", ["model.recipe"], error=str(exc), models=", ".join(all_recipes()))]
    try:
        spec = spec_of(exp)
    except ModelSpecError as exc:
        from lab.rules.runtime_verdict import runtime_text
        from slime.refusals import message_of

        return [Finding.of("LAB-MODEL-2", "error", ["model.recipe"], error=runtime_text(message_of(exc)),
                           spec=recipe.model_spec)]
    order = {"error": 0, "warning": 1, "info": 2}
    d = derive(exp) if d is None else d
    found: list[Finding] = []
    for check in (*CHECKS, check_memory):  # memory last: its advice searches layouts the others accept
        found.extend(check(exp, recipe, spec, d))
    from lab.rules.runtime_verdict import runtime_findings

    found.extend(runtime_findings(exp))  # the runtime's own verdict on the flags experiment.sh passes
    return sorted(found, key=lambda f: order[f.level])
