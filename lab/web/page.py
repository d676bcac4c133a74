"""GET /: the Quick Start page, rendered once from `lab/templates/index.html`.

The page is a view. Its controls are generated here from the Experiment model, keyed by the
pydantic field path (`data-field="placement.ownership"`), so that a new field appears on the
page (and fails the locale test until it is translated) without a hand-written mapping. No rule
lives here or in the page's JavaScript: every value the page shows comes back from
`POST /api/workspace`.

Texts: `page_locale(lang)` is `lab/static/locales/<lang>.json` with, for English, each field's help
taken from the field's own description in lab/core/experiment.py (one source: en.json holds no copy).
English is rendered into the HTML; GET /locales/<lang>.json serves a locale to `app.js`.

First load: the page carries what its first draw needs for a visitor without a stored workspace,
as JSON data blocks (not scripts, so the CSP has nothing to allow): the English locale and the
API's answer to `view` for a fresh workspace. The page then draws without a request. A visitor
with a stored workspace, another language or a share link asks the API as before. The controls
come set to that answer's values. The document holds only the first screen (the intro and step 1):
steps 2-6 are a fragment of their own (GET /later-steps.html, `lab/templates/later_steps.html`,
rendered from the same context and cached the same way) that the page's boot script fetches at
once and app.js inserts when the first screen is drawn, so the browser parses, lays out and paints
only what a first visit sees before it shows it (docs/benchmarks.md, "One step faster").
"""
from __future__ import annotations

import base64
import gzip
import hashlib
import json
import re
import types
import typing
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, Response
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from lab.core.experiment import PRIVATE_FIELDS, iter_field_paths
from lab.core.recipes import all_recipes

LAB_DIR = Path(__file__).resolve().parents[1]
TEMPLATES_DIR = LAB_DIR / "templates"
LOCALES_DIR = LAB_DIR / "static" / "locales"

router = APIRouter()


def _unwrap_optional(ann: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(ann)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return ann, False


def field_spec(path: str, info: Any) -> dict[str, Any]:
    """How to draw one field: kind (select/bool/int/float/text/list), options, bounds, flags."""
    ann, nullable = _unwrap_optional(info.annotation)
    spec: dict[str, Any] = {"path": path, "nullable": nullable, "private": path in PRIVATE_FIELDS,
                            "options": [], "min": None, "max": None}
    for m in info.metadata:
        for attr, key in (("ge", "min"), ("gt", "min"), ("le", "max"), ("lt", "max")):
            if getattr(m, attr, None) is not None:
                spec[key] = getattr(m, attr)
    if typing.get_origin(ann) is Literal:
        spec["kind"] = "select"
        spec["options"] = [str(v) for v in typing.get_args(ann)]
    elif ann is bool:
        spec["kind"] = "bool"
    elif ann is int:
        spec["kind"] = "int"
    elif ann is float:
        spec["kind"] = "float"
    elif typing.get_origin(ann) is list:
        spec["kind"] = "list"
    else:
        spec["kind"] = "text"
    if path == "model.recipe":
        spec["kind"] = "select"
        spec["options"] = list(all_recipes())
    elif path == "install.image" and _image_names():
        spec["kind"] = "select"
        spec["options"] = list(_image_names())
    return spec


@lru_cache(maxsize=1)
def _image_names() -> dict[str, str]:
    """Known installation images (docker/images.yaml): tag → the name the selector shows."""
    try:
        from lab.core.images import all_images
    except ImportError:
        return {}
    return {tag: im.name for tag, im in all_images().items()}


@lru_cache(maxsize=1)
def field_specs() -> dict[str, dict[str, Any]]:
    return {path: field_spec(path, info) for path, info in iter_field_paths()}


LOCALE_LANGS = ("en", "zh")


def load_locale(lang: str) -> dict[str, Any]:
    """The locale file as written (English field help lives in the field descriptions instead)."""
    return json.loads((LOCALES_DIR / f"{lang}.json").read_text(encoding="utf-8"))


@lru_cache(maxsize=len(LOCALE_LANGS))
def page_locale(lang: str) -> dict[str, Any]:
    """The page's texts in `lang`; English field help is the field's description (lab/core/experiment.py)."""
    loc = load_locale(lang)
    if lang == "en":
        for path, info in iter_field_paths():
            entry = loc["fields"].setdefault(path, {})
            if "help" in entry:
                raise RuntimeError(f"en.json repeats the help of {path}: it is the field's description in lab/core/experiment.py")
            entry["help"] = info.description
    return loc


def _json_block(data: Any) -> Markup:
    """JSON for a `<script type="application/json">` block: `<` escaped so no text can close the block."""
    return Markup(json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c"))


def boot_view() -> dict[str, Any] | None:
    """The API's answer to `view` for a fresh workspace in English: what a first visit draws, with
    the tags of its parts, so that the first click already leaves out what the page holds.

    None when it cannot be computed: the page then asks the API, which reports the error itself."""
    from lab.rules.edit import fresh_workspace
    from lab.web.answer_parts import part_tags
    from lab.web.workspace_view import to_json, view

    try:
        first = view(fresh_workspace())
        return {**first, "tags": part_tags(first, lambda _key, value: to_json(value))}
    except Exception:  # noqa: BLE001 - the page must still be served; its first request shows the error
        return None


@lru_cache(maxsize=1)
def _environment() -> Environment:
    return Environment(
        loader=FileSystemLoader(TEMPLATES_DIR),
        undefined=StrictUndefined,
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render_page() -> str:
    """The page HTML (the intro and step 1). Cached: it depends only on the model, the recipes, the
    locale files and the fresh workspace's answer (whose provenance is the checkout as the server first saw it)."""
    return _render_parts()[0]


def render_later_steps() -> str:
    """Steps 2-6: the fragment app.js inserts after the first screen (same context, same cache)."""
    return _render_parts()[1]


@lru_cache(maxsize=1)
def _render_parts() -> tuple[str, str]:
    """The page and its later steps, rendered together: between them they draw every field once."""
    en = page_locale("en")
    recipes = {name: r.display_name for name, r in all_recipes().items()}
    images = _image_names()
    specs = field_specs()
    used: set[str] = set()

    def field(path: str) -> dict[str, Any]:
        if path not in specs:
            raise KeyError(f"the template names an unknown field {path!r}")
        used.add(path)
        return specs[path]

    def t(key: str) -> str:
        if key not in en["ui"]:
            raise KeyError(f"en.json has no ui key {key!r}")
        return en["ui"][key]

    def fl(path: str, part: str = "label") -> str:
        return en["fields"][path][part]

    def opt(path: str, value: str) -> str:
        if path == "model.recipe":
            return recipes[value]
        if path == "install.image":
            return images[value]
        # A choice the runtime's registry gained since the locale was written shows its own name.
        return en["fields"][path].get("options", {}).get(value, value)

    first = boot_view()
    from lab.core.load_json import MAX_BYTES
    from lab.web.doc_links import SEE, WHY, WHY_EXTRA

    def shown(path: str) -> str | None:
        """The control's value for the first answer, as app.js writes it (`String(v)`), so that its
        first draw finds every control already set: setting a <select> costs the first load
        milliseconds each. None: leave the control as the browser makes it (app.js sets it)."""
        node: Any = first["workspace"]["b"] if first else None
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is None or isinstance(node, (dict, bool)):
            return None
        if isinstance(node, list):
            return ", ".join(str(x) for x in node)
        if isinstance(node, float):
            return str(int(node)) if node.is_integer() else repr(node)
        return str(node)

    def checked(path: str) -> bool:
        node: Any = first["workspace"]["b"] if first else None
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node is True

    context = dict(field=field, t=t, fl=fl, opt=opt, load_max_bytes=MAX_BYTES, shown=shown, checked=checked,
                   why=WHY.get, why_extra=WHY_EXTRA, see_links=SEE,
                   boot_locale=_json_block(en), boot_view=_json_block(first) if first else None)
    html = _environment().get_template("index.html").render(**context)
    later = _environment().get_template("later_steps.html").render(**context)
    missing = set(specs) - used
    if missing:
        raise RuntimeError(f"the page draws no control for {sorted(missing)}")
    return html, later


def inline_script_hashes() -> list[str]:
    """CSP hashes ('sha256-…') of the page's inline scripts: the policy allows exactly these."""
    bodies = re.findall(r"<script>(.*?)</script>", render_page(), flags=re.DOTALL)
    return ["sha256-" + base64.b64encode(hashlib.sha256(b.encode("utf-8")).digest()).decode("ascii") for b in bodies]


@lru_cache(maxsize=1)
def _page_bytes() -> tuple[bytes, bytes, str]:
    """The page as UTF-8, gzipped once (it is cached, so compressing per request would be waste), and its ETag."""
    body = render_page().encode("utf-8")
    return body, gzip.compress(body, compresslevel=6, mtime=0), '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


def _cached(request: Request, body: bytes, zipped: bytes | None, etag: str, media_type: str) -> Response:
    """`body` revalidated by ETag (304 when the browser has it) and gzipped when the browser accepts it."""
    headers = {"Cache-Control": "no-cache", "ETag": etag, "Vary": "Accept-Encoding"}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    if zipped is not None and "gzip" in request.headers.get("accept-encoding", ""):
        return Response(zipped, media_type=media_type, headers={**headers, "Content-Encoding": "gzip"})
    return Response(body, media_type=media_type, headers=headers)


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
def index(request: Request) -> Response:
    body, zipped, etag = _page_bytes()
    return _cached(request, body, zipped, etag, "text/html; charset=utf-8")


@lru_cache(maxsize=1)
def _later_steps_bytes() -> tuple[bytes, bytes, str]:
    body = render_later_steps().encode("utf-8")
    return body, gzip.compress(body, compresslevel=6, mtime=0), '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


@router.get("/later-steps.html", response_class=HTMLResponse, include_in_schema=False)
def later_steps(request: Request) -> Response:
    """Steps 2-6 of the page (a fragment, not a document), revalidated by ETag as the page is."""
    body, zipped, etag = _later_steps_bytes()
    return _cached(request, body, zipped, etag, "text/html; charset=utf-8")


@lru_cache(maxsize=len(LOCALE_LANGS))
def _locale_bytes(lang: str) -> tuple[bytes, bytes, str]:
    body = json.dumps(page_locale(lang), ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return body, gzip.compress(body, compresslevel=6, mtime=0), '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


@router.get("/locales/{lang}.json", include_in_schema=False)
def locale(lang: str, request: Request) -> Response:
    if lang not in LOCALE_LANGS:
        raise HTTPException(status_code=404)
    body, zipped, etag = _locale_bytes(lang)
    return _cached(request, body, zipped, etag, "application/json")
