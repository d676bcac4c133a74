"""POST /api/workspace: one user action in, everything the page draws out.

The page keeps the serialized Workspace (choices, undo/redo history, saved A) in localStorage and
sends it with each action; the server holds no session. The answer is what the page draws for the
new workspace (lab/web/workspace_view.py).

An `import_script` answer adds `import_report`: every difference between the script's train command
and the rendered one, [{kind, flag, line, script, rendered, why}] in the request's language.

With `history` (the full lengths of the page's stacks) the request's workspace carries only the
tops of its undo and redo stacks, and the answer's workspace only B and A, plus `history`: how
each stack changed (lab/core/history_tail.py). The page sends this form; without `history` the whole
workspace goes both ways.

The action `{"type": "apply_repair", "id": ...}` applies one of the answer's `repairs` as ONE
undoable entry.

Load JSON REPLACES B (one undoable entry): the file's fields win; every field the file does not
name goes back to the default of the file's recipe (B's recipe when the file names none), except
the user's private fields (paths, addresses, RDMA devices, hooks), which are kept unless the file
has them. A file that cannot be loaded is a 422 naming what is wrong; B and history are untouched.

Bad input (an unknown field, a value the model refuses, a broken share link or JSON file) is a
4xx whose `detail[0].loc` ends with the field path and whose `msg` says what is wrong; the page
then keeps the state it had.

Every answer carries `tags` (a hash of each large part's JSON) and `same`: the parts left out
because the request's `held` named them with the same tag; the page keeps its copy of those
(lab/web/answer_parts.py).

GET /api/grpo-example: the walkthrough's worked example (lab/core/grpo_example.py).
"""
from __future__ import annotations

import json
from contextvars import ContextVar
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from lab.core import history_tail, share, workspace
from lab.core.change import ChangeError
from lab.core.grpo_example import GRPO_STARTING_POINT, worked_example
from lab.core.history_tail import HistoryLengths
from lab.core.messages import text as msg
from lab.core.workspace import Workspace
from lab.rules import edit
from lab.rules.open_share import open_share_link
from lab.web.answer_parts import Held, encode_answer
from lab.web.body import read_json
from lab.web.workspace_view import answer_view, dump, localized, to_json

router = APIRouter()


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
                                           "then says how each stack changed (lab/core/history_tail.py).")
    action: Action
    held: Held | None = Field(None, description="The tags of the answer parts the page holds (an earlier answer's "
                              "`tags`): a part whose tag is unchanged is left out of the answer and "
                              "named in its `same` (lab/web/answer_parts.py).")
    lang: Literal["en", "zh"] = Field("en", description="Language of the findings, repairs, change reasons and memory "
                                                     "texts in the answer (the workspace and the files stay English).")

    @field_validator("workspace", mode="before")
    @classmethod
    def _fresh_b(cls, data: Any) -> Any:
        # A stored workspace without B starts from the default recipe's experiment, as a fresh one.
        if isinstance(data, dict) and "b" not in data:
            return {**data, "b": edit.fresh_workspace().b}
        return data


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
    from lab.core.messages import localize_text

    return localize_text(exc.key, exc.params, lang)


_HISTORY_ACTIONS = {
    "undo": workspace.undo, "redo": workspace.redo, "reset": edit.reset,
    "save_a": workspace.save_a, "clear_a": workspace.clear_a, "restore_a": workspace.restore_a,
}


def _apply(ws: Workspace, action: Action) -> Workspace:
    t = action.type
    if t == "view":
        return ws
    if t == "edit":
        if not action.path:
            raise ChangeError("action.path", key="error.action.no_path")
        return edit.edit(ws, action.path, action.value)
    if t == "edit_many":
        return edit.edit_many(ws, action.values or {}, action.label or msg("label.edit"))
    if t == "adopt_grpo":
        return edit.edit_many(ws, dict(GRPO_STARTING_POINT), msg("label.grpo"))
    if t in _HISTORY_ACTIONS:
        return _HISTORY_ACTIONS[t](ws)
    if t == "open_share":
        if not action.link:
            raise ChangeError("action.link", key="error.action.no_link")
        try:
            return open_share_link(ws, action.link)
        except share.ShareError as exc:  # truncated, edited or foreign: say so, keep the state
            raise ChangeError("action.link", str(exc), exc.key, exc.params) from exc
    if t == "load_json":
        from lab.core.load_json import LoadError, parse_document

        text = action.text if action.text is not None else json.dumps(action.data)
        try:
            loaded = parse_document(text)
        except LoadError as exc:
            raise ChangeError(exc.field or "action.text", str(exc), exc.key, exc.params) from exc
        return edit.replace_b(ws, loaded.choices, msg("label.load_json"))
    if t == "import_script":
        from lab.rules.import_script import ScriptImportError, import_script

        try:
            imported = import_script(action.text or "", sources=action.sources)
        except ScriptImportError as exc:  # names the line; the workspace stays as it was
            raise ChangeError("action.text", str(exc), exc.key, exc.params) from exc
        _IMPORT_REPORT.set(imported.report)
        replaced = edit.replace_b(ws, imported.b.model_dump(mode="json"), msg("label.import_script"))
        return replaced.model_copy(update={"a": imported.a})  # B against the closest recipe as A
    if t == "apply_repair":
        from lab.rules.repair import apply_repair

        if not action.id:
            raise ChangeError("action.id", key="error.action.no_repair_id")
        return apply_repair(ws, action.id)
    raise ChangeError("action.type", key="error.action.unknown", params={"type": repr(t)})  # pragma: no cover - Literal guards it


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
    ws = req.workspace if req.workspace is not None else edit.fresh_workspace()
    check_workspace(ws, req.lang)
    if req.history is not None:
        side = history_tail.contradiction(ws, req.history)
        if side is not None:
            from lab.web.body import error

            raise error(422, ["body", "history", side], "input.history_length",
                        {"side": side, "sent": len(getattr(ws, side)), "length": getattr(req.history, side)}, req.lang)
        ws = history_tail.expand(ws, req.history)
    return _answer(ws, req)


# The import report of an import_script action (lab.rules.import_script.ReportItem), for its answer only.
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
    answer, encoded = answer_view(new, tops, _last_change(req.action.type, ws, new), before)
    report = _IMPORT_REPORT.get()
    if report is not None:  # every difference between the script's train command and the rendered one
        answer["import_report"] = [item.as_dict(req.lang) for item in report]
    return AnswerResponse(localized(answer, req.lang, tops), encoded, req.held)


class AnswerResponse(JSONResponse):
    """The answer encoded by pydantic's serializer (Rust): the same JSON values as `json.dumps`, in a
    fraction of its time for an answer of ~100 KB. UTF-8, not ASCII-escaped, as JSONResponse. A
    non-finite number (none is computed) would be written as null, never as invalid JSON.
    `encoded`: {key: (value, its JSON)} made before; a part that is still that very value (not a
    translated copy) is written from those bytes. `held`: the tags of the parts the page holds; those
    parts are left out (lab/web/answer_parts.py)."""

    def __init__(self, content: Any, encoded: dict[str, tuple[Any, bytes]] | None = None,
                 held: dict[str, str] | None = None) -> None:
        self._encoded = encoded or {}
        self._held = held
        super().__init__(content)

    def _part(self, key: str, value: Any) -> bytes:
        known = self._encoded.get(key)
        return known[1] if known is not None and known[0] is value else to_json(value)

    def render(self, content: Any) -> bytes:
        return encode_answer(content, self._held, self._part)


def check_workspace(ws: Workspace, lang: str) -> None:
    """What the model alone cannot refuse in a stored workspace: a recipe this lab does not have
    (nothing can be derived or drawn for it), history entries naming unknown fields (undo could
    not apply them) and history entries restoring an unknown recipe (undo would make it B's). 422
    naming the place; nothing is applied, so the page keeps the workspace it stored."""
    from lab.core.experiment import LEAF_FIELDS
    from lab.web.api import known_recipe
    from lab.web.body import error

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


def _last_change(kind: str, before: Workspace, after: Workspace) -> Any:
    """The history entry this action applied (undo: the one it took back), so the page can show
    which fields changed with the user's change; null when the action touched no history."""
    if kind == "undo" and len(after.redo) > len(before.redo):
        return {"undone": True, **dump(after.redo[-1])}
    if kind != "view" and len(after.undo) and (len(after.undo) != len(before.undo) or after.undo[-1] is not before.undo[-1]):
        if kind in ("save_a", "clear_a"):
            return None
        return {"undone": False, **dump(after.undo[-1])}
    return None


@router.get("/api/grpo-example")
def grpo_example() -> dict[str, Any]:
    return worked_example()
