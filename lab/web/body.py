"""The one body reader of the lab's HTTP API, and its error answers in the user's language.

Every POST route reads its body with `read_json(request, Model)`:

1. at most MAX_BODY_BYTES are read from the stream, however the body is sent (Content-Length or
   chunked), else 413;
2. `lab.core.safe_json.loads` refuses bad JSON, deep nesting, huge integers, NaN/Infinity and lone
   surrogates, naming the field or the position: 400;
3. pydantic validates the data into `Model`: 422, one entry per problem, each naming its field.

Every error is `{"detail": [{"loc": [...], "msg": ..., "type": ...}]}` with `msg` in the request's
language (`request_lang`: the page sends its language as Accept-Language).
"""
from __future__ import annotations

from typing import Any, Mapping, TypeVar

from fastapi import HTTPException, Request
from pydantic import BaseModel, ValidationError

from lab.core import messages
from lab.core.safe_json import JSONInputError, loads

MAX_BODY_BYTES = 1_000_000  # an experiment is a few KiB, a workspace with full history a few 100 KiB
# A run's metrics.jsonl (POST /api/run-metrics) is about 2 KB a step: room for some 15,000 steps.
RUN_METRICS_MAX_BYTES = 32_000_000
BODY_LIMITS = {"/api/run-metrics": RUN_METRICS_MAX_BYTES}  # routes whose bodies may exceed MAX_BODY_BYTES


def body_limit(path: str) -> int:
    """The body cap of a request path (the guard refuses a larger Content-Length up front)."""
    return BODY_LIMITS.get(path, MAX_BODY_BYTES)

M = TypeVar("M", bound=BaseModel)

def lang_of(accept_language: str) -> str:
    """The language of the answer's messages: the first tag of Accept-Language ('zh', 'zh-CN' → zh)."""
    return messages.normalize_lang(accept_language.split(",", 1)[0].split(";", 1)[0])


def request_lang(request: Request) -> str:
    return lang_of(request.headers.get("accept-language", ""))


def error(status: int, loc: list[Any], key: str, params: dict[str, Any], lang: str) -> HTTPException:
    return HTTPException(status_code=status,
                         detail=[{"loc": loc, "msg": messages.localize_text(key, params, lang), "type": key}])


def pydantic_message(err: Mapping[str, Any], lang: str) -> str:
    """One pydantic error as a message in `lang` (lab/core/messages.py names each type's text)."""
    t = messages.pydantic_text(err)
    return messages.localize_text(t.key, t.params, lang)


def validation_detail(exc: ValidationError, lang: str, prefix: tuple[Any, ...] = ("body",)) -> list[dict[str, Any]]:
    return [{"loc": [*prefix, *err["loc"]], "msg": pydantic_message(err, lang), "type": err["type"]}
            for err in exc.errors(include_url=False, include_input=False)]


async def read_bytes(request: Request, lang: str, limit: int = MAX_BODY_BYTES) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:  # stop reading: a chunked body has no Content-Length to refuse up front
            raise error(413, ["body"], "input.too_large", {"size": f">{limit}", "limit": limit}, lang)
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: Request, model: type[M], lang: str | None = None, limit: int = MAX_BODY_BYTES) -> M:
    """The body as `model` (413 / 400 / 422 as described above)."""
    lang = lang or request_lang(request)
    return parse_json(await read_bytes(request, lang, limit), model, lang)


def parse_json(raw: bytes | str, model: type[M], lang: str) -> M:
    """Read bytes as `model` (400 / 422 as described above): the body reader after the size cap, and
    the reader of a message on the workspace socket (lab/web/api_socket.py)."""
    try:
        data = loads(raw)
    except JSONInputError as exc:
        raise error(400, ["body", *exc.loc], exc.key, exc.params, lang) from None
    if isinstance(data, dict) and data.get("lang") in messages.LANGS:
        lang = data["lang"]  # the workspace request names its language in the body
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise HTTPException(status_code=422, detail=validation_detail(exc, lang)) from None
