"""The page sends the tops of its undo and redo stacks, not the whole history; the answer says how
each stack changed.

The page keeps the whole workspace (up to MAX_HISTORY entries a stack) in its storage. An action
needs at most the top entry of a stack (undo takes it back, redo re-applies it) and the top after
that one (the Undo button's label once the top is gone). So with `history: {"undo": N, "redo": M}`
in the request, `workspace.undo` / `workspace.redo` hold only the last few entries (TAIL_SENT, the
page's choice) and N, M give the full lengths. The server stands a placeholder in for every entry
it was not sent, runs the same workspace functions as for a full history (they only slice and
append, so placeholders are never read), and answers for each stack

    {"start": i, "stop": j, "push": [entries]}:  new stack = old[i:j] + push

which the page applies to the stack it holds. Cutting the oldest entries at MAX_HISTORY stays a
rule of lab/workspace.py alone: it shows up here as `start`. What the request and the answer carry
no longer grows with the history: at 200 entries the request is a tenth of its full-history size,
and the server neither validates nor writes the entries it was not sent.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from lab.workspace import HistoryEntry, Workspace, entry_json

TAIL_SENT = 2  # what the page sends: the top, and the entry an undo or redo makes the new top
MAX_LENGTH = 10_000  # a bound on the placeholders one request may ask for (the page holds ≤ MAX_HISTORY)


class HistoryLengths(BaseModel):
    """The full lengths of the page's stacks (their tops are in `workspace.undo` / `workspace.redo`)."""

    undo: int = Field(ge=0, le=MAX_LENGTH, description="Entries on the page's undo stack.")
    redo: int = Field(ge=0, le=MAX_LENGTH, description="Entries on the page's redo stack.")


class _Unsent:
    """An entry the page holds and did not send; only its position in the stack matters."""

    __slots__ = ()


def short_side(ws: Workspace, lengths: HistoryLengths) -> str | None:
    """The stack whose sent tail is longer than its full length (the request contradicts itself)."""
    for side in ("undo", "redo"):
        if len(getattr(ws, side)) > getattr(lengths, side):
            return side
    return None


def expand(ws: Workspace, lengths: HistoryLengths) -> Workspace:
    """`ws` with each stack at its full length: placeholders below the entries that were sent."""
    return ws.model_copy(update={
        side: [_Unsent() for _ in range(getattr(lengths, side) - len(getattr(ws, side)))] + getattr(ws, side)
        for side in ("undo", "redo")})


def stack_change(before: list[Any], after: list[Any]) -> dict[str, Any]:
    """How `after` follows from `before`: after == before[start:stop] + push (entries as JSON)."""
    position = {id(e): i for i, e in enumerate(before)}
    kept = 0
    while kept < len(after) and id(after[kept]) in position:
        kept += 1
    start = position[id(after[0])] if kept else len(before)
    if any(after[k] is not before[start + k] for k in range(kept)):  # pragma: no cover - the functions only slice
        raise AssertionError("a history stack changed other than by slicing and appending")
    push = after[kept:]
    if not all(isinstance(e, HistoryEntry) for e in push):  # pragma: no cover - an unsent entry cannot move
        raise AssertionError("an entry the page did not send was moved")
    return {"start": start, "stop": start + kept, "push": [entry_json(e) for e in push]}


def changes(before: Workspace, after: Workspace) -> dict[str, dict[str, Any]]:
    return {side: stack_change(getattr(before, side), getattr(after, side)) for side in ("undo", "redo")}


def tops(ws: Workspace) -> dict[str, dict[str, Any] | None]:
    """The top entry of each stack as JSON (what the Undo / Redo buttons are labelled with); None
    when the stack is empty or its top was not sent."""
    out: dict[str, dict[str, Any] | None] = {}
    for side in ("undo", "redo"):
        stack = getattr(ws, side)
        out[side] = entry_json(stack[-1]) if stack and isinstance(stack[-1], HistoryEntry) else None
    return out
