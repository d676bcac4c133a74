"""The one JSON reader for what users send: HTTP bodies, Load JSON files, share links, CLI values.

Python's `json` accepts things no experiment holds and that break later steps: NaN and Infinity
(not JSON, and they compare unequal to themselves), integers of thousands of digits (int() of a
string beyond 4,300 digits raises), lone surrogates such as "\\ud800" (nothing can encode them,
so writing a file fails half-way), and nesting deep enough to exhaust the interpreter's stack.
`loads` refuses each of them before any model sees the data, with a `JSONInputError` whose `loc`
names the field (a path of keys and list indexes) or whose message names the position, and whose
`key`/`params` render the message in the user's language (lab/core/messages.py, `input.*`).
"""
from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from typing import Any

MAX_DEPTH = 32  # an experiment nests 4 levels, a workspace with its history about 8
MAX_INT_DIGITS = 20  # the largest field bound has 7 digits; 20 covers any 64-bit integer


# The json module's reasons, as message keys (lab/locales), so a Chinese page reads them in Chinese.
JSON_WHY: dict[str, str] = {
    "Expecting value": "json.why.value",
    "Expecting property name enclosed in double quotes": "json.why.property_name",
    "Expecting ':' delimiter": "json.why.colon",
    "Expecting ',' delimiter": "json.why.comma",
    "Extra data": "json.why.extra_data",
    "Unterminated string starting at": "json.why.unterminated_string",
    "Invalid control character at": "json.why.control_character",
    "Invalid \\escape": "json.why.escape",
    "Invalid \\uXXXX escape": "json.why.unicode_escape",
}


class JSONInputError(ValueError):
    """Input that is not acceptable JSON. `loc`: the path inside the document (empty: the whole)."""

    def __init__(self, key: str, params: dict[str, Any], loc: tuple[str | int, ...] = ()) -> None:
        self.key = key
        self.params = params
        self.loc = loc
        where = ".".join(str(x) for x in loc)
        super().__init__(f"{where}: {self.english}" if where else self.english)

    @property
    def english(self) -> str:
        from lab.core.messages import render

        return render(self.key, self.params, "en")


class _BigInt(str):
    """An integer literal too long to convert; reported with its path by `_walk`."""


class _NonFinite(str):
    """NaN, Infinity, -Infinity, or a float literal that overflows (1e999)."""


def _parse_int(text: str) -> Any:
    digits = len(text.lstrip("-"))
    return _BigInt(text) if digits > MAX_INT_DIGITS else int(text)


def _parse_float(text: str) -> Any:
    value = float(text)
    return value if math.isfinite(value) else _NonFinite(text)


def _surrogate(text: str) -> tuple[int, int] | None:
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start, ord(text[exc.start])
    return None


def _check_leaf(value: Any, loc: tuple[str | int, ...]) -> None:
    if isinstance(value, _BigInt):
        raise JSONInputError("input.big_int", {"digits": len(value.lstrip("-")), "limit": MAX_INT_DIGITS}, loc)
    if isinstance(value, _NonFinite):
        raise JSONInputError("input.non_finite", {"value": str(value)}, loc)
    if isinstance(value, str):
        bad = _surrogate(value)
        if bad is not None:
            raise JSONInputError("input.surrogate", {"code": f"{bad[1]:04X}", "pos": bad[0] + 1}, loc)


def check_tree(data: Any, max_depth: int = MAX_DEPTH) -> None:
    """Refuse deep nesting, huge integers, non-finite numbers and lone surrogates anywhere in `data`
    (keys too). Iterative, so a deep document cannot exhaust the stack here either."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(data, ())]
    while stack:
        value, loc = stack.pop()
        if len(loc) > max_depth:
            raise JSONInputError("input.too_deep", {"limit": max_depth}, loc[:max_depth])
        if isinstance(value, dict):
            for k, v in value.items():
                _check_leaf(k, loc)
                stack.append((v, (*loc, k)))
        elif isinstance(value, list):
            stack.extend((v, (*loc, i)) for i, v in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            raise JSONInputError("input.non_finite", {"value": repr(value)}, loc)
        else:
            _check_leaf(value, loc)


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_STRING = re.compile(rb'"[^"]*"')  # a string once all but quotes and brackets are gone
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')
_DELTA = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
# What the number hooks below look for: a run of 21+ digits (a huge integer, or a float that may
# overflow), a 3+-digit exponent after a digit (1e999), or NaN / Infinity. Text without any of them
# parses to the same values without the hooks, which cost a Python call per number. Searched as
# fixed strings once every digit reads 0, E reads e and - reads + (a regular expression takes
# longer than the parse).
_NUMBER_SHAPE = bytes.maketrans(b"123456789E-", b"000000000e+")
_ODD_MARKS = (b"0" * 21, b"NaN", b"Infinity", b"0e000", b"0e+000")


def _odd_numbers(data: bytes) -> bool:
    """Whether `data` may hold a number the hooks refuse (never False when it does)."""
    shape = data.translate(_NUMBER_SHAPE)
    return any(mark in shape for mark in _ODD_MARKS)


def _max_depth(text: str | bytes) -> int:
    """The deepest nesting of a JSON document that parses, counted over its brackets outside strings
    (C-level loops only; ASCII bytes never occur inside a UTF-8 multi-byte character)."""
    data = text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
    if b"\\" in data:  # escaped backslashes, then escaped quotes: what is left of an escape is dropped below
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    skeleton = data.translate(None, _NOT_STRUCTURE)
    brackets = skeleton.replace(b'""', b"")  # strings without brackets, the usual case
    if b'"' in brackets:  # a string holds a bracket: pair the quotes properly
        brackets = _STRING.sub(b"", skeleton)
    return max(accumulate(map(_DELTA.__getitem__, brackets)), default=0)


def loads(raw: str | bytes, max_bytes: int | None = None, max_depth: int = MAX_DEPTH) -> Any:
    """Parse `raw` (UTF-8 bytes or text) strictly; raises JSONInputError naming what is wrong and where."""
    if max_bytes is not None:
        size = len(raw) if isinstance(raw, bytes) else len(raw.encode("utf-8", "surrogatepass"))
        if size > max_bytes:
            raise JSONInputError("input.too_large", {"size": size, "limit": max_bytes})
    raw_bytes = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JSONInputError("input.not_utf8", {"pos": exc.start}) from None
    odd: list[bool] = []  # set by the number hooks: a huge integer or a non-finite number was read

    def parse_int(text: str) -> Any:
        value = _parse_int(text)
        if isinstance(value, _BigInt):
            odd.append(True)
        return value

    def parse_float(text: str) -> Any:
        value = _parse_float(text)
        if isinstance(value, _NonFinite):
            odd.append(True)
        return value

    def parse_constant(text: str) -> Any:
        odd.append(True)
        return _NonFinite(text)

    hooks: dict[str, Any] = {"parse_int": parse_int, "parse_float": parse_float, "parse_constant": parse_constant}
    try:
        data = json.loads(raw, **(hooks if _odd_numbers(raw_bytes) else {}))
    except json.JSONDecodeError as exc:
        why = JSON_WHY.get(exc.msg)
        raise JSONInputError("input.not_json", {"line": exc.lineno, "col": exc.colno,
                                                "why": {"key": why} if why else exc.msg}) from None
    except RecursionError:
        raise JSONInputError("input.too_deep", {"limit": max_depth}) from None
    # The walk that names the place runs only when a cheap test over the text finds something: the
    # common, well-formed body is not walked node by node.
    if odd or _SURROGATE_ESCAPE.search(raw) or _max_depth(raw_bytes) > max_depth:
        check_tree(data, max_depth)
    return data


def dumps_safe(value: Any) -> str:
    """`json.dumps` that refuses NaN/Infinity instead of writing them (for files others read)."""
    return json.dumps(value, allow_nan=False)
