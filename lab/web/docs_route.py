"""GET /docs/<lang>/<page>.md: a docs page as HTML (lab/web/docs.py renders it), linked from the page's
"why & math" and "See …" links. /docs/ and /docs/<lang>/ open the language's index."""
from __future__ import annotations

from functools import lru_cache

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, RedirectResponse
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from markupsafe import Markup, escape

from lab.core.messages import localize_text
from lab.web.docs import LANGS, page_path, render_markdown
from lab.web.page import TEMPLATES_DIR

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


def _not_found(lang: str, key: str, /, **params: str) -> HTMLResponse:
    """A docs page's 404 in the language of the path (a reader followed a link: HTML, not JSON)."""
    text = localize_text(key, {**params, "index": f"/docs/{lang}/index.md"}, lang)
    page = _environment().get_template("doc.html").render(
        title="404", body=Markup(f"<p>{escape(text)}</p>"), lang=lang, other=None, index=f"/docs/{lang}/index.md")
    return HTMLResponse(page, status_code=404)


@router.get("/docs/{lang}/", include_in_schema=False, response_model=None)
def docs_lang(lang: str) -> RedirectResponse | HTMLResponse:
    if lang not in LANGS:
        return _not_found("en", "docs.no_lang", lang=lang, known=", ".join(LANGS))
    return RedirectResponse(f"/docs/{lang}/index.md")


@router.get("/docs/{rel:path}", response_class=HTMLResponse, include_in_schema=False)
def docs_page(rel: str) -> HTMLResponse:
    if page_path(rel) is None:
        first = rel.split("/", 1)[0]
        return _not_found(first if first in LANGS else "en", "docs.no_page", page=rel)
    return HTMLResponse(render_doc(rel), headers={"Cache-Control": "no-cache"})
