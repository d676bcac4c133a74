"""An answer without the parts the page already holds.

Most actions change a few small parts of the answer (the findings, a derived number, the files'
lines that name the edited flag) and leave the large ones as they were: of the ~50 KB a click used
to bring back, most was the very JSON the page had drawn the click before. So every part of an
answer of at least TAG_MIN bytes goes out with a tag (a hash of its JSON bytes) in `tags`; the page
sends the tags it holds back as `held`, and a part whose tag is the same is left out of the next
answer and named in `same`. The page keeps its own copy of those parts:

    next view = {**answer, **{k: previous view[k] for k in answer["same"]}}

A tag is of the bytes, so anything that changes a part's JSON (another experiment, another
language, another checkout's provenance) changes its tag: the page never keeps a stale part. A
`held` tag the server does not recognise only costs the part being sent.

The generated files (`files`, ~36 KB) change with nearly every edit, but only in a few lines. The
server remembers the last files it sent, by tag; when the page holds one of them, the answer
carries `patch.files` instead: {"base": held tag, "texts": {name: ops}}, where ops turn the held
text into the new one line by line (`text_ops`; a line keeps its "\n") and a name missing from
`texts` is a file the new answer no longer has. Where the server no longer remembers the held
files, they are sent whole.
"""
from __future__ import annotations

import bisect
import difflib
import hashlib
import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any

import pydantic_core
from pydantic import Field, StringConstraints

from lab.core.memo import Memo

TAG_MIN = 512  # smaller parts cost less to send than to tag and compare
NEVER_LEFT_OUT = frozenset({"workspace", "history", "last_change", "import_report", "tags", "same", "patch"})
TAG_CHARS = 16
PATCHED = frozenset({"files"})  # parts of {name: text} sent as line patches against the page's copy

# What a request may carry as `held` (bounded: at most one tag per part of an answer).
PartName = Annotated[str, StringConstraints(max_length=40)]
PartTag = Annotated[str, StringConstraints(max_length=TAG_CHARS)]
Held = Annotated[dict[PartName, PartTag], Field(max_length=64)]


def tag(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=TAG_CHARS // 2).hexdigest()


# The texts sent lately, by tag (bounded: 64 answers' files, a few MB), and the patches made between them.
_SENT_TEXTS: Memo[Mapping[str, str]] = Memo(64)
_PATCHES: Memo[bytes] = Memo(64)


LINE = r"[^\n]*\n|[^\n]+$"  # app.js textLines uses this very pattern (a test ties the two)


def lines(text: str) -> list[str]:
    """`text` cut after each "\n" (the page cuts it the same way: app.js textLines)."""
    return re.findall(LINE, text)


def _common_prefix(a: str, b: str) -> int:
    """How many leading characters `a` and `b` share (a binary search of slice comparisons, each in C)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_suffix(a: str, b: str, limit: int) -> int:
    """How many trailing characters `a` and `b` share, at most `limit`."""
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid:len(a) - lo] == b[len(b) - mid:len(b) - lo]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def text_ops(old: str, new: str) -> list[tuple[int, int, list[str]]]:
    """[(i, j, lines)]: the old text's lines [i, j) give way to `lines`, in order; the rest stay."""
    if old == new:
        return []
    # An edit changes a few lines of a long file: the common head and tail are found on characters,
    # and only the lines in between are cut and compared (SequenceMatcher), each once.
    start = old.rfind("\n", 0, _common_prefix(old, new)) + 1  # where the first line that differs starts
    head = old.count("\n", 0, start)
    suffix = _common_suffix(old, new, min(len(old), len(new)) - start)
    stop_old, stop_new = len(old) - suffix, len(new) - suffix
    # The tail begins at the first line start in the common suffix that is a line start in both texts
    # (`start` is one in both); past the suffix's first character, one is a line start in both or in neither.
    if not all(stop == start or text[stop - 1] == "\n" for text, stop in ((old, stop_old), (new, stop_new))):
        cut = old.find("\n", stop_old)
        stop_new += (cut + 1 - stop_old) if cut >= 0 else suffix
        stop_old = cut + 1 if cut >= 0 else len(old)
    ops: list[tuple[int, int, list[str]]] = []
    _line_ops(lines(old[start:stop_old]), lines(new[start:stop_new]), head, ops)
    return ops


def _line_ops(a: list[str], b: list[str], at: int, ops: list[tuple[int, int, list[str]]], anchor: bool = True) -> None:
    """Appends the ops turning lines `a` (the old text's from line `at`) into `b`.

    Where both hold lines that occur once in each (most lines of a launch script), those in the
    same order in both are kept and only the stretches between them are compared; SequenceMatcher
    compares the stretches (one level deep: no input makes the recursion deeper). Two edits at a
    file's two ends then cost two small comparisons, not one of the whole file."""
    head = 0
    while head < len(a) and head < len(b) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < len(a) - head and tail < len(b) - head and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    a, b, at = a[head:len(a) - tail], b[head:len(b) - tail], at + head
    if not a or not b:
        if a or b:
            ops.append((at, at + len(a), b))
        return
    anchors = _unique_in_order(a, b) if anchor else []
    if not anchors:
        mid = difflib.SequenceMatcher(None, a, b, autojunk=False)
        ops += [(at + i1, at + i2, b[j1:j2]) for op, i1, i2, j1, j2 in mid.get_opcodes() if op != "equal"]
        return
    i0 = j0 = 0
    for i, j in [*anchors, (len(a), len(b))]:
        if i > i0 or j > j0:  # most anchors follow one another: nothing between them
            _line_ops(a[i0:i], b[j0:j], at + i0, ops, anchor=False)
        i0, j0 = i + 1, j + 1


def _unique_in_order(a: list[str], b: list[str]) -> list[tuple[int, int]]:
    """(i, j) with a[i] == b[j] occurring once in `a` and once in `b`: the longest run of such
    pairs increasing in both i and j (patience sorting)."""
    count_a: dict[str, int] = {}
    for x in a:
        count_a[x] = count_a.get(x, 0) + 1
    where_b: dict[str, int] = {}
    for j, x in enumerate(b):
        where_b[x] = -1 if x in where_b else j
    pairs = [(i, where_b[x]) for i, x in enumerate(a) if count_a[x] == 1 and where_b.get(x, -1) >= 0]
    if not pairs:
        return []
    # Longest increasing subsequence of the j's (pairs are in i order).
    tops: list[int] = []  # tops[k]: index in pairs of the smallest j ending a run of length k + 1
    top_j: list[int] = []  # and that j
    back: list[int] = []
    for n, (_, j) in enumerate(pairs):
        k = bisect.bisect_left(top_j, j)
        back.append(tops[k - 1] if k else -1)
        if k == len(tops):
            tops.append(n)
            top_j.append(j)
        else:
            tops[k], top_j[k] = n, j
    run, n = [], tops[-1]
    while n >= 0:
        run.append(pairs[n])
        n = back[n]
    return run[::-1]


def apply_ops(old: str, ops: list[tuple[int, int, list[str]]]) -> str:
    """What the page does with `text_ops` (app.js patchText)."""
    a, out, at = lines(old), [], 0
    for i, j, new in ops:
        out += a[at:i] + list(new)
        at = j
    return "".join(out + a[at:])


def _texts_patch(base_tag: str, base: Mapping[str, str], new_tag: str, new: Mapping[str, str]) -> bytes:
    def compute() -> bytes:
        texts = {name: text_ops(base.get(name, ""), text) for name, text in new.items()}
        return pydantic_core.to_json({"base": base_tag, "texts": texts})
    return _PATCHES.get((base_tag, new_tag), compute)


def encode_answer(content: Mapping[str, Any], held: Mapping[str, str] | None,
                  encode: Callable[[str, Any], bytes]) -> bytes:
    """The answer's JSON object: each part encoded by `encode(key, value)`, the parts whose tag is
    in `held` left out and named in `same`, a PATCHED part the page holds an older copy of sent
    as `patch`, and the tags of the tagged parts in `tags`."""
    held = held or {}
    parts: list[bytes] = []
    tags: dict[str, str] = {}
    same: list[str] = []
    patches: list[bytes] = []
    for key, value in content.items():
        data = encode(key, value)
        if key not in NEVER_LEFT_OUT and len(data) >= TAG_MIN:
            t = tag(data)
            if held.get(key) == t:
                same.append(key)
                continue
            tags[key] = t
            if key in PATCHED:
                _SENT_TEXTS.put(t, value)
                base = _SENT_TEXTS.peek(held[key]) if key in held else None
                if base is not None:
                    patches.append(pydantic_core.to_json(key) + b":" + _texts_patch(held[key], base, t, value))
                    continue
        parts.append(pydantic_core.to_json(key) + b":" + data)
    parts.append(b'"tags":' + pydantic_core.to_json(tags))
    parts.append(b'"same":' + pydantic_core.to_json(same))
    parts.append(b'"patch":{' + b",".join(patches) + b"}")
    return b"{" + b",".join(parts) + b"}"


def part_tags(content: Mapping[str, Any], encode: Callable[[str, Any], bytes]) -> dict[str, str]:
    """The tags a whole answer's parts would carry (the page's first answer, served inside the page)."""
    tags = {}
    for key, value in content.items():
        data = encode(key, value)
        if key not in NEVER_LEFT_OUT and len(data) >= TAG_MIN:
            tags[key] = tag(data)
    return tags
