"""lab/static/ is served from memory (lab/web/static_files.py): gzipped, revalidated by ETag, never stale
after an edit, and nothing outside the folder or hidden in it is reachable."""
from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from lab.web.app import create_app
from lab.web.static_files import STATIC_DIR, StaticFiles, etag_matches


@pytest.fixture(scope="module")
def client():
    return TestClient(create_app(), base_url="http://127.0.0.1")


def test_scripts_and_styles_are_the_files_gzipped_with_their_types(client):
    for name, media in (("app.js", "text/javascript"), ("app.css", "text/css"), ("locales/zh.json", "application/json")):
        on_disk = (STATIC_DIR / name).read_bytes()
        r = client.get(f"/static/{name}", headers={"accept-encoding": "gzip"})
        assert r.status_code == 200 and r.headers["content-type"].startswith(media), name
        assert r.headers["content-encoding"] == "gzip" and int(r.headers["content-length"]) < len(on_disk) / 2, name
        assert r.content == on_disk, name  # the client unzipped it: the same bytes
        plain = client.get(f"/static/{name}", headers={"accept-encoding": "identity"})
        assert "content-encoding" not in plain.headers and plain.content == on_disk, name
        assert client.get(f"/static/{name}", headers={"if-none-match": r.headers["etag"]}).status_code == 304
        assert r.headers["content-security-policy"]  # the guard's headers, as on every answer


def test_an_edited_file_is_served_at_once_with_a_new_etag(tmp_path: Path):
    app = TestClient(_mounted(StaticFiles(tmp_path)), base_url="http://127.0.0.1")
    f = tmp_path / "a.js"
    f.write_text("export const a = 1;\n")
    first = app.get("/static/a.js")
    f.write_text("export const a = 22;\n")
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 1_000_000_000))  # a later mtime on coarse clocks too
    second = app.get("/static/a.js", headers={"if-none-match": first.headers["etag"]})
    assert second.status_code == 200 and second.text == "export const a = 22;\n"
    assert second.headers["etag"] != first.headers["etag"]
    f.unlink()
    assert app.get("/static/a.js").status_code == 404


@pytest.mark.parametrize("path", ["/static/../app.py", "/static/%2e%2e/app.py", "/static/..%2fapp.py", "/static/.hidden",
                                  "/static/locales", "/static/", "/static/nope.js", "/static/app.js%00.css",
                                  "/static/a\\b.js", "/static//etc/passwd"])
def test_nothing_outside_or_hidden_is_served(client, path):
    r = client.get(path)
    assert r.status_code == 404 and r.json()["detail"]


def test_only_get_and_head(client):
    head = client.head("/static/app.css", headers={"accept-encoding": "identity"})
    assert head.status_code == 200 and head.content == b""
    assert int(head.headers["content-length"]) == len((STATIC_DIR / "app.css").read_bytes())
    r = client.post("/static/app.css", json={})
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"


def test_if_none_match_forms():
    tag = b'"abc"'
    assert etag_matches(b'"x", "abc"', tag) and etag_matches(b'W/"abc"', tag) and etag_matches(b"*", tag)
    assert not etag_matches(b'"abcd"', tag) and not etag_matches(b"", tag)


def test_the_gzipped_bytes_are_the_file():
    body = (STATIC_DIR / "app.js").read_bytes()
    assert gzip.decompress(StaticFiles().get("app.js").zipped) == body


def _mounted(static: StaticFiles):
    from fastapi import FastAPI

    app = FastAPI()
    app.mount("/static", static)
    return app
