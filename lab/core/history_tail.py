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
rule of lab/core/workspace.py alone: it shows up here as `start`. What the request and the answer carry
no longer grows with the history: the request is the same size at 200 entries as at two, and the
server neither validates nor writes the entries it was not sent.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from lab.core.workspace import HistoryEntry, Workspace, entry_json

TAIL_SENT = 2  # what the page sends (app.js holds the same number, tied by a test): the top, and the entry an undo or redo makes the new top
MAX_LENGTH = 10_000  # a bound on the placeholders one request may ask for (the page holds ≤ MAX_HISTORY)


class HistoryLengths(BaseModel):
    """The full lengths of the page's stacks (their tops are in `workspace.undo` / `workspace.redo`)."""

    undo: int = Field(ge=0, le=MAX_LENGTH, description="Entries on the page's undo stack.")
    redo: int = Field(ge=0, le=MAX_LENGTH, description="Entries on the page's redo stack.")


class _Unsent:
    """Stands for every entry the page holds and did not send (one object: only counts matter)."""

    __slots__ = ()


_UNSENT = _Unsent()


def contradiction(ws: Workspace, lengths: HistoryLengths) -> str | None:
    """The stack whose sent top contradicts its length: more entries sent than it holds, or none
    sent from a stack that holds some (an undo or redo needs the top itself)."""
    for side in ("undo", "redo"):
        sent, length = len(getattr(ws, side)), getattr(lengths, side)
        if sent > length or (length and not sent):
            return side
    return None


def expand(ws: Workspace, lengths: HistoryLengths) -> Workspace:
    """`ws` with each stack at its full length: placeholders below the entries that were sent."""
    return ws.model_copy(update={
        side: [_UNSENT] * (getattr(lengths, side) - len(getattr(ws, side))) + getattr(ws, side)
        for side in ("undo", "redo")})


def _placeholders(stack: list[Any]) -> int:
    """How many placeholders open `stack`: they are always at its bottom (C-level scans only)."""
    n = stack.count(_UNSENT)
    if _UNSENT in stack[n:]:  # pragma: no cover - the workspace functions only cut, take the top and append
        raise AssertionError("a history stack changed other than by cutting, taking the top and appending")
    return n


def stack_change(before: list[Any], after: list[Any]) -> dict[str, Any]:
    """How `after` follows from `before`: after == before[start:stop] + push (entries as JSON).
    The workspace functions only cut the oldest entries, take the top one and append: so the
    placeholders that survive are the newest of them, and the sent entries that survive follow."""
    hidden, hidden_after = _placeholders(before), _placeholders(after)
    if hidden_after > hidden:  # pragma: no cover - placeholders are never added
        raise AssertionError("a history stack gained entries the page did not send")
    sent, rest = before[hidden:], after[hidden_after:]
    if hidden_after:
        start, first = hidden - hidden_after, 0
    else:
        first = next((i for i, e in enumerate(sent) if rest and e is rest[0]), len(sent))
        start = hidden + first
    kept = 0
    while kept < len(rest) and first + kept < len(sent) and rest[kept] is sent[first + kept]:
        kept += 1
    push = rest[kept:]
    if not all(isinstance(e, HistoryEntry) for e in push):  # pragma: no cover - an unsent entry cannot move
        raise AssertionError("an entry the page did not send was moved")
    return {"start": start, "stop": start + hidden_after + kept, "push": [entry_json(e) for e in push]}


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
