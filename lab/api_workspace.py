"""POST /api/workspace: one user action in, everything the page draws out.

The page keeps the serialized Workspace (choices, undo/redo history, saved A) in localStorage and
sends it with each action; the server holds no session. The response is computed entirely by the
Python rules, renderers and estimators, so the page holds no rule:

    {"workspace", "findings", "a_findings", "derived", "memory", "layout", "commands",
     "files", "ab_diff", "share_link", "last_change", "history_labels", "repairs", "provenance",
     "image", "folded", "diagrams", "placement_plan", "placement_lines"}

An `import_script` answer adds `import_report`: every difference between the script's train command
and the rendered one, [{kind, flag, line, script, rendered, why}] in the request's language.

With `history` (the full lengths of the page's stacks) the request's workspace carries only the
tops of its undo and redo stacks, and the answer's workspace only B and A, plus `history`: how
each stack changed (lab/history_tail.py). The page sends this form; without `history` the whole
workspace goes both ways.

Texts are keys with parameters until this edge: `localized` renders findings, change reasons,
repair titles, history labels and memory names in the request's language (lab/messages.py).

`repairs`: previews from `lab.repair.propose_repairs(B)` (nothing applied); the action
`{"type": "apply_repair", "id": ...}` applies one as ONE undoable entry. `provenance`: the same
record `experiment.json` carries (lab/provenance.py), regenerated for every answer. `image`: the
selected installation image's hardware context (GPU family, memory, FP8/INT4) from images.yaml.

Load JSON REPLACES B (one undoable entry): the file's fields win; every field the file does not
name goes back to the default of the file's recipe (B's recipe when the file names none), except
the user's private fields (paths, addresses, RDMA devices, hooks), which are kept unless the file
has them. A file that cannot be loaded is a 422 naming what is wrong; B and history are untouched.

Bad input (an unknown field, a value the model refuses, a broken share link or JSON file) is a
4xx whose `detail[0].loc` ends with the field path and whose `msg` says what is wrong; the page
then keeps the state it had.

GET /api/grpo-example: the walkthrough's worked example, computed by the runtime's own
`slime.data.batch_builder.normalize_group_rewards`.
"""
from __future__ import annotations

import json
import math
import os
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

import pydantic_core
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from lab import history_tail, rules, share, workspace
from lab.body import read_json
from lab.experiment import Experiment
from lab.history_tail import HistoryLengths
from lab.memo import Memo
from lab.messages import text as msg
from lab.rules import ChangeError
from lab.workspace import Workspace

router = APIRouter()

MAX_DRAWN_NODES = 64  # beyond this the layout says "… and N more nodes" instead of drawing them
MAX_DRAWN_ENGINES = 64  # likewise for the boxes of external engines

# The tutorial's initial experiment, adopted by "Use this GRPO starting point" as one change.
GRPO_STARTING_POINT: dict[str, Any] = {
    "task.kind": "math",
    "task.input_key": "prompt",
    "task.label_key": "label",
    "task.apply_chat_template": True,
    "task.rm_type": "deepscaler",
    "task.advantage_estimator": "grpo",
    "task.n_samples_per_prompt": 8,
    "task.num_rollout": 3,
}
GRPO_EXAMPLE_REWARDS = [1, 1, 1, 1, 0, 0, 0, 0]

ActionType = Literal[
    "view", "edit", "edit_many", "undo", "redo", "reset", "open_share",
    "save_a", "clear_a", "restore_a", "load_json", "import_script", "adopt_grpo", "apply_repair",
]


class Action(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: ActionType
    path: str | None = Field(None, description="edit: the field path, e.g. placement.ownership.")
    value: Any = Field(None, description="edit: the new value.")
    values: dict[str, Any] | None = Field(None, description="edit_many: {field path: value}, one undoable change.")
    label: str | None = Field(None, description="edit_many: the history label.")
    link: str | None = Field(None, description="open_share: the share link, its #s= fragment, or the bare token.")
    data: Any = Field(None, description="load_json: an experiment.json export or a choices object.")
    text: str | None = Field(None, description="load_json / import_script: the file's text, as read by the page.")
    sources: dict[str, str] | None = Field(
        None, description="import_script: the model specs chosen with the script, by file name, for the files it sources.")
    id: str | None = Field(None, description="apply_repair: the repair's id from `repairs`.")


class WorkspaceRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    workspace: Workspace | None = Field(None, description="The page's workspace; null starts a fresh one.")
    history: HistoryLengths | None = Field(None, description="When given, workspace.undo / workspace.redo are the "
                                           "tops of the page's stacks and these are their full lengths; the answer "
                                           "then says how each stack changed (lab/history_tail.py).")
    action: Action
    lang: Literal["en", "zh"] = Field("en", description="Language of the findings, repairs, change reasons and memory "
                                                     "texts in the answer (the workspace and the files stay English).")


def _error(status: int, loc: list[Any], msg: str, key: str | None = None,
           params: dict[str, Any] | None = None) -> JSONResponse:
    detail: dict[str, Any] = {"loc": loc, "msg": msg}
    if key:
        detail.update(key=key, params=params or {}, type=key)
    return JSONResponse(status_code=status, content={"detail": [detail]})


def _error_text(exc: ChangeError, lang: str) -> str:
    """The error in `lang`: its catalogue text when it has a key, its English message otherwise."""
    if not exc.key:
        return exc.message
    from lab.messages import localize_text

    return localize_text(exc.key, exc.params, lang)


_HISTORY_ACTIONS = {
    "undo": workspace.undo, "redo": workspace.redo, "reset": workspace.reset,
    "save_a": workspace.save_a, "clear_a": workspace.clear_a, "restore_a": workspace.restore_a,
}


def _apply(ws: Workspace, action: Action) -> Workspace:
    t = action.type
    if t == "view":
        return ws
    if t == "edit":
        if not action.path:
            raise ChangeError("action.path", key="error.action.no_path")
        return workspace.edit(ws, action.path, action.value)
    if t == "edit_many":
        return workspace.edit_many(ws, action.values or {}, action.label or msg("label.edit"))
    if t == "adopt_grpo":
        return workspace.edit_many(ws, dict(GRPO_STARTING_POINT), msg("label.grpo"))
    if t in _HISTORY_ACTIONS:
        return _HISTORY_ACTIONS[t](ws)
    if t == "open_share":
        if not action.link:
            raise ChangeError("action.link", key="error.action.no_link")
        try:
            return share.open_share_link(ws, action.link)
        except share.ShareError as exc:  # truncated, edited or foreign: say so, keep the state
            raise ChangeError("action.link", str(exc), exc.key, exc.params) from exc
    if t == "load_json":
        from lab.load_json import LoadError, parse_document

        text = action.text if action.text is not None else json.dumps(action.data)
        try:
            loaded = parse_document(text)
        except LoadError as exc:
            raise ChangeError(exc.field or "action.text", str(exc), exc.key, exc.params) from exc
        return workspace.replace_b(ws, loaded.choices, msg("label.load_json"))
    if t == "import_script":
        from lab.import_script import ScriptImportError, import_script

        try:
            imported = import_script(action.text or "", sources=action.sources)
        except ScriptImportError as exc:  # names the line; the workspace stays as it was
            raise ChangeError("action.text", str(exc), exc.key, exc.params) from exc
        _IMPORT_REPORT.set(imported.report)
        replaced = workspace.replace_b(ws, imported.b.model_dump(mode="json"), msg("label.import_script"))
        return replaced.model_copy(update={"a": imported.a})  # B against the closest recipe as A
    if t == "apply_repair":
        from lab.repair import apply_repair

        if not action.id:
            raise ChangeError("action.id", key="error.action.no_repair_id")
        return apply_repair(ws, action.id)
    raise ChangeError("action.type", key="error.action.unknown", params={"type": repr(t)})  # pragma: no cover - Literal guards it


# --- what the page draws ------------------------------------------------------------------------

def _dump(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, (list, tuple)):
        return [_dump(o) for o in obj]
    if isinstance(obj, dict):
        return {k: _dump(v) for k, v in obj.items()}
    return obj


def _memory(exp: Experiment) -> Any:
    from lab.memory import estimate_memory

    return _dump(estimate_memory(exp))


def _files(exp: Experiment, findings: list[Any], derived: Any,
           prov: dict[str, Any] | None) -> tuple[dict[str, str], str | None]:
    """The generated files, or ({}, why) when rendering fails: the page keeps working and says so
    in the export area instead of losing the user's state."""
    from lab.render import render_all

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
    return _dump(workspace.ab_diff(ws))


def _layout(exp: Experiment, plan: list[Any]) -> dict[str, Any]:
    """GPU cells by node: which pool owns each GPU and which engine it serves, drawn from the
    runtime's Ray placement plan (the plan `experiment.sh check` prints), so the diagram and the
    plan are one. Only the first MAX_DRAWN_NODES nodes and MAX_DRAWN_ENGINES external engines are
    built, so drawing costs what is drawn, not the cluster's size."""
    p = exp.placement
    gpn = p.gpus_per_node
    if gpn <= 0:
        return {"cpu_only": True, "gpus_per_node": 0, "nodes": [], "external": [], "hidden_nodes": 0,
                "hidden_engines": 0}
    used: dict[tuple[int, int], list[Any]] = {}  # (node, gpu) -> [role, engine index or null]
    n_external = 0
    last = -1
    for slot in plan:
        if slot["role"] == "external":
            n_external += 1
        elif slot["role"] == "trainer" and slot["node"] is not None:
            last = max(last, slot["node"])
            if slot["node"] < MAX_DRAWN_NODES:
                for g in slot["gpus"]:
                    used[(slot["node"], g)] = ["train", None]
        elif slot["role"] in ("engine", "prefill", "decode") and slot["node"] is not None:
            span = slot["nodes"] or [slot["node"]]
            last = max(last, span[-1])
            left = max(p.engine_gpus, 1)
            for node in span:
                for g in (slot["gpus"] if node == span[0] else range(gpn)):
                    if left <= 0:
                        break
                    left -= 1
                    if node >= MAX_DRAWN_NODES:
                        continue
                    was = used.get((node, g))
                    used[(node, g)] = ["shared" if was and was[0] == "train" else "rollout", slot["index"]]
    count = max(p.nodes, last + 1)
    drawn = min(count, MAX_DRAWN_NODES)
    external = [max(p.engine_gpus, 1)] * min(n_external, MAX_DRAWN_ENGINES)
    return {
        "cpu_only": False,
        "gpus_per_node": gpn,
        "nodes": [[used.get((n, g), ["idle", None]) for g in range(gpn)] for n in range(drawn)],
        "hidden_nodes": count - drawn,
        "external": external,
        "hidden_engines": n_external - len(external),
        "ownership": p.ownership,
    }


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
    return _view(ws, history_tail.tops(ws), last_change, before)[0]


def _view(ws: Workspace, tops: dict[str, Any], last_change: Any = None,
          before: Workspace | None = None) -> tuple[dict[str, Any], dict[str, tuple[Any, bytes]]]:
    """Everything the page draws for this workspace (English texts; `localized` translates), and
    the encodings of its remembered parts (AnswerResponse). `tops`: history_tail.tops(ws).
    `before`: the workspace the action started from, when the page sent only the tops of its
    history (lab/history_tail.py); the answer then carries B, A and how each stack changed,
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
_TEMPLATES = Path(__file__).resolve().parent / "render" / "templates"


def _sources_key(prov: dict[str, Any] | None) -> str:
    templates = sorted((e.name, e.stat().st_mtime_ns) for e in os.scandir(_TEMPLATES))
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
    return {**shown, ENCODED: {k: (v, _to_json(v)) for k, v in shown.items()}}


ENCODED = "__encoded__"  # the key of a shown view's encodings (never a part of the answer)


def _to_json(value: Any) -> bytes:
    return pydantic_core.to_json(value, inf_nan_mode="null")


def _experiment_findings(exp: Experiment, prov: dict[str, Any] | None) -> list[Any]:
    """`rules.validate(exp)` as JSON (A's findings: the same A comes with every request)."""
    return _FINDINGS.get((exp.model_dump_json(), _sources_key(prov)), lambda: _dump(rules.validate(exp)))


def _compute_experiment_view(exp: Experiment, prov: dict[str, Any] | None) -> dict[str, Any]:
    """The parts of the answer that depend on B alone, each computed once: validate and derive feed
    the files, the repairs, the folds and the diagrams instead of being run again by each."""
    derived = rules.derive(exp)
    found = rules.validate(exp, derived)
    findings = _dump(found)
    files, render_error = _files(exp, found, derived, prov)
    from lab.runtime_verdict import placement_lines

    plan = _placement_plan(exp)
    recipe = _recipe_info(exp)
    return {
        "findings": findings,
        "derived": _dump(derived),
        "memory": _memory(exp),
        "layout": _layout(exp, plan),
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
    from lab.messages import entry_label

    return {side: entry_label(tops[side], lang) if tops[side] else None for side in ("undo", "redo")}


def _diagrams(exp: Experiment, derived: Any) -> dict[str, Any]:
    """TP / PP / EP / CP / ZeRO at this experiment's sizes, and the loop strip's boxes (lab/diagrams.py)."""
    from lab.derive import recipe_and_spec
    from lab.diagrams import loop_diagram, parallel_diagrams

    recipe, spec = recipe_and_spec(exp)
    out = parallel_diagrams(exp, spec, derived.dp)
    if recipe is not None:
        out["loop"] = loop_diagram(exp, recipe.backends.train, recipe.backends.rollout)
    return out


def _folded(exp: Experiment, findings: list[Any], info: dict[str, Any] | None) -> list[str]:
    """Controls that cannot apply to these choices (lab/applicability.py); the page folds them."""
    from lab.applicability import folded_fields

    named = {f for finding in findings for f in finding.get("fields", [])}
    return folded_fields(exp, info["kind"] if info else None, named)


def _placement_plan(exp: Experiment) -> list[Any]:
    """The runtime's Ray placement plan (slime.ray.placement.placement_plan), as `check` prints it."""
    from lab.recipes import RecipeError
    from lab.runtime_verdict import placement

    try:
        return placement(exp)
    except RecipeError:  # an unknown recipe has no plan; its finding says why
        return []


def _repairs(exp: Experiment, derived: Any, findings: list[Any]) -> list[Any]:
    from lab.repair import propose_repairs

    return _dump(propose_repairs(exp, derived, findings))


def _provenance(exp: Experiment) -> dict[str, Any] | None:
    """The record experiment.json carries (cached git state, hashes of the files as they are now)."""
    from lab.provenance import known_images, provenance
    from lab.recipes import RecipeError, get_recipe

    try:
        return provenance(get_recipe(exp.model.recipe), exp.install.image)
    except RecipeError:
        return {"checkout": None, "sources": {}, "image": None, "known_images": known_images()}


def _image_info(tag: str) -> dict[str, Any]:
    """Hardware context of the selected image (build facts; no certification of a model or memory fit)."""
    from lab.images import get_image

    image = get_image(tag)
    if image is None:
        return {"tag": tag, "known": False}
    return {"known": True, **image.model_dump(mode="json")}


def _recipe_info(exp: Experiment) -> dict[str, Any] | None:
    from lab.recipes import RecipeError, get_recipe

    try:
        r = get_recipe(exp.model.recipe)
    except RecipeError:
        return None
    return {"name": r.name, "display_name": r.display_name, "kind": r.kind, "summary": r.summary, "notes": list(r.notes)}


@router.post("/api/workspace")
async def post_workspace(request: Request) -> Any:
    """Answered on the event loop, one request after another. An answer is a few milliseconds of
    pure Python under the GIL: a worker thread per request only made 20 concurrent edits time-slice
    the GIL with each other and with the loop (each waiting up to the 5 ms switch interval to get it
    back), so every answer took about as long as all of them. On the loop they finish in arrival
    order, the waiting ones cost nothing, and no thread hop is paid. Every answer's cost is bounded
    (drawn nodes, history length, body size are capped), so no request holds the loop for long."""
    return respond(await read_json(request, WorkspaceRequest))


def respond(req: WorkspaceRequest) -> Any:
    """The answer to a read and validated request (what the route does after the body reader)."""
    ws = req.workspace if req.workspace is not None else Workspace()
    check_workspace(ws, req.lang)
    if req.history is not None:
        side = history_tail.contradiction(ws, req.history)
        if side is not None:
            from lab.body import error

            raise error(422, ["body", "history", side], "input.history_length",
                        {"side": side, "sent": len(getattr(ws, side)), "length": getattr(req.history, side)}, req.lang)
        ws = history_tail.expand(ws, req.history)
    return _answer(ws, req)


# The import report of an import_script action (lab.import_script.ReportItem), for its answer only.
_IMPORT_REPORT: ContextVar[list[Any] | None] = ContextVar("import_report", default=None)


def _answer(ws: Workspace, req: WorkspaceRequest) -> Any:
    _IMPORT_REPORT.set(None)
    try:
        new = _apply(ws, req.action)
    except ChangeError as exc:
        return _error(422, ["body", "action", exc.field], _error_text(exc, req.lang), exc.key, exc.params)
    # A response, not the dict: FastAPI would run jsonable_encoder over the whole answer, which
    # costs more than computing it. Every value here is already JSON (model_dump(mode="json")).
    before = ws if req.history is not None else None
    tops = history_tail.tops(new)
    answer, encoded = _view(new, tops, _last_change(req.action.type, ws, new), before)
    report = _IMPORT_REPORT.get()
    if report is not None:  # every difference between the script's train command and the rendered one
        answer["import_report"] = [item.as_dict(req.lang) for item in report]
    return AnswerResponse(localized(answer, req.lang, tops), encoded)


class AnswerResponse(JSONResponse):
    """The answer encoded by pydantic's serializer (Rust): the same JSON values as `json.dumps`, in a
    fraction of its time for an answer of ~100 KB. UTF-8, not ASCII-escaped, as JSONResponse. A
    non-finite number (none is computed) would be written as null, never as invalid JSON.
    `encoded`: {key: (value, its JSON)} made before; a part that is still that very value (not a
    translated copy) is written from those bytes."""

    def __init__(self, content: Any, encoded: dict[str, tuple[Any, bytes]] | None = None) -> None:
        self._encoded = encoded or {}
        super().__init__(content)

    def render(self, content: Any) -> bytes:
        parts = []
        for key, value in content.items():
            known = self._encoded.get(key)
            parts.append(_to_json(key) + b":" + (known[1] if known is not None and known[0] is value else _to_json(value)))
        return b"{" + b",".join(parts) + b"}"


def check_workspace(ws: Workspace, lang: str) -> None:
    """What the model alone cannot refuse in a stored workspace: a recipe this lab does not have
    (nothing can be derived or drawn for it), history entries naming unknown fields (undo could
    not apply them) and history entries restoring an unknown recipe (undo would make it B's). 422
    naming the place; nothing is applied, so the page keeps the workspace it stored."""
    from lab.api import known_recipe
    from lab.body import error
    from lab.experiment import LEAF_FIELDS

    known_recipe(ws.b.model.recipe, ["body", "workspace", "b", "model", "recipe"], lang)
    if ws.a is not None:
        known_recipe(ws.a.model.recipe, ["body", "workspace", "a", "model", "recipe"], lang)
    for side in ("undo", "redo"):
        for i, entry in enumerate(getattr(ws, side)):
            for j, change in enumerate(entry.changes):
                if change.path not in LEAF_FIELDS:
                    raise error(422, ["body", "workspace", side, i, "changes", j, "path"],
                                "input.history_path", {"path": change.path}, lang)
                if change.path == "model.recipe":
                    for end in ("old", "new"):  # a non-text value is the model's type error, later
                        value = getattr(change, end)
                        if isinstance(value, str):
                            known_recipe(value, ["body", "workspace", side, i, "changes", j, end], lang)


def localized(v: dict[str, Any], lang: str, tops: dict[str, Any]) -> dict[str, Any]:
    """The page's texts in `lang` (lab/messages.py); the workspace and the downloadable files stay English.
    `tops`: the top entries of the answer's history stacks (lab/history_tail.tops), for the buttons' labels."""
    if lang == "en":
        return v
    from lab import messages as M

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
    from lab.recipes import RecipeError, get_recipe

    if info is None:
        return None
    try:
        summary, notes = get_recipe(info["name"]).texts(lang)
    except RecipeError:
        return info
    return {**info, "summary": summary, "notes": notes}


def _last_change(kind: str, before: Workspace, after: Workspace) -> Any:
    """The history entry this action applied (undo: the one it took back), so the page can show
    which fields changed with the user's change; null when the action touched no history."""
    if kind == "undo" and len(after.redo) > len(before.redo):
        return {"undone": True, **_dump(after.redo[-1])}
    if kind != "view" and len(after.undo) and (len(after.undo) != len(before.undo) or after.undo[-1] is not before.undo[-1]):
        if kind in ("save_a", "clear_a"):
            return None
        return {"undone": False, **_dump(after.undo[-1])}
    return None


@router.get("/api/grpo-example")
def grpo_example() -> dict[str, Any]:
    from slime.data.batch_builder import GRPO_EPS, normalize_group_rewards

    rewards = list(GRPO_EXAMPLE_REWARDS)
    n = len(rewards)
    mean = math.fsum(rewards) / n
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / (n - 1))
    advantages = normalize_group_rewards(rewards, n)
    return {
        "rewards": rewards,
        "n": n,
        "mean": mean,
        "std": std,
        "std_expr": _std_expr(rewards),
        "eps": GRPO_EPS,
        "advantages": advantages,
        "source": "slime.data.batch_builder.normalize_group_rewards",
        "starting_point": dict(GRPO_STARTING_POINT),
    }


def _std_expr(rewards: list[int]) -> str:
    """The exact sample std of 0/1 rewards as √(p/q): Σ(r−mean)² / (n−1) = k(n−k)/(n(n−1))."""
    from fractions import Fraction

    n = len(rewards)
    k = sum(rewards)
    var = Fraction(k * (n - k), n * (n - 1))
    return f"√({var.numerator}/{var.denominator})"
