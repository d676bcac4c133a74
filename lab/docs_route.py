"""GET /docs/<lang>/<page>.md: a docs page as HTML (lab/docs.py renders it), linked from the page's
"why & math" and "See …" links. /docs/ and /docs/<lang>/ open the language's index."""
from __future__ import annotations

from functools import lru_cache

from fastapi import APIRouter, HTTPException
from fastapi.responses import HTMLResponse, RedirectResponse
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from lab.docs import LANGS, page_path, render_markdown
from lab.page import TEMPLATES_DIR

router = APIRouter()


@lru_cache(maxsize=1)
def _environment() -> Environment:
    return Environment(loader=FileSystemLoader(TEMPLATES_DIR), undefined=StrictUndefined,
                       autoescape=select_autoescape(["html"]))


def render_doc(rel: str) -> str:
    title, body = render_markdown(rel)
    parts = rel.split("/")
    lang = parts[0] if len(parts) == 2 and parts[0] in LANGS else "en"
    other = None
    if len(parts) == 2 and lang in LANGS:
        alt = ("zh" if lang == "en" else "en") + "/" + parts[1]
        other = "/docs/" + alt if page_path(alt) else None
    return _environment().get_template("doc.html").render(
        title=title, body=Markup(body), lang=lang, other=other, index=f"/docs/{lang}/index.md")


@router.get("/docs", include_in_schema=False)
@router.get("/docs/", include_in_schema=False)
def docs_root() -> RedirectResponse:
    return RedirectResponse("/docs/en/index.md")


@router.get("/docs/{lang}/", include_in_schema=False)
def docs_lang(lang: str) -> RedirectResponse:
    if lang not in LANGS:
        raise HTTPException(404, f"no docs in {lang!r}; known: {', '.join(LANGS)}")
    return RedirectResponse(f"/docs/{lang}/index.md")


@router.get("/docs/{rel:path}", response_class=HTMLResponse, include_in_schema=False)
def docs_page(rel: str) -> HTMLResponse:
    if page_path(rel) is None:
        raise HTTPException(404, f"no docs page {rel!r}; the index is /docs/en/index.md")
    return HTMLResponse(render_doc(rel), headers={"Cache-Control": "no-cache"})
