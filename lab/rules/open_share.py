"""Opening a share link into the workspace, and checking one as the page would open it.

The link itself (encoding, decoding, the private fields it never carries) is lab/core/share.py;
opening it is `apply_choices` (lab/rules/edit.py): one undoable entry that keeps the opener's own
paths.
"""
from __future__ import annotations

from typing import Any

from lab.core.change import ChangeError
from lab.core.messages import text
from lab.core.share import ShareError, decode_ab_link, decode_link, is_ab_link
from lab.core.workspace import Workspace
from lab.rules.edit import apply_choices, fresh_workspace


def open_share_link(ws: Workspace, link_or_token: str) -> Workspace:
    """Open a link into the workspace, keeping the user's private paths.

    Ordinary link: B becomes the link's choices as one undoable entry. A/B link: B likewise, and A is
    replaced by the link's A side (built on the user's current B, so A keeps the user's paths too).
    """
    if is_ab_link(link_or_token):
        a_choices, b_choices = decode_ab_link(link_or_token)
        a_side = apply_choices(Workspace(b=ws.b), a_choices, text("label.share_a")).b
        opened = apply_choices(ws, b_choices, text("label.share_b"))
        return opened.model_copy(update={"a": a_side})
    return apply_choices(ws, decode_link(link_or_token), text("label.share"))


def checked_choices(link_or_token: str) -> dict[str, Any]:
    """What a link carries, each side checked as the page would open it (a value the model refuses,
    e.g. nodes -1, is a ShareError naming the field): {"choices": ...}, or {"a": ..., "b": ...}."""
    sides = dict(zip("ab", decode_ab_link(link_or_token))) if is_ab_link(link_or_token) else \
        {"choices": decode_link(link_or_token)}
    for side, choices in sides.items():
        try:
            apply_choices(fresh_workspace(), choices, "check share link")
        except ChangeError as exc:
            why = {"key": exc.key, "params": exc.params} if exc.key else exc.message
            key = "error.share.refused" if side == "choices" else "error.share.refused_side"
            raise ShareError(key=key, params={"side": side.upper(), "field": exc.field, "why": why}) from exc
    return sides
