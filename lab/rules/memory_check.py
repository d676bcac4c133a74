"""The memory check: a training layout that does not fit its GPUs is a warning whose fix is the nearest
layout that fits and that the runtime accepts (lab/rules/memory_fit.py).

Apart from lab/rules/checks.py because the fit search itself asks those checks whether a candidate
layout is valid: one module each way would be a cycle.
"""
from __future__ import annotations

from lab.core.experiment import Experiment
from lab.core.findings import Finding
from lab.core.messages import ref
from lab.core.model_spec import ModelSpec
from lab.core.recipes import Recipe
from lab.rules.checks import gpu_run
from lab.rules.derive import Derived
from lab.rules.memory import estimate_memory
from lab.rules.memory_fit import describe, nearest_fits


def check_memory(exp: Experiment, recipe: Recipe, spec: ModelSpec, d: Derived) -> list[Finding]:
    """The memory panel's training number in red always comes with this finding, which says why."""
    if not gpu_run(recipe) or exp.placement.gpus_per_node == 0:
        return []
    m = estimate_memory(exp)
    if m.training.fits is False:
        return [Finding.of("LAB-MEM-1", "warning", ["resources.cpu_adam", "placement.train_gpus", "resources.tp", "resources.max_tokens_per_gpu"],
                           total=m.training.total_gib, gpu=m.gpu_memory_gib, advice=_memory_advice(exp))]
    return []


def _memory_advice(exp: Experiment) -> dict:
    """The memory warning's fix: the nearest layout the runtime accepts that fits (lab.rules.memory_fit,
    the same search as the warning's repair), never a size the runtime refuses."""
    fits = nearest_fits(exp)
    if not fits:
        return ref("memory.advice.none", n=exp.placement.train_gpus)
    kind = "layout_cpu_adam" if fits[0].layout.cpu_adam and not exp.resources.cpu_adam else "layout"
    return ref(f"memory.advice.{kind}", **describe(fits[0]))
