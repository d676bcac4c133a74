"""The FastAPI app: wiring only. Rules live in lab/rules/; routes in lab/web/api*.py; what every
request must pass (host, origin, content type, size) and every answer carries (CSP, frame and
sniffing headers) in lab/web/guard.py; the one body reader in lab/web/body.py."""
from __future__ import annotations

from collections.abc import Iterable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from lab.core import messages
from lab.web import api, api_runs, api_socket, api_workspace, docs_route, guard, page
from lab.web.body import MAX_BODY_BYTES, request_lang
from lab.web.static_files import StaticFiles

__all__ = ["MAX_BODY_BYTES", "create_app"]


APP_SETTINGS_ENV = "SLIME_LAB_APP_SETTINGS"  # `serve --workers N`: the settings every process builds its app from


def app_from_env() -> FastAPI:
    """The app of one server process of `slime-lab serve --workers N` (uvicorn imports this factory
    in each process; the settings come from the command line through the environment)."""
    import json
    import os

    settings = json.loads(os.environ[APP_SETTINGS_ENV])
    return create_app(host=settings["host"], allow_hosts=settings["allow_hosts"], openapi=settings["openapi"])


def create_app(host: str = "127.0.0.1", allow_hosts: Iterable[str] = (), openapi: bool = False) -> FastAPI:
    """The lab. `host`: the address it is bound to; `allow_hosts`: further host names requests may
    name (a reverse proxy's); `openapi`: serve /openapi.json (off: the lab's API is for its page)."""
    app = FastAPI(title="slime Quick Start lab", docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json" if openapi else None)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        # A bug must still answer JSON the page can show, never a text body it cannot parse.
        msg = messages.localize_text("input.internal", {"error": type(exc).__name__}, request_lang(request))
        return JSONResponse(status_code=500, content={"detail": [{"loc": [], "msg": msg, "type": "input.internal"}]})

    app.include_router(api_workspace.router)  # first: nearly every request is an edit, matched by the first route tried
    app.include_router(api_socket.router)
    app.include_router(api.router)
    app.include_router(api_runs.router)
    app.include_router(page.router)
    app.include_router(docs_route.router)
    app.mount("/static", StaticFiles(), name="static")  # from memory, gzipped, ETag (lab/web/static_files.py)
    csp = guard.content_security_policy(page.inline_script_hashes())
    app.add_middleware(guard.Guard, hosts=guard.allowed_hosts(host, allow_hosts), csp=csp)
    return app
