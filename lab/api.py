"""HTTP API of the lab (thin: every answer comes from lab.rules, lab.render, lab.share, lab.images).

GET  /api/recipes       the models, in the picker's order
GET  /api/schema        the experiment's JSON schema (private fields marked x-private)
GET  /api/images        the known installation images
POST /api/validate      {"experiment": {...}} -> {"findings": [...], "derived": {...}}
POST /api/render        {"experiment": {...}} -> {"files": {name: content}}  (== render_all, byte for byte)
POST /api/share         {"experiment": {...}} -> {"link": "..."}
POST /api/share/open    {"link": "..."}       -> {"choices": {...}}

Bad input is a 4xx with field-level messages: {"detail": [{"loc": [...], "msg": ...}, ...]}.
Bodies are read with a byte cap, so a chunked body (no Content-Length, which the app's
middleware checks) cannot grow past the limit either: 413.
"""
from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi import APIRouter, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lab.experiment import Experiment, experiment_schema

MAX_BODY_BYTES = 1_000_000  # the same cap as lab/app.py's middleware

router = APIRouter(prefix="/api", tags=["lab"])
M = TypeVar("M", bound=BaseModel)


class ExperimentRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    experiment: Experiment = Field(description="The full experiment (private fields included).")


class LinkRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    link: str = Field(min_length=1, max_length=100_000, description="A share link or its fragment.")


class ValidateResponse(BaseModel):
    findings: list[dict[str, Any]]
    derived: dict[str, Any]


class RenderResponse(BaseModel):
    files: dict[str, str]


class ShareResponse(BaseModel):
    link: str


class OpenResponse(BaseModel):
    choices: dict[str, Any]


def _error(status: int, loc: list[Any], msg: str) -> HTTPException:
    return HTTPException(status_code=status, detail=[{"loc": loc, "msg": msg}])


async def read_body(request: Request, model: type[M]) -> M:
    """Read at most MAX_BODY_BYTES (413 beyond), parse JSON (400), validate into `model` (422)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _error(413, ["body"], f"request body is larger than {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        where = f" at line {exc.lineno}, column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise _error(400, ["body"], f"not valid JSON{where}: {getattr(exc, 'msg', exc)}") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = [{"loc": ["body", *err["loc"]], "msg": err["msg"], "type": err["type"]} for err in exc.errors()]
        raise RequestValidationError(errors) from None


def _known_recipe(exp: Experiment) -> None:
    from lab.recipes import RecipeError, get_recipe

    try:
        get_recipe(exp.model.recipe)
    except RecipeError as exc:
        raise _error(422, ["body", "experiment", "model", "recipe"], str(exc)) from None


@router.get("/recipes")
def recipes() -> list[dict[str, Any]]:
    from lab.recipes import all_recipes

    return [r.model_dump(mode="json") for r in all_recipes().values()]


@router.get("/schema")
def schema() -> dict[str, Any]:
    return experiment_schema()


@router.get("/images")
def images() -> list[dict[str, Any]]:
    from lab.images import all_images

    return [im.model_dump(mode="json") for im in all_images().values()]


@router.post("/validate", response_model=ValidateResponse)
async def validate(request: Request) -> ValidateResponse:
    from lab import rules

    body = await read_body(request, ExperimentRequest)
    _known_recipe(body.experiment)
    findings = rules.validate(body.experiment)
    derived = rules.derive(body.experiment)
    return ValidateResponse(findings=[f.model_dump(mode="json") for f in findings],
                            derived=derived.model_dump(mode="json"))


@router.post("/render", response_model=RenderResponse)
async def render(request: Request) -> RenderResponse:
    from lab.render import render_all

    body = await read_body(request, ExperimentRequest)
    _known_recipe(body.experiment)
    return RenderResponse(files=render_all(body.experiment))


@router.post("/share", response_model=ShareResponse)
async def share(request: Request) -> ShareResponse:
    body = await read_body(request, ExperimentRequest)
    try:
        from lab import share as share_mod
    except ImportError:
        raise _error(501, ["body"], "sharing is not available in this build (lab/share.py is missing)") from None
    return ShareResponse(link=share_mod.encode_link(body.experiment))


@router.post("/share/open", response_model=OpenResponse)
async def share_open(request: Request) -> OpenResponse:
    body = await read_body(request, LinkRequest)
    try:
        from lab import share as share_mod
    except ImportError:
        raise _error(501, ["body"], "sharing is not available in this build (lab/share.py is missing)") from None
    try:
        choices = share_mod.decode_link(body.link)
    except Exception as exc:  # the message names what is wrong with the link
        raise _error(400, ["body", "link"], str(exc)) from None
    if hasattr(choices, "model_dump"):
        choices = choices.model_dump(mode="json")
    return OpenResponse(choices=choices)
