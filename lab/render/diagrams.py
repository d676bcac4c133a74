"""The TP / PP / EP / CP / ZeRO diagrams at the experiment's own sizes, as data the page draws.

Pure. Each diagram is a row of cells, one per GPU (or rank, or stage) of that dimension; a size
above MAX_DRAWN is summarised as its first cells, one "… N more" cell and its last cells, so 256
experts or 64 ranks stay legible. Texts are ids with parameters (`key`, `params`), localised by
the page, so the same data draws in either language.
"""
from __future__ import annotations

from typing import Any

from lab.core.experiment import Experiment
from lab.core.model_spec import ModelSpec

MAX_DRAWN = 8
HEAD, TAIL = 4, 2


def _indices(size: int) -> list[int | None]:
    """Which cells to draw: all of them, or HEAD first, None (the elided run), TAIL last."""
    if size <= MAX_DRAWN:
        return list(range(size))
    return list(range(HEAD)) + [None] + list(range(size - TAIL, size))


def _row(size: int, cell) -> list[dict[str, Any]]:
    out = []
    for i in _indices(size):
        if i is None:
            out.append({"ellipsis": True, "key": "diag_more", "params": {"n": size - HEAD - TAIL}})
        else:
            out.append({"index": i, **cell(i)})
    return out


def _span(lo: int, hi: int) -> str:
    return str(lo) if hi - lo <= 1 else f"{lo}–{hi - 1}"


def _even(total: int, parts: int, i: int) -> tuple[int, int]:
    base, extra = divmod(total, parts)
    lo = i * base + min(i, extra)
    return lo, lo + base + (1 if i < extra else 0)


def _pipeline_bounds(exp: Experiment, layers: int) -> list[tuple[int, int]]:
    r = exp.resources
    first, last = r.pp_first_stage_layers, r.pp_last_stage_layers
    middle = r.pp - (1 if first else 0) - (1 if last else 0)
    rest = max(layers - (first or 0) - (last or 0), 0)
    sizes: list[int] = []
    if first:
        sizes.append(first)
    sizes += [rest // middle + (1 if k < rest % middle else 0) for k in range(middle)] if middle > 0 else []
    if last:
        sizes.append(last)
    sizes = (sizes + [0] * r.pp)[: r.pp]
    bounds, at = [], 0
    for n in sizes:
        bounds.append((at, at + n))
        at += n
    return bounds


def parallel_diagrams(exp: Experiment, spec: ModelSpec | None, dp: int) -> dict[str, Any]:
    r = exp.resources
    hidden = spec.hidden if spec else 0
    layers = spec.layers if spec else 0
    experts = spec.experts if spec else 0
    out: dict[str, Any] = {}

    def tp_cell(i: int) -> dict[str, Any]:
        lo, hi = _even(hidden, r.tp, i) if hidden else (0, 0)
        return {"label": f"GPU {i}", "key": "diag_tp_cell", "params": {"cols": _span(lo, hi), "of": hidden}}
    out["tp"] = {"size": r.tp, "cells": _row(r.tp, tp_cell), "key": "diag_tp_note" if r.tp > 1 else "diag_tp_off",
                 "params": {"n": r.tp}}

    bounds = _pipeline_bounds(exp, layers) if layers else [(0, 0)] * r.pp

    def pp_cell(i: int) -> dict[str, Any]:
        lo, hi = bounds[i]
        return {"label": f"GPU {i}", "key": "diag_pp_cell", "params": {"layers": _span(lo, hi), "n": hi - lo}}
    out["pp"] = {"size": r.pp, "cells": _row(r.pp, pp_cell), "key": "diag_pp_note" if r.pp > 1 else "diag_pp_off",
                 "params": {"n": r.pp, "layers": layers}}

    if experts:
        def ep_cell(i: int) -> dict[str, Any]:
            lo, hi = _even(experts, r.ep, i)
            return {"label": f"GPU {i}", "key": "diag_ep_cell", "params": {"experts": _span(lo, hi), "n": hi - lo}}
        out["ep"] = {"size": r.ep, "cells": _row(r.ep, ep_cell), "key": "diag_ep_note",
                     "params": {"n": r.ep, "experts": experts, "per": experts // max(r.ep, 1)}}
    else:
        out["ep"] = {"size": r.ep, "cells": [], "key": "diag_ep_dense", "params": {}}

    allgather = bool(spec and spec.allgather_cp)

    def cp_cell(i: int) -> dict[str, Any]:
        if allgather:
            return {"label": f"GPU {i}", "key": "diag_cp_allgather_cell", "params": {"chunk": i}}
        return {"label": f"GPU {i}", "key": "diag_cp_zigzag_cell", "params": {"a": i, "b": 2 * r.cp - 1 - i}}
    cp_key = "diag_cp_off" if r.cp == 1 else "diag_cp_allgather_note" if allgather else "diag_cp_zigzag_note"
    out["cp"] = {"size": r.cp, "cells": _row(r.cp, cp_cell), "mode": "allgather" if allgather else "zigzag",
                 "key": cp_key,
                 "params": {"n": r.cp, "chunks": 2 * r.cp, "tokens": r.max_tokens_per_gpu * r.cp}}

    def zero_cell(i: int) -> dict[str, Any]:
        return {"label": f"DP {i}", "key": "diag_zero_cell", "params": {"i": i + 1, "n": dp}}
    size = max(dp, 0)
    zero_key = ("diag_zero_cpu" if r.cpu_adam else "diag_zero_note") + ("_one" if size == 1 else "")
    out["zero"] = {"size": size, "cells": _row(size, zero_cell), "key": zero_key, "params": {"n": size}}
    return out


def loop_diagram(exp: Experiment, train_backend: str, rollout_backend: str) -> dict[str, str]:
    """Which engine samples, what sits between reward and update, which trainer updates and where the
    weights go back: the loop strip's boxes as text ids for this experiment."""
    external = exp.placement.ownership == "external"
    embedded_engine = rollout_backend == "embedded" and not external
    if exp.rollout.queue:
        buffer = "loop_batch_queue"  # straw: producers write groups, the trainer reads them
    elif exp.placement.scheduling == "async":
        buffer = "loop_batch_async"  # train_async.py: the next rollout samples while this one trains
    else:
        buffer = "loop_batch_sync"
    return {"sample": "loop_sample_external" if external else "loop_sample_embedded" if embedded_engine else "loop_sample",
            "batch": buffer,
            "update": "loop_update_embedded" if train_backend == "embedded" else "loop_update",
            "weights": "loop_weights_embedded" if embedded_engine else "loop_weights"}
