"""A corpus of hostile and broken inputs against every POST route and the CLI.

Every answer is a 4xx (never a 5xx) with `detail[0].msg` naming the problem and `loc` naming the
field or the body; every request answers within a few seconds; the CLI exits 2 with one message
and no traceback, and leaves no file behind.
"""
from __future__ import annotations

import contextlib
import io
import json
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from fastapi.testclient import TestClient

from lab.core.experiment import LEAF_FIELDS
from lab.core.share import encode_link
from lab.rules.dependents import new_experiment
from lab.web.app import create_app
from lab.web.body import MAX_BODY_BYTES
from lab.web.cli import main as cli_main

pytestmark = pytest.mark.timeout(600)

ROUTES = ["/api/validate", "/api/render", "/api/share", "/api/share/open", "/api/workspace"]
SLOW_S = 5.0  # one request of the corpus answering later than this counts as a hang

# Raw JSON fragments a field may be set to (text, so that NaN and huge numbers survive).
HOSTILE_VALUES = ["NaN", "Infinity", "-Infinity", "1e999", "9" * 5000, "-" + "9" * 30, '"\\ud800"', '"a\\udfffb"',
                  '"\\u0000"', '"a\\nb"', '"a\\rb"', '"-rf"', '"--help"', "[]", "{}", "null", "true", "-1", "1.5",
                  '"' + "x" * 20_000 + '"', "[" * 40 + "]" * 40, '["-x", "\\u0000"]', '{"nested": {"a": NaN}}']
# Recipe names a stored (or hand-edited) history entry may try to restore.
HOSTILE_RECIPES = ["nope", "", "../../etc/passwd", "<script>alert(1)</script>", "glm4-9b\u0000", " glm4-9b",
                   "GLM4-9B", "x" * 5000, "\u202egnp.exe"]
BROKEN_BODIES = ["", "{", "[]", "null", "1", '"text"', "{'a': 1}", '{"a": 1,}', "[" * 5000 + "]" * 5000,
                 '{"experiment": ' * 2000 + "{}" + "}" * 2000, "\ufeff{}", '{"experiment": {}} trailing',
                 '{"x": ' + "9" * 5000 + "}", '{"experiment": NaN}', '"\\ud800"', '{"\\ud800": 1}']


def _client() -> TestClient:
    return TestClient(create_app(), base_url="http://127.0.0.1")


@pytest.fixture(scope="module")
def client() -> TestClient:
    return _client()


def _exp_text(path: str, raw_value: str) -> str:
    """The default experiment as JSON text with one field replaced by a raw JSON fragment."""
    marker = "__SLIME_HOSTILE__"
    data = new_experiment().model_dump(mode="json")
    cur = data
    parts = path.split(".")
    for p in parts[:-1]:
        cur = cur[p]
    cur[parts[-1]] = marker
    return json.dumps(data).replace(json.dumps(marker), raw_value)


def _bodies(route: str) -> Iterator[tuple[str, bytes]]:
    for b in BROKEN_BODIES:
        yield f"broken {b[:30]!r}", b.encode("utf-8", "surrogatepass")
    yield "not utf-8", b'{"experiment": "\xff\xfe"}'
    fields = sorted(LEAF_FIELDS)
    if route in ("/api/validate", "/api/render", "/api/share"):
        for i, path in enumerate(fields):  # every field meets a few values; every value meets many fields
            for raw in HOSTILE_VALUES[i % 7::7]:
                yield f"{path}={raw[:20]}", ('{"experiment": ' + _exp_text(path, raw) + "}").encode("utf-8", "surrogatepass")
        yield "extra key", b'{"experiment": {}, "more": 1}'
        yield "unknown recipe", b'{"experiment": {"model": {"recipe": "no-such-model"}}}'
    elif route == "/api/share/open":
        link = encode_link(new_experiment())
        for raw in HOSTILE_VALUES + [json.dumps(link[:-5]), json.dumps(link + "AAAA"), json.dumps("#s=" + "A" * 70_000),
                                     json.dumps("https://x/#s=%%%"), json.dumps("#s=" + "_" * 100)]:
            yield f"link={raw[:20]}", ('{"link": ' + raw + "}").encode("utf-8", "surrogatepass")
    else:
        yield from _workspace_bodies(fields)


def _workspace_bodies(fields: list[str]) -> Iterator[tuple[str, bytes]]:
    def body(ws: str, action: str, lang: str = '"en"') -> bytes:
        return f'{{"workspace": {ws}, "action": {action}, "lang": {lang}}}'.encode("utf-8", "surrogatepass")

    for i, path in enumerate(fields):
        for raw in HOSTILE_VALUES[i % 9::9]:
            yield f"edit {path}={raw[:20]}", body("null", f'{{"type": "edit", "path": "{path}", "value": {raw}}}')
            yield f"b.{path}={raw[:20]}", body(f'{{"b": {_exp_text(path, raw)}}}', '{"type": "view"}')
    actions = ['{"type": "edit"}', '{"type": "edit", "path": "no.such.field", "value": 1}',
               '{"type": "edit_many", "values": {"placement.nodes": NaN}}', '{"type": "edit_many", "values": []}',
               '{"type": "edit_many", "values": {"x.y": 1}}', '{"type": "open_share", "link": "#s=garbage"}',
               '{"type": "open_share"}', '{"type": "load_json", "text": "{\\"placement\\": {\\"nodes\\": NaN}}"}',
               '{"type": "load_json", "text": "' + "[" * 3000 + '"}', '{"type": "load_json", "data": {"x": 1}}',
               '{"type": "load_json", "text": "{\\"task\\": {\\"input_key\\": \\"\\\\ud800\\"}}"}',
               '{"type": "load_json", "data": {"task": {"label_key": "-x"}}}',
               '{"type": "apply_repair", "id": "no-such-repair"}', '{"type": "apply_repair"}', '{"type": "explode"}',
               '{"type": "view", "extra": 1}', "null", "[]", '{"type": "undo", "path": "\\u0000"}']
    for a in actions:
        yield f"action {a[:40]}", body("null", a)
    yield "unknown recipe in b", body('{"b": {"model": {"recipe": "no-such-model"}}}', '{"type": "view"}')
    yield "unknown recipe in a", body('{"a": {"model": {"recipe": "nope"}}}', '{"type": "view"}')
    bad_entry = '{"label": "x", "changes": [{"path": "no.such.path", "old": 1, "new": 2}]}'
    yield "undo entry with unknown path", body(f'{{"undo": [{bad_entry}]}}', '{"type": "undo"}')
    yield "redo entry with unknown path", body(f'{{"redo": [{bad_entry}]}}', '{"type": "redo"}')
    typed = '{"label": "x", "changes": [{"path": "placement.nodes", "old": "many", "new": 2}]}'
    yield "undo entry with a wrong type", body(f'{{"undo": [{typed}]}}', '{"type": "undo"}')
    yield "history of junk", body('{"undo": [1, 2, 3]}', '{"type": "undo"}')
    for name in HOSTILE_RECIPES:
        for side in ("undo", "redo"):
            for end in ("old", "new"):
                change = {"path": "model.recipe", "old": "glm4-9b", "new": "glm4-9b", end: name}
                entry = json.dumps({"label": "x", "changes": [change]})
                yield f"{side} entry {end} recipe {name[:20]!r}", body(f'{{"{side}": [{entry}]}}', f'{{"type": "{side}"}}')
    yield "bad lang", body("null", '{"type": "view"}', '"xx"')
    yield "workspace is a list", body("[]", '{"type": "view"}')


def _check(r: Any, name: str, took: float) -> None:
    assert took < SLOW_S, f"{name}: {took:.1f} s"
    assert r.status_code < 500, f"{name}: {r.status_code} {r.text[:300]}"
    if r.status_code >= 400:
        detail = r.json()["detail"]
        assert isinstance(detail, list) and detail, name
        assert isinstance(detail[0]["msg"], str) and detail[0]["msg"], name
        assert "Traceback" not in detail[0]["msg"], name
        assert isinstance(detail[0]["loc"], list), name


@pytest.mark.parametrize("route", ROUTES)
def test_every_bad_input_is_a_4xx_naming_the_problem(client, route):
    n = refused = 0
    for name, raw in _bodies(route):
        t = time.monotonic()
        r = client.post(route, content=raw, headers={"content-type": "application/json"})
        _check(r, f"{route} {name}", time.monotonic() - t)
        n += 1
        refused += r.status_code >= 400
    assert n >= 30 and refused >= n // 2, (n, refused)


@pytest.mark.parametrize("name", HOSTILE_RECIPES[:4])
@pytest.mark.parametrize("side", ["undo", "redo"])
def test_an_unknown_recipe_in_a_history_entry_is_a_4xx_naming_it_and_the_workspace_is_untouched(client, side, name):
    kept = {"b": new_experiment("tiny-cpu").model_dump(mode="json"), "undo": [], "redo": []}
    entry = {"label": "model.recipe", "changes": [{"path": "model.recipe", "old": name, "new": "tiny-cpu"}]}
    if side == "redo":
        entry["changes"][0].update(old="tiny-cpu", new=name)
    sent = {**kept, side: [entry]}
    r = client.post("/api/workspace", json={"workspace": sent, "action": {"type": side}, "lang": "en"})
    assert r.status_code == 422, r.text
    (d,) = r.json()["detail"]
    assert d["type"] == "input.unknown_recipe" and repr(name) in d["msg"] and "tiny-cpu" in d["msg"], d
    assert d["loc"] == ["body", "workspace", side, 0, "changes", 0, "old" if side == "undo" else "new"]
    assert "workspace" not in r.json()  # nothing applied: the page keeps the workspace it stored
    ok = client.post("/api/workspace", json={"workspace": kept, "action": {"type": "view"}, "lang": "en"})
    assert ok.status_code == 200 and ok.json()["workspace"]["b"] == kept["b"]


@pytest.mark.parametrize("raw, where", [
    ('{"experiment": {"placement": {"nodes": NaN}}}', ["body", "experiment", "placement", "nodes"]),
    ('{"experiment": {"placement": {"nodes": ' + "9" * 5000 + "}}}", ["body", "experiment", "placement", "nodes"]),
    ('{"experiment": {"task": {"input_key": "\\ud800"}}}', ["body", "experiment", "task", "input_key"]),
    ('{"experiment": {"task": {"input_key": "-x"}}}', ["body", "experiment", "task", "input_key"]),
    ('{"experiment": {"paths": {"save": "/a\\u0000b"}}}', ["body", "experiment", "paths", "save"]),
])
def test_the_answer_names_the_field(client, raw, where):
    r = client.post("/api/render", content=raw, headers={"content-type": "application/json"})
    assert r.status_code in (400, 422) and r.json()["detail"][0]["loc"] == where, r.text


def test_a_syntax_error_names_its_position_in_the_users_language(client):
    r = client.post("/api/validate", content=b'{"experiment": {,}}',
                    headers={"content-type": "application/json", "accept-language": "zh-CN,zh;q=0.9"})
    assert r.status_code == 400
    msg = r.json()["detail"][0]["msg"]
    assert "第 1 行第 17 列" in msg, msg
    r = client.post("/api/validate", content=b'{"experiment": {,}}', headers={"content-type": "application/json"})
    assert "line 1, column 17" in r.json()["detail"][0]["msg"]


def test_a_field_error_of_the_workspace_is_in_the_language_the_request_names(client):
    body = {"workspace": None, "action": {"type": "view"}, "lang": "zh"}
    raw = json.dumps(body).replace('"workspace": null', '"workspace": {"b": {"task": {"input_key": "-x"}}}')
    r = client.post("/api/workspace", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422
    (d,) = r.json()["detail"]
    assert d["loc"] == ["body", "workspace", "b", "task", "input_key"] and "不能以 '-' 开头" in d["msg"]


@pytest.fixture(scope="module")
def served() -> Iterator[int]:
    """The app under uvicorn on a free loopback port (a real socket: chunked bodies arrive as streams)."""
    import socket
    import threading

    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    yield port
    server.should_exit = True
    thread.join(timeout=10)


def _send_chunked(port: int, route: str, max_bytes: int) -> tuple[int, int]:
    """POST an endless chunked body; (HTTP status, bytes sent before the server answered)."""
    import select
    import socket

    sock = socket.create_connection(("127.0.0.1", port), timeout=SLOW_S)
    sock.sendall(f"POST {route} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 "Transfer-Encoding: chunked\r\n\r\n".encode())
    chunk = b"x" * 65536
    frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    sent = 0
    answer = b""
    deadline = time.monotonic() + 60
    try:
        while sent < max_bytes and time.monotonic() < deadline:
            if select.select([sock], [], [], 0)[0]:
                break
            sock.sendall(frame)
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass
    try:
        answer = sock.recv(4096)
    except (ConnectionResetError, socket.timeout):
        pass
    sock.close()
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0
    return status, sent


def test_chunked_bodies_are_capped_while_they_stream(served):
    """A 200 MB chunked body is cut off near the 1 MB cap with a 413 (sockets buffer a few MB)."""
    for route in ROUTES:
        status, sent = _send_chunked(served, route, max_bytes=200_000_000)
        assert status == 413, (route, status, sent)
        assert sent < 32_000_000, (route, sent)


def test_a_declared_oversize_body_is_refused_before_it_is_read(client):
    r = client.post("/api/workspace", content=b"{}", headers={"content-type": "application/json",
                                                              "content-length": str(MAX_BODY_BYTES + 1)})
    assert r.status_code == 413


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None])
def test_posts_that_are_not_json_are_refused(client, ctype):
    headers = {"content-type": ctype} if ctype else {}
    for route in ROUTES:
        r = client.post(route, content=json.dumps({"experiment": {}}), headers=headers)
        assert r.status_code == 415 and "application/json" in r.json()["detail"][0]["msg"], (route, ctype)


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8765", "127.0.0.1.evil.example", "0.0.0.0", ""])
def test_a_foreign_host_is_refused_on_every_route(client, host):
    for method, route in [("GET", "/"), ("GET", "/api/recipes"), ("GET", "/static/app.js"), ("POST", "/api/render")]:
        r = client.request(method, route, headers={"host": host, "content-type": "application/json"}, content=b"{}")
        assert r.status_code == 400 and "--allow-host" in r.json()["detail"][0]["msg"], (host, route)


def test_loopback_names_and_allowed_hosts_are_served():
    for host in ["127.0.0.1:8765", "localhost:8765", "LOCALHOST", "[::1]:8765"]:
        assert _client().get("/api/recipes", headers={"host": host}).status_code == 200, host
    app = create_app(host="0.0.0.0", allow_hosts=["lab.internal"])
    c = TestClient(app, base_url="http://lab.internal")
    assert c.get("/api/recipes").status_code == 200
    assert c.get("/api/recipes", headers={"host": "10.0.0.9"}).status_code == 400


def test_a_cross_site_origin_is_refused(client):
    r = client.post("/api/render", json={"experiment": {}}, headers={"origin": "https://evil.example"})
    assert r.status_code == 403
    assert client.post("/api/validate", json={"experiment": {}}, headers={"origin": "http://127.0.0.1:8765"}).status_code == 200


def test_every_answer_carries_the_security_headers(client):
    for r in (client.get("/"), client.get("/later-steps.html"), client.get("/static/app.js"), client.get("/api/recipes"),
              client.post("/api/render", content=b"{", headers={"content-type": "application/json"}),
              client.get("/api/recipes", headers={"host": "evil.example"})):
        csp = r.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
        assert r.headers["x-frame-options"] == "DENY" and r.headers["x-content-type-options"] == "nosniff"


def test_the_api_description_is_off_unless_asked_for(client):
    assert client.get("/openapi.json").status_code == 404
    assert "swagger" not in client.get("/docs").text.lower()  # /docs/ serves the user docs, not an API console
    assert client.get("/redoc").status_code == 404
    on = TestClient(create_app(openapi=True), base_url="http://127.0.0.1")
    assert on.get("/openapi.json").status_code == 200


# --- the CLI ------------------------------------------------------------------------------------

def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli_main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def _cli_documents() -> Iterator[tuple[str, bytes]]:
    for b in BROKEN_BODIES:
        yield f"broken {b[:30]!r}", b.encode("utf-8", "surrogatepass")
    yield "not utf-8", b'{"task": {"input_key": "\xff"}}'
    for i, path in enumerate(sorted(LEAF_FIELDS)):
        for raw in HOSTILE_VALUES[i % 11::11]:
            yield f"{path}={raw[:20]}", _exp_text(path, raw).encode("utf-8", "surrogatepass")


def test_the_cli_refuses_every_bad_file_with_exit_2_and_writes_nothing(tmp_path):
    n = 0
    for k, (name, raw) in enumerate(_cli_documents()):
        doc = tmp_path / f"doc{k}.json"
        doc.write_bytes(raw)
        out_dir = tmp_path / f"out{k}"
        for argv in (["render", str(doc), "-o", str(out_dir)], ["validate", str(doc)], ["share", str(doc)]):
            code, _, err = _cli(argv)
            assert code in (0, 1, 2), (name, argv[0], code, err)
            assert "Traceback" not in err, (name, err)
            if code == 2:
                assert err.startswith("slime-lab: error: ") and err.count("\n") == 1, (name, err)
                if argv[0] == "render":
                    assert not out_dir.exists() or not any(out_dir.iterdir()), name
            n += 1
    assert n >= 300


@pytest.mark.parametrize("value", ["NaN", "1e999", "9" * 5000, "-x", '"\\ud800"', "--help", "\udcff", '["-a"]'])
def test_the_cli_refuses_bad_set_values_with_exit_2(tmp_path, value):
    code, _, err = _cli(["render", "--model", "glm4-9b", "--set", f"task.input_key={value}", "-o", str(tmp_path / "o")])
    assert code == 2 and err.startswith("slime-lab: error: --set task.input_key: "), err
    assert not (tmp_path / "o").exists()


def test_share_open_checks_the_values_a_link_carries(tmp_path):
    import base64
    import zlib

    def link(envelope: str) -> str:
        return "#s=" + base64.urlsafe_b64encode(zlib.compress(envelope.encode())).decode().rstrip("=")

    for env, words in [('{"v":1,"schema":2,"choices":{"placement":{"nodes":-1}}}', "placement.nodes"),
                       ('{"v":1,"schema":2,"choices":{"placement":{"nodes":NaN}}}', "NaN"),
                       ('{"v":1,"schema":2,"a":{},"b":{"task":{"input_key":"-x"}}}', "side B: task.input_key")]:
        code, out, err = _cli(["share", "--open", link(env)])
        assert code == 2 and words in err and out == "", err
    code, out, _ = _cli(["share", "--open", link('{"v":1,"schema":2,"a":{},"b":{"placement":{"nodes":2}}}')])
    assert code == 0 and json.loads(out) == {"a": {}, "b": {"placement": {"nodes": 2}}}
    code, _, err = _cli(["share", "--open", link('{"v":1,"schema":2,"a":{},"b":{}}')[:-3] + "@@@"])
    assert code == 2 and "decode_ab_link" not in err


def test_render_writes_all_files_or_none(tmp_path, monkeypatch):
    from lab import render

    code, _, _ = _cli(["render", "--model", "glm4-9b", "-o", str(tmp_path / "o")])
    assert code == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "o").iterdir()}
    real_fdopen = render.os.fdopen
    calls = 0

    def failing_fdopen(fd, mode):  # the second file's write fails (disk full)
        nonlocal calls
        calls += 1
        if calls == 2:
            raise OSError(28, "No space left on device")
        return real_fdopen(fd, mode)

    monkeypatch.setattr(render.os, "fdopen", failing_fdopen)
    code, _, err = _cli(["render", "--model", "glm4.7-flash", "-o", str(tmp_path / "o")])
    assert code == 2 and "No space left on device" in err and "nothing was changed" in err
    after = {p.name: p.read_bytes() for p in Path(tmp_path / "o").iterdir()}
    assert after == before  # the old files, whole; no temporary file left behind


@pytest.mark.parametrize("value", ["-x", "--help", "a\nb", "a\rb", "a\x00b", "\ud800"])
def test_the_character_rule_holds_at_every_entry_point(client, tmp_path, value):
    """NUL, CR, LF, a leading '-' and lone surrogates in a value that becomes an argument are refused
    by edits, Load JSON, share links, render, validate, share and the CLI alike."""
    import base64
    import zlib

    text = json.dumps(value)  # ASCII with \\u escapes: the lone surrogate travels as JSON allows
    choices = '{"task": {"input_key": ' + text + "}}"
    token = base64.urlsafe_b64encode(zlib.compress(
        ('{"v":1,"schema":2,"choices":' + choices + "}").encode())).decode().rstrip("=")

    def post(route: str, raw: str) -> Any:
        return client.post(route, content=raw.encode(), headers={"content-type": "application/json"})

    def ws(action: str) -> Any:
        return post("/api/workspace", '{"workspace": null, "action": ' + action + "}")

    answers = {
        "edit": ws('{"type": "edit", "path": "task.input_key", "value": ' + text + "}"),
        "edit_many": ws('{"type": "edit_many", "values": {"task.input_key": ' + text + "}}"),
        "load_json text": ws('{"type": "load_json", "text": ' + json.dumps(choices) + "}"),
        "load_json data": ws('{"type": "load_json", "data": ' + choices + "}"),
        "open_share": ws('{"type": "open_share", "link": "#s=' + token + '"}'),
        "workspace.b": post("/api/workspace", '{"workspace": {"b": ' + choices + '}, "action": {"type": "view"}}'),
        "render": post("/api/render", '{"experiment": ' + choices + "}"),
        "validate": post("/api/validate", '{"experiment": ' + choices + "}"),
        "share": post("/api/share", '{"experiment": ' + choices + "}"),
        "share/open": post("/api/share/open", '{"link": "#s=' + token + '"}'),
    }
    for where, r in answers.items():
        assert r.status_code in (400, 422), (where, r.status_code, r.text[:200])
        detail = r.json()["detail"][0]
        # the JSON reader refuses a lone surrogate where it stands in the body (action.value, ...)
        assert "input_key" in json.dumps(detail) or detail["type"] == "input.surrogate", (where, detail)
    doc = tmp_path / "e.json"
    doc.write_text(choices)
    for argv in (["render", str(doc), "-o", str(tmp_path / "o")], ["validate", str(doc)], ["share", str(doc)],
                 ["share", "--open", "#s=" + token],
                 ["render", "--model", "glm4-9b", "--set", f"task.input_key={value}", "-o", str(tmp_path / "o")]):
        code, _, err = _cli(argv)
        assert code == 2 and "input_key" in err, (argv[0], code, err)
    assert not (tmp_path / "o").exists()
