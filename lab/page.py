"""GET /: the Quick Start page, rendered once from `lab/templates/index.html`.

The page is a view. Its controls are generated here from the Experiment model, keyed by the
pydantic field path (`data-field="placement.ownership"`), so that a new field appears on the
page (and fails the locale test until it is translated) without a hand-written mapping. English
text is rendered into the HTML from `lab/static/locales/en.json`; `app.js` swaps in another
locale on the client. No rule lives here or in the page's JavaScript: every value the page shows
comes back from `POST /api/workspace`.
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
import types
import typing
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from lab.experiment import PRIVATE_FIELDS, iter_field_paths
from lab.recipes import all_recipes

LAB_DIR = Path(__file__).resolve().parent
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
        from lab.images import all_images
    except ImportError:
        return {}
    return {tag: im.name for tag, im in all_images().items()}


@lru_cache(maxsize=1)
def field_specs() -> dict[str, dict[str, Any]]:
    return {path: field_spec(path, info) for path, info in iter_field_paths()}


def load_locale(lang: str) -> dict[str, Any]:
    return json.loads((LOCALES_DIR / f"{lang}.json").read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def _environment() -> Environment:
    return Environment(
        loader=FileSystemLoader(TEMPLATES_DIR),
        undefined=StrictUndefined,
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )


@lru_cache(maxsize=1)
def render_page() -> str:
    """The page HTML. Cached: it depends only on the model, the recipes and the locale files."""
    en = load_locale("en")
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

    from lab.doc_links import SEE, WHY, WHY_EXTRA
    from lab.load_json import MAX_BYTES

    html = _environment().get_template("index.html").render(field=field, t=t, fl=fl, opt=opt, load_max_bytes=MAX_BYTES,
                                                            why=WHY.get, why_extra=WHY_EXTRA, see_links=SEE)
    missing = set(specs) - used
    if missing:
        raise RuntimeError(f"the page draws no control for {sorted(missing)}")
    return html


def inline_script_hashes() -> list[str]:
    """CSP hashes ('sha256-…') of the page's inline scripts: the policy allows exactly these."""
    bodies = re.findall(r"<script>(.*?)</script>", render_page(), flags=re.DOTALL)
    return ["sha256-" + base64.b64encode(hashlib.sha256(b.encode("utf-8")).digest()).decode("ascii") for b in bodies]


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
def index() -> HTMLResponse:
    return HTMLResponse(render_page(), headers={"Cache-Control": "no-cache"})
