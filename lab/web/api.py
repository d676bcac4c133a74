"""HTTP API of the lab (thin: every answer comes from lab.rules, lab.render, lab.core.share, lab.core.images).

GET  /api/recipes       the models, in the picker's order
GET  /api/schema        the experiment's JSON schema (private fields marked x-private)
GET  /api/images        the known installation images
POST /api/validate      {"experiment": {...}} -> {"findings": [...], "derived": {...}}
POST /api/render        {"experiment": {...}} -> {"files": {name: content}}  (== render_all, byte for byte)
POST /api/share         {"experiment": {...}} -> {"link": "..."}
POST /api/share/open    {"link": "..."}       -> {"choices": {...}}

Bad input is a 4xx with field-level messages: {"detail": [{"loc": [...], "msg": ...}, ...]}.
Every body is read by lab/web/body.py: a byte cap that holds for chunked bodies too (413), a strict
JSON reader (400 naming the position or field), then the model (422), messages in the request's
language (Accept-Language).
"""
from __future__ import annotations

from typing import Any, TypeVar

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from lab.core.experiment import Experiment, experiment_schema
from lab.web.body import MAX_BODY_BYTES, read_json, request_lang
from lab.web.body import error as body_error

__all__ = ["MAX_BODY_BYTES", "read_body", "router"]

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
    """The one body reader (lab/web/body.py): 413 beyond the cap, 400 for bad JSON, 422 for bad fields."""
    return await read_json(request, model)


def known_recipe(name: str, loc: list[Any], lang: str) -> None:
    """422 naming `loc` when `name` is not a recipe (rendering, deriving and drawing need one)."""
    from lab.core.recipes import all_recipes

    recipes = all_recipes()
    if name not in recipes:
        raise body_error(422, loc, "input.unknown_recipe", {"name": name, "choices": ", ".join(recipes)}, lang)


def _known_recipe(exp: Experiment, request: Request) -> None:
    known_recipe(exp.model.recipe, ["body", "experiment", "model", "recipe"], request_lang(request))


@router.get("/recipes")
def recipes() -> list[dict[str, Any]]:
    from lab.core.recipes import all_recipes

    return [r.model_dump(mode="json") for r in all_recipes().values()]


@router.get("/schema")
def schema() -> dict[str, Any]:
    return experiment_schema()


@router.get("/images")
def images() -> list[dict[str, Any]]:
    from lab.core.images import all_images

    return [im.model_dump(mode="json") for im in all_images().values()]


@router.post("/validate", response_model=ValidateResponse)
async def validate(request: Request) -> ValidateResponse:
    from lab.rules.derive import derive
    from lab.rules.validate import validate as validate_experiment

    body = await read_body(request, ExperimentRequest)
    _known_recipe(body.experiment, request)
    findings = validate_experiment(body.experiment)
    derived = derive(body.experiment)
    return ValidateResponse(findings=[f.model_dump(mode="json") for f in findings],
                            derived=derived.model_dump(mode="json"))


@router.post("/render", response_model=RenderResponse)
async def render(request: Request) -> RenderResponse:
    from lab.web.export import experiment_files

    body = await read_body(request, ExperimentRequest)
    _known_recipe(body.experiment, request)
    return RenderResponse(files=experiment_files(body.experiment))


@router.post("/share", response_model=ShareResponse)
async def share(request: Request) -> ShareResponse:
    from lab.core import share as share_mod

    body = await read_body(request, ExperimentRequest)
    return ShareResponse(link=share_mod.encode_link(body.experiment))


@router.post("/share/open", response_model=OpenResponse)
async def share_open(request: Request) -> OpenResponse:
    from lab.core.share import ShareError
    from lab.rules.open_share import checked_choices

    body = await read_body(request, LinkRequest)
    try:
        sides = checked_choices(body.link)
    except ShareError as exc:  # the message names what is wrong with the link, in the request's language
        if exc.key:
            raise body_error(400, ["body", "link"], exc.key, exc.params, request_lang(request)) from None
        raise _error(400, ["body", "link"], str(exc)) from None
    choices = sides.get("choices", sides)
    return OpenResponse(choices=choices)
