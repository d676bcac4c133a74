"""What the page draws for a workspace: the answer of POST /api/workspace (lab/web/api_workspace.py),
computed entirely by the rules, renderers and estimators, so the page holds no rule:

    {"workspace", "findings", "a_findings", "derived", "memory", "layout", "commands",
     "files", "ab_diff", "share_link", "last_change", "history_labels", "repairs", "provenance",
     "image", "folded", "diagrams", "placement_plan", "placement_lines"}

and, as the answer goes out, `tags`, `same` and `patch` (lab/web/answer_parts.py: the parts the page
already holds are left out).

Texts are keys with parameters until this edge: `localized` renders findings, change reasons,
repair titles, history labels and memory names in the request's language (lab/core/messages.py).

`repairs`: previews from `lab.rules.repair.propose_repairs(B)` (nothing applied). `provenance`: the
same record `experiment.json` carries (lab/core/provenance.py), regenerated for every answer.
`image`: the selected installation image's hardware context (GPU family, memory, FP8/INT4) from
images.yaml. `layout`: the GPU cells (lab/render/gpu_layout.py).
"""
from __future__ import annotations

import json
import os
from typing import Any

import pydantic_core
from pydantic import BaseModel

from lab.core import history_tail, share, workspace
from lab.core.experiment import Experiment
from lab.core.memo import Memo
from lab.core.workspace import Workspace
from lab.render import render_all
from lab.render.env import TEMPLATES_DIR
from lab.render.gpu_layout import gpu_layout
from lab.rules.derive import derive
from lab.rules.validate import validate


def dump(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, (list, tuple)):
        return [dump(o) for o in obj]
    if isinstance(obj, dict):
        return {k: dump(v) for k, v in obj.items()}
    return obj


def _memory(exp: Experiment) -> Any:
    from lab.rules.memory import estimate_memory

    return dump(estimate_memory(exp))


def _files(exp: Experiment, findings: list[Any], derived: Any,
           prov: dict[str, Any] | None) -> tuple[dict[str, str], str | None]:
    """The generated files, or ({}, why) when rendering fails: the page keeps working and says so
    in the export area instead of losing the user's state."""
    try:
        return dict(render_all(exp, findings, derived, prov)), None
    except Exception as exc:  # noqa: BLE001 - reported to the user, never swallowed silently
        return {}, f"{type(exc).__name__}: {exc}"


def _fragment(link: str) -> str:
    """`#s=TOKEN` of a share link: the page prefixes its own origin, so a link opens where it was made."""
    return "#" + link.split("#", 1)[1]


def _ab_diff(ws: Workspace) -> list[Any]:
    if ws.a is None:
        return []
    return dump(workspace.ab_diff(ws))


def _commands(exp: Experiment, d: Any) -> dict[str, Any]:
    """The tutorial's run commands with this experiment's numbers."""
    p = exp.placement
    per_node = d.ray_gpus_per_node
    nodes = d.ray_nodes
    head = (f"ray start --head --node-ip-address HEAD_IP --num-gpus {per_node} \\\n"
            f"  --dashboard-host 0.0.0.0 --dashboard-port 8265")
    worker = f"ray start --address HEAD_IP:6379 --num-gpus {per_node}"
    return {
        "head": head,
        "worker": worker,
        "workers": nodes - 1,
        "nodes": nodes,
        "ray_gpus": d.total_gpus,
        "external": p.ownership == "external",
        "prepare": "bash experiment.sh prepare",
        "convert": "bash experiment.sh convert",
        "check": "bash experiment.sh check",
        "train": "bash experiment.sh train",
    }


def view(ws: Workspace, last_change: Any = None, before: Workspace | None = None) -> dict[str, Any]:
    return answer_view(ws, history_tail.tops(ws), last_change, before)[0]


def answer_view(ws: Workspace, tops: dict[str, Any], last_change: Any = None,
          before: Workspace | None = None) -> tuple[dict[str, Any], dict[str, tuple[Any, bytes]]]:
    """Everything the page draws for this workspace (English texts; `localized` translates), and
    the encodings of its remembered parts (AnswerResponse). `tops`: history_tail.tops(ws).
    `before`: the workspace the action started from, when the page sent only the tops of its
    history (lab/core/history_tail.py); the answer then carries B, A and how each stack changed,
    instead of the whole history."""
    exp = ws.b
    if before is None:
        ws_json = workspace.workspace_json(ws)
        extra: dict[str, Any] = {}
    else:
        ws_json = ws.model_dump(mode="json", include={"b", "a"})
        extra = {"history": history_tail.changes(before, ws)}
    workspace.remember_sent(ws.b, ws_json["b"])  # the page sends them back with its next action
    if ws.a is not None:
        workspace.remember_sent(ws.a, ws_json["a"])
    prov = _provenance(exp)
    shown = _experiment_view(exp, prov)
    share_link_ab = _fragment(share.encode_ab_link(ws.a, exp)) if ws.a is not None else None
    answer = {
        "workspace": ws_json,
        "findings": shown["findings"],
        "a_findings": _experiment_findings(ws.a, _provenance(ws.a)) if ws.a is not None else [],
        "derived": shown["derived"],
        "memory": shown["memory"],
        "layout": shown["layout"],
        "placement_plan": shown["placement_plan"],
        "placement_lines": shown["placement_lines"],
        "commands": shown["commands"],
        "files": shown["files"],
        "render_error": shown["render_error"],
        "ab_diff": _ab_diff(ws),
        "share_link": shown["share_link"],
        "share_link_ab": share_link_ab,
        "recipe": shown["recipe"],
        "last_change": last_change,
        "history_labels": _history_labels(tops, "en"),
        "repairs": shown["repairs"],
        "provenance": prov,
        "image": shown["image"],
        "folded": shown["folded"],
        "diagrams": shown["diagrams"],
        **extra,
    }
    return answer, shown[ENCODED]


# What one experiment shows depends on the experiment and on the sources it is rendered from (the
# recipe, the model spec, the checkout's state: all named in its provenance record, with hashes)
# and the templates. The page sends the same experiments again and again (every request carries
# the workspace; undo, redo and toggles come back to earlier states), so the last few are kept.
# Bounded: the server's memory stays flat however many experiments it sees. The answers are JSON
# values shared between requests: nothing downstream may modify them (`localized` copies).
_SHOWN: Memo[dict[str, Any]] = Memo(128)


_FINDINGS: Memo[list[Any]] = Memo(64)


def _sources_key(prov: dict[str, Any] | None) -> str:
    templates = sorted((e.name, e.stat().st_mtime_ns) for e in os.scandir(TEMPLATES_DIR))
    return _prov_text(prov) + json.dumps(templates)


# prov's canonical JSON, kept beside the record it was made from: provenance() answers the same
# (shared, unmodified) record while its sources are unchanged, so it is encoded once, not per answer.
# The record itself is held, so its id is not reused while the entry is here.
_PROV_TEXTS: Memo[tuple[Any, str]] = Memo(64)


def _prov_text(prov: dict[str, Any] | None) -> str:
    held, text = _PROV_TEXTS.get(id(prov), lambda: (prov, json.dumps(prov, sort_keys=True)))
    if held is not prov:  # cannot happen while the memo holds `held` (its id stays taken); kept as a guard
        text = json.dumps(prov, sort_keys=True)
    return text


def _experiment_view(exp: Experiment, prov: dict[str, Any] | None) -> dict[str, Any]:
    return _SHOWN.get((exp.model_dump_json(), _sources_key(prov)), lambda: _encoded(_compute_experiment_view(exp, prov)))


def _encoded(shown: dict[str, Any]) -> dict[str, Any]:
    """`shown` with each part's JSON encoding, made once for the memory (`ENCODED`): an answer from
    memory splices these bytes (AnswerResponse) instead of encoding ~40 KB of files again."""
    return {**shown, ENCODED: {k: (v, to_json(v)) for k, v in shown.items()}}


ENCODED = "__encoded__"  # the key of a shown view's encodings (never a part of the answer)


def to_json(value: Any) -> bytes:
    return pydantic_core.to_json(value, inf_nan_mode="null")


def _experiment_findings(exp: Experiment, prov: dict[str, Any] | None) -> list[Any]:
    """`validate(exp)` as JSON (A's findings: the same A comes with every request)."""
    return _FINDINGS.get((exp.model_dump_json(), _sources_key(prov)), lambda: dump(validate(exp)))


def _compute_experiment_view(exp: Experiment, prov: dict[str, Any] | None) -> dict[str, Any]:
    """The parts of the answer that depend on B alone, each computed once: validate and derive feed
    the files, the repairs, the folds and the diagrams instead of being run again by each."""
    derived = derive(exp)
    found = validate(exp, derived)
    findings = dump(found)
    files, render_error = _files(exp, found, derived, prov)
    from lab.rules.runtime_verdict import placement_lines

    plan = _placement_plan(exp)
    recipe = _recipe_info(exp)
    return {
        "findings": findings,
        "derived": dump(derived),
        "memory": _memory(exp),
        "layout": gpu_layout(exp, plan),
        "placement_plan": plan,
        "placement_lines": placement_lines(plan),
        "commands": _commands(exp, derived),
        "files": files,
        "render_error": render_error,
        "share_link": _fragment(share.encode_link(exp)),
        "recipe": recipe,
        "repairs": _repairs(exp, derived, found),
        "image": _image_info(exp.install.image),
        "folded": _folded(exp, findings, recipe),
        "diagrams": _diagrams(exp, derived),
    }


def _history_labels(tops: dict[str, Any], lang: str) -> dict[str, str | None]:
    """The labels of the entries Undo and Redo would take (`tops`: each stack's top entry as JSON), in `lang`."""
    from lab.core.messages import entry_label

    return {side: entry_label(tops[side], lang) if tops[side] else None for side in ("undo", "redo")}


def _diagrams(exp: Experiment, derived: Any) -> dict[str, Any]:
    """TP / PP / EP / CP / ZeRO at this experiment's sizes, and the loop strip's boxes (lab/render/diagrams.py)."""
    from lab.render.diagrams import loop_diagram, parallel_diagrams
    from lab.rules.derive import recipe_and_spec

    recipe, spec = recipe_and_spec(exp)
    out = parallel_diagrams(exp, spec, derived.dp)
    if recipe is not None:
        out["loop"] = loop_diagram(exp, recipe.backends.train, recipe.backends.rollout)
    return out


def _folded(exp: Experiment, findings: list[Any], info: dict[str, Any] | None) -> list[str]:
    """Controls that cannot apply to these choices (lab/rules/applicability.py); the page folds them."""
    from lab.rules.applicability import folded_fields

    named = {f for finding in findings for f in finding.get("fields", [])}
    return folded_fields(exp, info["kind"] if info else None, named)


def _placement_plan(exp: Experiment) -> list[Any]:
    """The runtime's Ray placement plan (slime.ray.placement.placement_plan), as `check` prints it."""
    from lab.core.recipes import RecipeError
    from lab.rules.runtime_verdict import placement

    try:
        return placement(exp)
    except RecipeError:  # an unknown recipe has no plan; its finding says why
        return []


def _repairs(exp: Experiment, derived: Any, findings: list[Any]) -> list[Any]:
    from lab.rules.repair import propose_repairs

    return dump(propose_repairs(exp, derived, findings))


def _provenance(exp: Experiment) -> dict[str, Any] | None:
    """The record experiment.json carries (cached git state, hashes of the files as they are now)."""
    from lab.core.provenance import known_images, provenance
    from lab.core.recipes import RecipeError, get_recipe

    try:
        return provenance(get_recipe(exp.model.recipe), exp.install.image)
    except RecipeError:
        return {"checkout": None, "sources": {}, "image": None, "known_images": known_images()}


def _image_info(tag: str) -> dict[str, Any]:
    """Hardware context of the selected image (build facts; no certification of a model or memory fit)."""
    from lab.core.images import get_image

    image = get_image(tag)
    if image is None:
        return {"tag": tag, "known": False}
    return {"known": True, **image.model_dump(mode="json")}


def _recipe_info(exp: Experiment) -> dict[str, Any] | None:
    from lab.core.recipes import RecipeError, get_recipe

    try:
        r = get_recipe(exp.model.recipe)
    except RecipeError:
        return None
    return {"name": r.name, "display_name": r.display_name, "kind": r.kind, "summary": r.summary, "notes": list(r.notes)}


def localized(v: dict[str, Any], lang: str, tops: dict[str, Any]) -> dict[str, Any]:
    """The page's texts in `lang` (lab/core/messages.py); the workspace and the downloadable files stay English.
    `tops`: the top entries of the answer's history stacks (lab/history_tail.tops), for the buttons' labels."""
    if lang == "en":
        return v
    from lab.core import messages as M

    return {
        **v,
        "findings": M.localize_findings(v["findings"], lang),
        "a_findings": M.localize_findings(v["a_findings"], lang),
        "repairs": [M.localize_repair(r, lang) for r in v["repairs"]],
        "last_change": M.localize_entry(v["last_change"], lang),
        "history_labels": _history_labels(tops, lang),
        "memory": M.localize_memory(v["memory"], lang),
        "recipe": _recipe_texts(v["recipe"], lang),
    }


def _recipe_texts(info: dict[str, Any] | None, lang: str) -> dict[str, Any] | None:
    """The recipe's summary and notes in `lang` (the recipe file carries its translations)."""
    from lab.core.recipes import RecipeError, get_recipe

    if info is None:
        return None
    try:
        summary, notes = get_recipe(info["name"]).texts(lang)
    except RecipeError:
        return info
    return {**info, "summary": summary, "notes": notes}
