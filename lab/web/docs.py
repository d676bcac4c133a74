"""The documentation in docs/, served by the lab at /docs/<lang>/<page>.md, rendered on the server.

Markdown goes through markdown-it-py (CommonMark + tables, raw HTML off); TeX between `$…$`
(inline) and on `$$` lines (display) becomes MathML through latex2mathml, which Chromium draws
natively, so the page needs no JavaScript. Headings get ids from the English page: the Chinese
page keeps the English heading structure (tests/lab/test_docs.py), so its n-th heading takes the
English n-th heading's id and one link `corrections.md#tis` opens the same section in either
language. Links that leave docs/ (README.md, source files) are shown as text with their path:
the lab serves the docs, not the repository.
"""
from __future__ import annotations

import html
import re
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.rules_block import StateBlock
from markdown_it.rules_inline import StateInline

REPO = Path(__file__).resolve().parents[2]
DOCS_DIR = REPO / "docs"
LANGS = ("en", "zh")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def slug(text: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def heading_ids(markdown: str) -> list[str]:
    """The anchor of every heading outside fenced code, in order, de-duplicated the GitHub way."""
    ids: list[str] = []
    seen: dict[str, int] = {}
    fenced = False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else _HEADING.match(line)
        if m:
            base = slug(m.group(2)) or "section"
            n = seen.get(base, 0)
            seen[base] = n + 1
            ids.append(base if n == 0 else f"{base}-{n}")
    return ids


def _tex_to_mathml(tex: str, display: bool) -> str:
    from latex2mathml.converter import convert

    try:
        return convert(tex, display="block" if display else "inline")
    except Exception as exc:  # a formula the converter cannot read must not take the page down
        return f'<code class="tex-error" title="{html.escape(str(exc))}">{html.escape(tex)}</code>'


def _math_inline(state: StateInline, silent: bool) -> bool:
    src, start = state.src, state.pos
    if src[start] != "$" or src.startswith("$$", start):
        return False
    end = start + 1
    while True:
        end = src.find("$", end)
        if end < 0:
            return False
        if src[end - 1] != "\\":
            break
        end += 1
    body = src[start + 1 : end]
    # "$5 and $6" is money, not maths: a formula neither starts nor ends with a space
    if not body or body[0].isspace() or body[-1].isspace():
        return False
    if not silent:
        token = state.push("math_inline", "math", 0)
        token.content = body
        token.markup = "$"
    state.pos = end + 1
    return True


def _math_block(state: StateBlock, start_line: int, end_line: int, silent: bool) -> bool:
    begin = state.bMarks[start_line] + state.tShift[start_line]
    first = state.src[begin : state.eMarks[start_line]].strip()
    if not first.startswith("$$"):
        return False
    if silent:
        return True
    rest = first[2:]
    lines: list[str] = []
    line = start_line
    if rest.endswith("$$") and len(rest) >= 2:
        lines.append(rest[:-2])
    else:
        lines.append(rest)
        line += 1
        while line < end_line:
            text = state.src[state.bMarks[line] + state.tShift[line] : state.eMarks[line]]
            if text.rstrip().endswith("$$"):
                lines.append(text.rstrip()[:-2])
                break
            lines.append(text)
            line += 1
    state.line = line + 1
    token = state.push("math_block", "math", 0)
    token.block = True
    token.content = "\n".join(lines).strip()
    token.map = [start_line, state.line]
    return True


@lru_cache(maxsize=1)
def _markdown() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False}).enable("table")
    md.inline.ruler.before("escape", "math_inline", _math_inline)
    md.block.ruler.before("fence", "math_block", _math_block, {"alt": ["paragraph", "reference", "blockquote", "list"]})
    md.add_render_rule("math_inline", lambda self, tokens, idx, options, env: _tex_to_mathml(tokens[idx].content, False))
    md.add_render_rule("math_block", lambda self, tokens, idx, options, env: _tex_to_mathml(tokens[idx].content, True) + "\n")
    return md


def pages(lang: str = "en") -> list[str]:
    return sorted(p.name for p in (DOCS_DIR / lang).glob("*.md"))


def resolve_link(page: PurePosixPath, href: str) -> str | None:
    """The served URL of a relative link from docs page `page` (docs-relative), or None when it
    leaves docs/ or names no file."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", href) or href.startswith("#"):
        return href
    file_part, _, anchor = href.partition("#")
    parts: list[str] = []
    for part in (page.parent / file_part).parts:
        if part == "..":
            if not parts:
                return None
            parts.pop()
        elif part not in (".", ""):
            parts.append(part)
    target = PurePosixPath(*parts) if parts else None
    if target is None or not (DOCS_DIR / target).is_file():
        return None
    return "/docs/" + str(target) + (f"#{anchor}" if anchor else "")


def _rewrite(tokens: list[Any], page: PurePosixPath, ids: list[str]) -> None:
    n = 0
    for tok in tokens:
        if tok.type == "heading_open":
            if n < len(ids):
                tok.attrSet("id", ids[n])
            n += 1
        if tok.type == "inline" and tok.children:
            for child in tok.children:
                if child.type == "link_open":
                    href = str(child.attrGet("href") or "")
                    url = resolve_link(page, href)
                    if url is None:
                        child.attrs.pop("href", None)
                        child.attrSet("class", "repo-path")
                        child.attrSet("title", href)
                    else:
                        child.attrSet("href", url)
                elif child.type == "image":
                    child.attrs.pop("src", None)


def page_path(rel: str) -> Path | None:
    """docs-relative path → the file, or None when it is not a docs page (no escaping docs/)."""
    if not rel.endswith(".md") or "\\" in rel:
        return None
    parts = PurePosixPath(rel).parts
    if any(p in ("..", ".") or p.startswith(".") for p in parts):
        return None
    path = DOCS_DIR.joinpath(*parts)
    return path if path.is_file() else None


def render_markdown(rel: str) -> tuple[str, str]:
    """(title, body HTML) of docs page `rel` (e.g. "zh/corrections.md")."""
    path = page_path(rel)
    if path is None:
        raise FileNotFoundError(rel)
    return _render_cached(rel, path.stat().st_mtime_ns)


@lru_cache(maxsize=128)
def _render_cached(rel: str, _mtime_ns: int) -> tuple[str, str]:
    path = page_path(rel)
    assert path is not None
    text = path.read_text(encoding="utf-8")
    parts = PurePosixPath(rel).parts
    ids = heading_ids(text)
    if len(parts) == 2 and parts[0] != "en" and (DOCS_DIR / "en" / parts[1]).is_file():
        english = heading_ids((DOCS_DIR / "en" / parts[1]).read_text(encoding="utf-8"))
        if len(english) == len(ids):
            ids = english
    md = _markdown()
    env: dict[str, Any] = {}
    tokens = md.parse(text, env)
    _rewrite(tokens, PurePosixPath(rel), ids)
    title = next((m.group(2) for line in text.splitlines() if (m := _HEADING.match(line))), rel)
    return title, md.renderer.render(tokens, md.options, env)


def section_ids(rel: str) -> set[str]:
    """The anchors a link into docs page `rel` may name (the ids the rendered page carries)."""
    path = page_path(rel)
    if path is None:
        return set()
    _, body = render_markdown(rel)
    return set(re.findall(r'<h[1-6] id="([^"]+)"', body))
