"""The one rule for characters in the experiment's text values; every entry point goes through it.

Every string of the experiment ends up on a command line: as a flag's value (`--input-key KEY`),
as a path given to a flag (`--hf-checkpoint DIR`), as a docker tag or a hook name. So every string
value, and every item of a list of strings, must

- hold no NUL, CR or LF: one of them splits or truncates a line of the generated shell;
- be valid Unicode (no lone surrogate): such text cannot be written to any file;
- not begin with `-`: argparse, `ray` and `docker` read such a value as an option of their own.

`check_text` is the rule; the pydantic model (lab/core/experiment.py) calls it for every field, so an
edit, a render, a validation, a share link, Load JSON, an import and the CLI all refuse the same
values with the same message.
"""
from __future__ import annotations

from typing import Any

FORBIDDEN_CHARS: dict[str, str] = {"\x00": "NUL", "\r": "CR", "\n": "LF"}
_NOT_TEXT = frozenset({bool, int, float, type(None)})


class TextRuleError(ValueError):
    """A value the rule refuses; `key`/`params` render the message in any language (lab/core/messages.py)."""

    def __init__(self, key: str, params: dict[str, Any]) -> None:
        from lab.core.messages import render

        super().__init__(render(key, params, "en"))
        self.key = key
        self.params = params


def _problem(text: str, allow_dash: bool = False) -> TextRuleError | None:
    # Every field of every experiment passes here on every request: the common case (printable
    # ASCII: no NUL, CR, LF or surrogate) is answered by two C-level scans.
    if text.isascii() and text.isprintable() and (allow_dash or not text.startswith("-")):
        return None
    for ch, name in FORBIDDEN_CHARS.items():
        pos = text.find(ch)
        if pos >= 0:
            return TextRuleError("input.char", {"char": name, "pos": pos + 1})
    if text.startswith("-") and not allow_dash:
        return TextRuleError("input.dash", {})
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate (or undecodable command-line bytes)
            return TextRuleError("input.surrogate", {"code": f"{ord(text[exc.start]):04X}", "pos": exc.start + 1})
    return None


def check_text(value: Any, allow_dash: bool = False) -> Any:
    """Raise TextRuleError when `value` (a string or a list of strings) breaks the rule; else return it.
    `allow_dash`: the value is itself a list of flags (advanced.extra_flags), so it may begin with `-`."""
    if value.__class__ in _NOT_TEXT:
        return value
    if isinstance(value, str):
        err = _problem(value, allow_dash)
        if err is not None:
            raise err
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, str):
                err = _problem(item, allow_dash)
                if err is not None:
                    raise TextRuleError("input.item", {"item": i + 1, "msg": {"key": err.key, "params": err.params}})
    return value
