"""A user's edit of the workspace as one undoable entry, with every field that changes with it.

The history itself (entries, undo, redo, A/B) is lab/core/workspace.py; what changes together with
a field is lab/rules/dependents.py. Here the two meet:
- `edit(ws, path, value)`, `edit_many(ws, values: dict[path, value], label)` (one entry: repairs),
  `apply_choices(ws, choices: dict, label)` (one entry: share links, Load JSON; a nested, possibly
  partial choices dict), `replace_b(ws, choices, label)` (Load JSON), `reset(ws)`.
- `fresh_workspace()`: a workspace whose B is the default recipe's experiment.

Bad input raises `ChangeError` before anything changes. `reset` returns B to `new_experiment()`
(the default model's recipe) but KEEPS the user's private fields (machine paths, engine addresses,
RDMA devices, hook paths): they describe the user's machines, not the experiment, and retyping them
is what a reset should not cost.
"""
from __future__ import annotations

from typing import Any

from lab.core.change import FieldChange, unknown_field_error
from lab.core.experiment import LEAF_FIELDS, PRIVATE_FIELDS
from lab.core.messages import Text, text
from lab.core.workspace import (
    LEAF_ORDER,
    HistoryEntry,
    Workspace,
    flatten_choices,
    history_entry,
    leaf_diff,
    leaf_values,
    merged_changes,
    push_entry,
    set_values,
)
from lab.rules.dependents import apply_change, new_experiment


def fresh_workspace() -> Workspace:
    """A workspace with nothing edited yet: B is the default recipe's experiment."""
    return Workspace(b=new_experiment())


def edit(ws: Workspace, path: str, value: Any) -> Workspace:
    b, changes = apply_change(ws.b, path, value)
    return push_entry(ws, b, HistoryEntry(label=path, changes=[c for c in changes if c.old != c.new]))


def edit_many(ws: Workspace, values: dict[str, Any], label: str | Text) -> Workspace:
    """Several field changes (with their dependents) as ONE undoable entry; the given values win."""
    for path in values:
        if path not in LEAF_FIELDS:
            raise unknown_field_error(path)
    ordered = sorted(values.items(), key=lambda kv: kv[0] != "model.recipe")  # the model first: it copies a recipe
    b, steps = ws.b, []
    for path, value in ordered:
        b, changes = apply_change(b, path, value)
        steps.append(changes)
    b = set_values(b, ordered)  # a later dependent must not overwrite an explicitly given value
    return push_entry(ws, b, history_entry(label, merged_changes(ws.b, b, steps, set(values))))


def apply_choices(ws: Workspace, choices: dict[str, Any], label: str | Text) -> Workspace:
    """Apply a (possibly partial, nested) choices dict as ONE undoable entry (share links, Load JSON).

    Every value is checked before anything is applied; fields absent from `choices` keep their
    value unless a given field changes them (choosing a model copies its recipe). Opening a share
    link therefore keeps the user's own private paths (the link carries none).
    """
    values = flatten_choices(choices)
    for path, value in values.items():  # validate everything first: a bad field names itself
        apply_change(ws.b, path, value)
    return edit_many(ws, values, label)


def replace_b(ws: Workspace, choices: dict[str, Any], label: str | Text) -> Workspace:
    """B becomes the file (Load JSON): its fields, the defaults of its recipe for the rest, the user's
    private fields unless the file has them. ONE undoable entry; a bad value raises before anything changes."""
    given = flatten_choices(choices)
    for path, value in given.items():  # every value checked first: a bad field names itself
        apply_change(ws.b, path, value)
    base = leaf_values(new_experiment(given.get("model.recipe", ws.b.model.recipe)))
    mine = leaf_values(ws.b)
    full = {p: (mine[p] if p in PRIVATE_FIELDS else v) for p, v in base.items()}
    full.update(given)
    return edit_many(ws, full, label)



def reset(ws: Workspace) -> Workspace:
    """B back to `new_experiment()` defaults as one undoable entry, keeping the private fields."""
    fresh = new_experiment()
    mine = leaf_values(ws.b)
    b = set_values(fresh, [(p, mine[p]) for p in LEAF_ORDER if p in PRIVATE_FIELDS])
    changes = [FieldChange.because(p, o, n, None if p == "model.recipe" else text("change.reset"))
               for p, o, n in leaf_diff(ws.b, b)]
    return push_entry(ws, b, history_entry(text("label.reset"), changes))
