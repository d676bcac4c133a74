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


def text_ops(old: str, new: str) -> list[tuple[int, int, list[str]]]:
    """[(i, j, lines)]: the old text's lines [i, j) give way to `lines`, in order; the rest stay."""
    a, b = lines(old), lines(new)
    # The common head and tail first: SequenceMatcher then compares only the lines in between.
    head = 0
    while head < min(len(a), len(b)) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < min(len(a), len(b)) - head and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    mid = difflib.SequenceMatcher(None, a[head:len(a) - tail], b[head:len(b) - tail], autojunk=False)
    return [(head + i1, head + i2, b[head + j1:head + j2]) for op, i1, i2, j1, j2 in mid.get_opcodes() if op != "equal"]


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
