"""The nearest training layout that the runtime accepts and the lab's memory estimate fits.

A layout is TP, PP, CP, EP (sequence parallel follows TP: experiment.sh renders it with TP > 1)
and whether Adam runs on the CPU (optimizer offload). Candidates are ranked by how far they move
from the current layout (a doubling or halving of one size is one step; offloading Adam costs more
than a step, since it slows every step) and tried nearest first. A candidate is kept when

- the runtime accepts it: its verdict (lab.rules.runtime_verdict.judge, the runtime's own parser,
  validate() and backend capability checks) refuses nothing but what it refuses of the current
  experiment for other reasons than the layout (a refusal whose flags are not layout flags: ppo
  without a critic, say); the refusal being repaired and every refusal of a layout flag are gone. No runtime rule is restated here: a size the runtime
  refuses (CP without Transformer Engine, say) is simply never proposed, and the day the runtime
  accepts it, it is;
- the lab's own parallel checks (lab.rules.checks) find nothing (heads, KV groups, experts, stages);
- the training phase fits the GPU in lab.rules.memory's estimate.

Used by the repairs of runtime refusals and of the memory warning (lab.rules.repair), and by the memory
warning's advice (lab.rules.checks), so the advice is always something the runtime accepts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from lab.core.experiment import Experiment
from lab.core.memo import Memo
from slime.parallel_sizes import data_parallel_size, model_parallel_size

SIZES = (1, 2, 4, 8, 16, 32, 64)
OFFLOAD_COST = 1.5  # CPU Adam: farther than one doubling, since every optimizer step pays for it
MAX_TRIED = 400  # candidates judged at most (each is a runtime verdict + a memory estimate)


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    cp: int
    ep: int
    cpu_adam: bool

    def values(self, exp: Experiment) -> dict[str, Any]:
        """The field changes that set this layout on `exp` (stage sizes reset when PP changes)."""
        r = exp.resources
        out: dict[str, Any] = {f"resources.{k}": getattr(self, k) for k in ("tp", "pp", "cp", "ep", "cpu_adam")
                               if getattr(r, k) != getattr(self, k)}
        if self.pp != r.pp:
            for k in ("pp_first_stage_layers", "pp_last_stage_layers"):
                if getattr(r, k) is not None:
                    out[f"resources.{k}"] = None
        return out


@dataclass(frozen=True)
class Fit:
    layout: Layout
    values: dict[str, Any]
    peak_gib: float  # the training phase per GPU, in the estimate
    gpu_gib: float


def layout_of(exp: Experiment) -> Layout:
    r = exp.resources
    return Layout(r.tp, r.pp, r.cp, r.ep, r.cpu_adam)


def distance(a: Layout, b: Layout) -> float:
    steps = sum(abs(math.log2(getattr(b, k)) - math.log2(getattr(a, k))) for k in ("tp", "pp", "cp", "ep"))
    if a.cpu_adam != b.cpu_adam:
        steps += OFFLOAD_COST if b.cpu_adam else 1.0
    return steps


def _candidates(exp: Experiment, moe: bool) -> list[Layout]:
    here, n = layout_of(exp), max(exp.placement.train_gpus, 1)
    sizes = [s for s in SIZES if s <= n]
    out = []
    for tp in sizes:
        for pp in sizes:
            # the estimate has no term CP lowers, so a larger CP never makes a layout fit
            for cp in (c for c in sizes if c <= here.cp):
                if not data_parallel_size(n, tp, pp, cp):  # no whole data-parallel size: nothing to estimate
                    continue
                for ep in (sizes if moe else (here.ep,)):
                    for adam in {here.cpu_adam, True}:
                        cand = Layout(tp, pp, cp, ep, adam)
                        if cand != here:
                            out.append(cand)
    # ties: the smaller model-parallel group, then TP before PP (no pipeline bubble)
    return sorted(out, key=lambda c: (distance(here, c), model_parallel_size(c.tp, c.pp, c.cp), c.pp, c.cpu_adam))


def _codes(errors) -> set[str]:
    from slime.refusals import code_of

    return {code_of(e)[0] or str(e) for e in errors}


LAYOUT_FIELDS = frozenset({"resources.tp", "resources.pp", "resources.cp", "resources.ep", "resources.cpu_adam"})


def _about_layout(message: str) -> bool:
    """Whether a refusal names a layout flag (the fields its flags belong to, as the page shows it)."""
    from lab.rules.runtime_verdict import fields_for_message

    return bool(LAYOUT_FIELDS & set(fields_for_message(message, [])))


_FOUND: Memo[tuple[Fit, ...]] = Memo()


def nearest_fits(exp: Experiment, repairing: str | None = None, limit: int = 1) -> list[Fit]:
    """Up to `limit` layouts nearest to `exp`'s that the runtime accepts (no refusal of a layout flag,
    nor `repairing`, nor any it does not make of `exp` already) and whose training phase fits the GPU."""
    key = f"{repairing}|{limit}|{exp.model_dump_json()}"
    return list(_FOUND.get(key, lambda: tuple(_search(exp, repairing, limit))))


def _search(exp: Experiment, repairing: str | None, limit: int) -> list[Fit]:
    from lab.rules.checks import check_parallel
    from lab.rules.derive import derive, recipe_and_spec
    from lab.rules.memory import estimate_memory
    from lab.rules.runtime_verdict import judge

    recipe, spec = recipe_and_spec(exp)
    if recipe is None or spec is None or not exp.placement.train_gpus:
        return []
    allowed = _codes(e for e in judge(exp).errors if not _about_layout(e)) - {repairing}
    out: list[Fit] = []
    for tried, cand in enumerate(_candidates(exp, spec.is_moe)):
        if tried >= MAX_TRIED or len(out) >= limit:
            break
        values = cand.values(exp)
        after = _with(exp, values)
        m = estimate_memory(after)
        if m.training.fits is False:
            continue
        if check_parallel(after, recipe, spec, derive(after)):
            continue
        if not _codes(judge(after).errors) <= allowed:
            continue
        out.append(Fit(cand, values, m.training.total_gib, m.gpu_memory_gib))
    return out


def _with(exp: Experiment, values: dict[str, Any]) -> Experiment:
    changes = {k.split(".", 1)[1]: v for k, v in values.items()}
    return exp.model_copy(update={"resources": exp.resources.model_copy(update=changes)})


def describe(fit: Fit) -> dict[str, Any]:
    """The layout as message parameters (lab/locales: memory.advice.*, repair.layout*)."""
    lay = fit.layout
    return {"tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "ep": lay.ep, "gib": fit.peak_gib, "gpu": fit.gpu_gib}
