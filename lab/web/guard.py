"""What every request passes before a route sees it, and what every answer carries.

- Host: only the address the lab is bound to (127.0.0.1, localhost, ::1, `--host`) and the names
  given with `--allow-host`. A DNS-rebinding page reaches the lab under its own host name, which is
  refused here (400), so it cannot drive the lab even though its requests arrive on loopback.
- Origin: a request that carries an Origin must come from the lab's own page (403).
- WebSocket handshakes (the workspace socket, lab/web/api_socket.py): the same Host and Origin
  checks; a refused handshake is closed before it is accepted (the client sees 403).
- POST bodies must be `application/json` (415): a cross-site form or `text/plain` fetch cannot be
  sent as JSON without a CORS preflight, which the lab never grants.
- Content-Length above the route's cap (lab/web/body.py `body_limit`: 1 MB; more for a run's metrics file)
  is refused before reading (413); chunked bodies are capped by the body reader (lab/web/body.py) as they stream.
- Every answer carries a Content-Security-Policy (the page's own origin only), X-Frame-Options: DENY,
  X-Content-Type-Options: nosniff and Referrer-Policy: no-referrer.

A pure ASGI middleware: it adds no task or thread per request (BaseHTTPMiddleware would).
"""
from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from lab.core import messages
from lab.web.body import body_limit, lang_of

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

Scope = MutableMapping[str, Any]  # as starlette.types names them, so an app of ours mounts there
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def content_security_policy(script_hashes: Iterable[str] = ()) -> str:
    scripts = " ".join(["'self'", *(f"'{h}'" for h in script_hashes)])
    return ("default-src 'self'; "
            f"script-src {scripts}; "
            "style-src 'self'; img-src 'self' data:; connect-src 'self'; font-src 'self'; "
            "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


def allowed_hosts(bound: str = "127.0.0.1", extra: Iterable[str] = ()) -> frozenset[str]:
    """The host names requests may carry: loopback names, the bound address, and `--allow-host` names."""
    names = set(LOOPBACK_HOSTS) | {h.strip().lower().strip("[]") for h in extra if h.strip()}
    if bound not in WILDCARD_HOSTS:
        names.add(bound.lower().strip("[]"))
    return frozenset(names)


def host_name(header: str) -> str:
    """'127.0.0.1:8765' -> '127.0.0.1', '[::1]:80' -> '::1', 'Example.COM' -> 'example.com'."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    if header.count(":") == 1:
        return header.split(":", 1)[0]
    return header


def _lang(headers: dict[bytes, bytes]) -> str:
    return lang_of(headers.get(b"accept-language", b"").decode("latin-1"))


class Guard:
    def __init__(self, app: Any, hosts: frozenset[str], csp: str) -> None:
        self.app = app
        self.hosts = hosts
        self.security_headers = [
            (b"content-security-policy", csp.encode()),
            (b"x-frame-options", b"DENY"),
            (b"x-content-type-options", b"nosniff"),
            (b"referrer-policy", b"no-referrer"),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            # The handshake is an HTTP request: its Host and Origin are checked as any request's.
            # A browser always sends Origin on a WebSocket, and none is bound by CORS: without
            # this check any site could drive the lab through the visitor's browser.
            if self._host_origin_refusal(dict(scope["headers"])) is not None:
                await receive()  # websocket.connect
                await send({"type": "websocket.close", "code": 1008})  # the server answers 403
                return
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            status, key, params = refusal
            await self._answer(send, status, key, params, _lang(headers))
            return

        async def send_secure(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.security_headers]}
            await send(message)

        await self.app(scope, receive, send_secure)

    def _host_origin_refusal(self, headers: dict[bytes, bytes]) -> tuple[int, str, dict[str, Any]] | None:
        host = host_name(headers.get(b"host", b"").decode("latin-1"))
        if host not in self.hosts:
            return 400, "input.host", {"host": host}
        origin = headers.get(b"origin")
        if origin is not None:
            text = origin.decode("latin-1")
            if host_name(urlsplit(text).netloc) not in self.hosts:
                return 403, "input.origin", {"origin": text}
        return None

    def _refusal(self, scope: Scope, headers: dict[bytes, bytes]) -> tuple[int, str, dict[str, Any]] | None:
        refusal = self._host_origin_refusal(headers)
        if refusal is not None:
            return refusal
        if scope["method"] in BODY_METHODS:
            ctype = headers.get(b"content-type", b"").decode("latin-1").split(";", 1)[0].strip().lower()
            if ctype != "application/json":
                return 415, "input.content_type", {"got": ctype or "no Content-Type"}
            length = headers.get(b"content-length", b"").decode("latin-1")
            limit = body_limit(scope["path"])
            if length.isdigit() and int(length) > limit:
                return 413, "input.too_large", {"size": int(length), "limit": limit}
        return None

    async def _answer(self, send: Send, status: int, key: str, params: dict[str, Any], lang: str) -> None:
        detail = [{"loc": ["header"] if status != 413 else ["body"],
                   "msg": messages.localize_text(key, params, lang), "type": key}]
        body = json.dumps({"detail": detail}, ensure_ascii=False).encode("utf-8")
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close") if status == 413 else (b"cache-control", b"no-store"),
                                *self.security_headers]})
        await send({"type": "http.response.body", "body": body})
