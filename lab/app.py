"""The FastAPI app: wiring only. Rules live in lab/rules.py; routes in lab/api*.py."""
from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles

from lab import api, api_workspace, docs_route, page

STATIC_DIR = Path(__file__).resolve().parent / "static"
MAX_BODY_BYTES = 1_000_000  # an experiment is a few KiB; anything near this is a mistake or abuse


def create_app() -> FastAPI:
    app = FastAPI(title="slime Quick Start lab", docs_url=None, redoc_url=None)

    @app.middleware("http")
    async def limit_body(request: Request, call_next):  # type: ignore[no-untyped-def]
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
            return JSONResponse(
                status_code=413,
                content={"detail": [{"loc": ["body"], "msg": f"request body is larger than {MAX_BODY_BYTES} bytes"}]},
            )
        return await call_next(request)

    app.include_router(api.router)
    app.include_router(api_workspace.router)
    app.include_router(page.router)
    app.include_router(docs_route.router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app
