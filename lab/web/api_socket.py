"""WS /api/workspace/socket: the page's actions over one WebSocket, answered as POST /api/workspace.

Inside Chromium a fetch POST costs 4-6 ms of a click before the server is counted, a WebSocket
message under 1 ms (bench/bench_transport.py), so the page sends its actions here while the
socket is open and falls back to the POST otherwise. Nothing else differs: a message is read by
the same body reader (size cap, strict JSON, the same pydantic model) and answered by the same
`respond`, so an answer's bytes and an error's status and detail are the POST's.

A message is two lines in one: a head, `{"id": N, "lang": "en"}`, then "\\n", then the POST's body.
The answer is `{"id": N, "status": S}`, "\\n", then the POST's answer body (its JSON, or its
`{"detail": [...]}` error). The page matches answers to requests by `id`. The guard checks the
handshake's Host and Origin (lab/web/guard.py) as it checks every HTTP request's.
"""
from __future__ import annotations

import json
import logging

from fastapi import APIRouter, HTTPException, WebSocket, WebSocketDisconnect

from lab.core import messages
from lab.web.api_workspace import WorkspaceRequest, respond
from lab.web.body import MAX_BODY_BYTES, error, parse_json

router = APIRouter()
PATH = "/api/workspace/socket"
log = logging.getLogger(__name__)


@router.websocket(PATH)
async def workspace_socket(sock: WebSocket) -> None:
    """One message answered after another, on the event loop, like the POST route."""
    await sock.accept()
    try:
        while True:
            await sock.send_text(answer_message(await sock.receive_text()))
    except WebSocketDisconnect:
        return


def _encoded(exc: HTTPException) -> tuple[int, bytes]:
    """An error as the POST route answers it: its status and `{"detail": [...]}`."""
    return exc.status_code, json.dumps({"detail": exc.detail}, ensure_ascii=False).encode("utf-8")


def _head(text: str) -> tuple[int | None, str]:
    """The message head's id and language; (None, "en") where the head is not what the page sends."""
    try:
        head = json.loads(text)
    except ValueError:
        return None, "en"
    if not isinstance(head, dict):
        return None, "en"
    rid = head.get("id")
    lang = head.get("lang")
    return (rid if isinstance(rid, int) and not isinstance(rid, bool) else None,
            messages.normalize_lang(lang) if isinstance(lang, str) else "en")


def answer_bytes(body: str, lang: str) -> tuple[int, bytes]:
    """The POST route's status and body for this request body."""
    try:
        size = len(body.encode("utf-8", "surrogatepass"))
        if size > MAX_BODY_BYTES:
            raise error(413, ["body"], "input.too_large", {"size": size, "limit": MAX_BODY_BYTES}, lang)
        response = respond(parse_json(body, WorkspaceRequest, lang))
    except HTTPException as exc:
        return _encoded(exc)
    return response.status_code, bytes(response.body)


def answer_message(message: str) -> str:
    head_text, newline, body = message.partition("\n")
    rid, lang = _head(head_text)
    if rid is None or not newline:
        status, payload = _encoded(error(400, ["socket", "head"], "input.socket_head", {}, lang))
    else:
        try:
            status, payload = answer_bytes(body, lang)
        except Exception:  # noqa: BLE001 - the POST would be a 500; the socket must stay open for the next click
            log.exception("the workspace socket could not answer a message")
            status, payload = _encoded(error(500, [], "input.internal", {"error": "an internal error"}, lang))
    return json.dumps({"id": rid, "status": status}) + "\n" + payload.decode("utf-8")
