"""The workspace socket (lab/web/api_socket.py) answers as POST /api/workspace does: the same
answers to the page's actions, the same status and detail for every hostile body, and its
handshake passes the guard's Host and Origin checks."""
from __future__ import annotations

import json
import random

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from lab.web.api_socket import PATH as SOCKET_PATH
from lab.web.app import create_app
from lab.web.body import MAX_BODY_BYTES
from tests.lab.test_bad_input_corpus import _workspace_bodies
from tests.page_protocol import actions, applied, tail_request

PATH = "ws://127.0.0.1" + SOCKET_PATH  # the guard refuses the test client's default host, "testserver"
ORIGIN = {"origin": "http://127.0.0.1"}


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app(), base_url="http://127.0.0.1")


def _ask(sock, rid: int, body: str, lang: str = "en") -> tuple[int, dict]:
    sock.send_text(json.dumps({"id": rid, "lang": lang}) + "\n" + body)
    head, _, payload = sock.receive_text().partition("\n")
    h = json.loads(head)
    assert h["id"] == rid
    return h["status"], json.loads(payload)


def _post(client: TestClient, body: str | bytes, lang: str = "en") -> tuple[int, dict]:
    r = client.post("/api/workspace", content=body,
                    headers={"content-type": "application/json", "accept-language": lang})
    return r.status_code, r.json()


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_socket_answers_every_action_as_the_post_does(client, lang):
    rng = random.Random(7)
    acts = actions(rng)
    with client.websocket_connect(PATH, headers=ORIGIN) as sock:
        status, first = _ask(sock, 1, json.dumps({"workspace": None, "action": {"type": "view"}, "lang": lang}), lang)
        assert status == 200
        ws = {**first["workspace"], "undo": [], "redo": []}
        held: dict[str, str] = {}
        for i in range(40):
            body = json.dumps({**tail_request(ws, next(acts), lang), "held": held})
            got = _ask(sock, i + 2, body, lang)
            want = _post(client, body, lang)
            assert got == want, f"action {i}: {body[:200]}"
            status, answer = got
            if status == 200:
                ws = applied(ws, answer)
                held = {**{k: held[k] for k in answer["same"]}, **answer["tags"]}


def test_every_hostile_body_gets_the_posts_status_and_detail_and_the_socket_stays_open(client):
    n = refused = 0
    with client.websocket_connect(PATH, headers=ORIGIN) as sock:
        for name, raw in _workspace_bodies(["placement.nodes", "task.num_rollout", "model.recipe"]):
            try:
                text = raw.decode("utf-8")  # a text frame carries UTF-8 only: the page cannot send the rest
            except UnicodeDecodeError:
                continue
            got = _ask(sock, n + 1, text)
            want = _post(client, raw)
            assert got[0] == want[0] < 500, f"{name}: {got[0]} over the socket, {want[0]} by POST"
            assert got[1] == want[1], name
            n += 1
            refused += got[0] >= 400
        assert n > 50 and refused > 50
        assert _ask(sock, 999, json.dumps({"workspace": None, "action": {"type": "view"}}))[0] == 200


def test_a_message_over_the_body_cap_is_a_413_naming_the_limit(client):
    big = json.dumps({"workspace": None, "action": {"type": "load_json", "text": "x" * MAX_BODY_BYTES}})
    with client.websocket_connect(PATH, headers=ORIGIN) as sock:
        status, answer = _ask(sock, 1, big, "zh")
        assert status == 413 and str(MAX_BODY_BYTES) in answer["detail"][0]["msg"]
        assert "字节" in answer["detail"][0]["msg"]


def test_a_message_without_its_head_line_is_a_400_that_says_what_to_send(client):
    with client.websocket_connect(PATH, headers=ORIGIN) as sock:
        for bad in ['{"workspace": null, "action": {"type": "view"}}', '{"id": "one"}\n{}', '[]\n{}',
                    'not json\n{"workspace": null}']:
            sock.send_text(bad)
            head, _, payload = sock.receive_text().partition("\n")
            assert json.loads(head) == {"id": None, "status": 400}
            assert "head line" in json.loads(payload)["detail"][0]["msg"]
        sock.send_text('{"id": 4, "lang": "zh"}')  # a head and no request
        head, _, payload = sock.receive_text().partition("\n")
        assert json.loads(head) == {"id": 4, "status": 400} and "头部" in json.loads(payload)["detail"][0]["msg"]


@pytest.mark.parametrize("headers", [{"origin": "http://evil.example"}, {"origin": "null"},
                                     {"host": "evil.example", "origin": "http://evil.example"}],
                         ids=["foreign origin", "opaque origin", "rebound host"])
def test_a_handshake_from_another_site_is_refused(client, headers):
    with pytest.raises(WebSocketDisconnect) as refused:
        with client.websocket_connect(PATH, headers=headers) as sock:
            sock.receive_text()
    assert refused.value.code == 1008
