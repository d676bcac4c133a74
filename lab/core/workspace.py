"""Pure history over experiments: one user action = one undoable entry (with its dependent changes),
plus the A/B slot. The page keeps the serialized Workspace in browser storage and sends it back with
each action; the server holds no session state.

CONTRACT (the API and the page rely on these):
- `Workspace` (pydantic): `b` (the experiment being edited and exported), `a` (saved A or null),
  `undo` / `redo` (lists of HistoryEntry, newest last, bounded by MAX_HISTORY).
- `undo(ws)`, `redo(ws)`, `save_a(ws)`, `clear_a(ws)`, `restore_a(ws)` (restore is one undoable
  entry; saving or clearing A is not part of B's history), `ab_diff(ws) -> list[{path, a, b}]`.
  Bad input raises `ChangeError`; the input workspace is never modified (every function returns a
  new Workspace), so on an error nothing changes.
- `push_entry`, `history_entry`, `merged_changes`, `set_values`: what an edit builds its entry
  with. The edits themselves (edit, edit_many, apply_choices, replace_b, reset) apply a change's
  dependent changes, a rule: they live in lab/rules/edit.py.

An entry stores, per field, the value before and after the whole action, so undo restores every
field the action touched (the dependent ones too) in one step, and redo re-applies them.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, TypeAdapter, model_validator

from lab.core.change import VALIDATED, ChangeError, FieldChange, unknown_field_error, validated
from lab.core.experiment import LEAF_FIELDS, Experiment, get_path, iter_field_paths, set_path
from lab.core.history_memo import HistoryMemo, contents_key
from lab.core.memo import Memo
from lab.core.messages import Text, render, text

MAX_HISTORY = 200
LEAF_ORDER: tuple[str, ...] = tuple(p for p, _ in iter_field_paths())
_SECTIONS = frozenset(".".join(p.split(".")[:i]) for p in LEAF_FIELDS for i in range(1, p.count(".") + 1))


class HistoryEntry(BaseModel):
    label: str = Field(description="English label (rendered from label_id), a field path, or the user's own label.")
    label_id: str | None = Field(None, description="Catalogue key of the label (label.* or repair.*); null for a "
                                                   "field path or a label the user wrote.")
    label_params: dict[str, Any] = Field(default_factory=dict, description="str.format parameters of the label.")
    changes: list[FieldChange]

    @model_validator(mode="before")
    @classmethod
    def _render_english(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("label_id") and not data.get("label"):
            data = {**data, "label": render(data["label_id"], data.get("label_params") or {}, "en")}
        return data


def history_entry(label: str | Text, changes: list[FieldChange]) -> HistoryEntry:
    """A history entry labelled with a catalogue text, or with a plain string (a field path, the user's own)."""
    if isinstance(label, Text):
        # label: rendered from label_id by the model's before-validator
        return HistoryEntry(label_id=label.key, label_params=label.params, changes=changes)  # type: ignore[call-arg]
    return HistoryEntry(label=label, changes=changes)


_ENTRY_ADAPTER = TypeAdapter(HistoryEntry)


def entry_json(e: HistoryEntry) -> dict[str, Any]:
    """An entry as the page stores it: without the keys that hold their defaults."""
    return _ENTRY_ADAPTER.dump_python(e, mode="json", exclude_defaults=True)


# The histories written into the last answers (lab/core/history_memo.py): the page sends them back.
SENT_HISTORIES: HistoryMemo[HistoryEntry] = HistoryMemo(entry_json, histories=32)


class Workspace(BaseModel):
    # No default: a fresh B is the default recipe's experiment, which a rule builds
    # (lab/rules/edit.py fresh_workspace); the API fills it in for a request without one.
    b: Experiment = Field(description="The experiment being edited and exported.")
    a: Experiment | None = Field(None, description="The saved A side of Compare A / B (null when none).")
    undo: list[HistoryEntry] = Field(default_factory=list, description="Undoable entries, newest last.")
    redo: list[HistoryEntry] = Field(default_factory=list, description="Redoable entries, newest last.")

    @model_validator(mode="before")
    @classmethod
    def _sent_back(cls, data: Any) -> Any:
        # A history sent back exactly as an answer wrote it is the entries it was written from.
        if isinstance(data, dict):
            for side in ("undo", "redo"):
                known = SENT_HISTORIES.known(data.get(side))
                if known is not None:
                    data = {**data, side: known}
            for side in ("b", "a"):  # likewise B and A (lab/core/change.py VALIDATED, SENT_EXPERIMENTS)
                exp = known_experiment(data.get(side))
                if exp is not None:
                    data = {**data, side: exp}
        return data


# B and A as the last answers wrote them (`remember_sent`), by their exact contents: the page sends
# them back with its next action. The dump of a validated experiment validates back to an equal
# one (tests/lab/test_answer_cost.py checks it for every recipe), so those contents ARE it.
SENT_EXPERIMENTS: Memo[Experiment] = Memo(64)


def known_experiment(data: Any) -> Experiment | None:
    """The experiment `data` (JSON sent by the page) is known to validate to, or None: validate it."""
    if not isinstance(data, dict):
        return None
    key = contents_key(data)
    if key is None:
        return None
    sent = SENT_EXPERIMENTS.peek(key)
    return sent if sent is not None else VALIDATED.peek(key)  # strictly valid contents are valid as sent


def remember_sent(exp: Experiment, data: dict[str, Any]) -> None:
    """`data` is `exp.model_dump(mode="json")`, written into an answer. The page sends it back as
    JavaScript writes it, where a whole float is an integer (1.0 → 1): that form is remembered too.
    It validates to the same experiment because every field that holds a float is typed `float` (or
    `float | None`), which reads an integer as that float (tests/lab/test_answer_cost.py)."""
    key = contents_key(data)
    if key is None:
        return
    SENT_EXPERIMENTS.put(key, exp)
    js_key = _JS_KEYS.get(key, lambda: _javascript_key(data, key))
    if js_key != key:
        SENT_EXPERIMENTS.put(js_key, exp)


# The key of contents as JavaScript writes them back, by the contents' own key: a pure function of
# the exact contents that `key` encodes (types included), so it is computed once per experiment
# sent, not walked again with each answer that writes the same B or A.
_JS_KEYS: Memo[bytes] = Memo(256)


def _javascript_key(data: dict[str, Any], key: bytes) -> bytes:
    as_js = _as_javascript_writes(data)
    return key if as_js is data else contents_key(as_js) or key


def _as_javascript_writes(value: Any) -> Any:
    """`value` after JSON.parse and JSON.stringify: whole floats become integers (the same object when none is)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        out = {k: _as_javascript_writes(v) for k, v in value.items()}
        return value if all(out[k] is v for k, v in value.items()) else out
    if isinstance(value, list):
        items = [_as_javascript_writes(v) for v in value]
        return value if all(a is b for a, b in zip(items, value)) else items
    return value


def workspace_json(ws: Workspace) -> dict[str, Any]:
    """The workspace as the page stores it and sends back with every action. History entries leave
    out the keys that hold their defaults (no label key, no reason, empty parameters): a plain
    edit's entry is then a third of the size, and every request parses, validates and sends the
    whole history (up to MAX_HISTORY entries), on the server and in the page. `Workspace.model_validate`
    reads it back equal to `ws` (the left-out keys take their defaults)."""
    data = ws.model_dump(mode="json", include={"b", "a"})
    data["undo"] = SENT_HISTORIES.dump(ws.undo)
    data["redo"] = SENT_HISTORIES.dump(ws.redo)
    return data


# --- helpers ----------------------------------------------------------------------------------------

def leaf_values(exp: Experiment) -> dict[str, Any]:
    data = exp.model_dump(mode="json")
    return {p: get_path(data, p) for p in LEAF_ORDER}


def leaf_diff(before: Experiment, after: Experiment) -> list[tuple[str, Any, Any]]:
    old, new = leaf_values(before), leaf_values(after)
    return [(p, old[p], new[p]) for p in LEAF_ORDER if old[p] != new[p]]


def push_entry(ws: Workspace, b: Experiment, entry: HistoryEntry) -> Workspace:
    if not entry.changes:  # nothing changed: no history entry
        return ws.model_copy(update={"b": b})
    return ws.model_copy(update={"b": b, "undo": (ws.undo + [entry])[-MAX_HISTORY:], "redo": []})


def merged_changes(before: Experiment, after: Experiment, steps: list[list[FieldChange]], explicit: set[str]) -> list[FieldChange]:
    """One entry's changes: every field that differs between before and after, explicit fields first."""
    reasons: dict[str, FieldChange | None] = {}
    for changes in steps:
        for c in changes:
            reasons[c.path] = None if c.path in explicit else c
    diff = leaf_diff(before, after)
    diff.sort(key=lambda t: (t[0] not in explicit, LEAF_ORDER.index(t[0])))
    out = []
    for p, o, n in diff:
        why = reasons.get(p)
        out.append(FieldChange(path=p, old=o, new=n) if why is None else
                   why.model_copy(update={"old": o, "new": n}))
    return out


def set_values(exp: Experiment, values: list[tuple[str, Any]]) -> Experiment:
    data = exp.model_dump(mode="json")
    for path, value in values:
        set_path(data, path, value)
    return validated(data)


# --- choices -------------------------------------------------------------------------------------

def flatten_choices(choices: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested (or dotted) choices dict → {leaf path: value}; unknown keys raise ChangeError."""
    if not isinstance(choices, dict):
        raise ChangeError(prefix.rstrip(".") or "choices", key="error.not_sections")
    out: dict[str, Any] = {}
    for key, value in choices.items():
        path = f"{prefix}{key}"
        if path in LEAF_FIELDS:
            out[path] = value
        elif path in _SECTIONS:
            if value is None:
                continue
            out.update(flatten_choices(value, path + "."))
        else:
            raise unknown_field_error(path)
    return out


# --- history ----------------------------------------------------------------------------------------

def undo(ws: Workspace) -> Workspace:
    if not ws.undo:
        return ws
    entry = ws.undo[-1]
    b = set_values(ws.b, [(c.path, c.old) for c in reversed(entry.changes)])
    return ws.model_copy(update={"b": b, "undo": ws.undo[:-1], "redo": (ws.redo + [entry])[-MAX_HISTORY:]})


def redo(ws: Workspace) -> Workspace:
    if not ws.redo:
        return ws
    entry = ws.redo[-1]
    b = set_values(ws.b, [(c.path, c.new) for c in entry.changes])
    return ws.model_copy(update={"b": b, "redo": ws.redo[:-1], "undo": (ws.undo + [entry])[-MAX_HISTORY:]})


# --- A / B ------------------------------------------------------------------------------------------

def save_a(ws: Workspace) -> Workspace:
    """Save the complete current B as A (replacing any A); not part of B's history."""
    return ws.model_copy(update={"a": ws.b.model_copy(deep=True)})


def clear_a(ws: Workspace) -> Workspace:
    return ws.model_copy(update={"a": None})


def restore_a(ws: Workspace) -> Workspace:
    """Replace B with A as one undoable entry; A itself stays."""
    if ws.a is None:
        raise ChangeError("a", key="error.no_a")
    changes = [FieldChange.because(p, o, n, text("change.restored_a")) for p, o, n in leaf_diff(ws.b, ws.a)]
    return push_entry(ws, ws.a.model_copy(deep=True), history_entry(text("label.restore_a"), changes))


def ab_diff(ws: Workspace) -> list[dict[str, Any]]:
    """Fields where A and B differ, in field order: [{path, a, b}]; empty without A."""
    if ws.a is None:
        return []
    return [{"path": p, "a": a, "b": b} for p, a, b in leaf_diff(ws.a, ws.b)]
