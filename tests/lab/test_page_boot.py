"""The page carries its first draw: the English locale and the API's answer for a fresh workspace
as JSON data blocks, served gzipped with an ETag, under a CSP that allows only the hashed boot script."""
from __future__ import annotations

import json
import re

import pytest
from fastapi.testclient import TestClient

from lab.web.app import create_app
from lab.web.page import _render_parts, inline_script_hashes, page_locale, render_later_steps, render_page


@pytest.fixture(scope="module")
def client():
    return TestClient(create_app(), base_url="http://127.0.0.1")


def _block(html: str, name: str):
    m = re.search(rf'<script type="application/json" id="{name}">(.*?)</script>', html, flags=re.DOTALL)
    assert m, name
    return json.loads(m.group(1))


def test_the_page_carries_the_english_locale_and_the_fresh_view(client):
    html = render_page()
    assert _block(html, "boot-locale") == page_locale("en")
    answer = client.post("/api/workspace", json={"workspace": None, "action": {"type": "view"}, "lang": "en"}).json()
    # what the first request would have answered, with the tags of its parts (nothing was held)
    assert answer["same"] == [] and answer["patch"] == {}
    assert _block(html, "boot-view") == {k: v for k, v in answer.items() if k not in ("same", "patch")}


def test_no_text_in_a_data_block_can_close_it():
    html = render_page()
    for name in ("boot-locale", "boot-view"):
        body = re.search(rf'id="{name}">(.*?)</script>', html, flags=re.DOTALL).group(1)
        assert "<" not in body, name  # escaped as \u003c, so "</script>" in a text cannot end the block


def test_only_the_boot_script_is_inline_and_it_is_hashed(client):
    html = render_page()
    assert len(re.findall(r"<script>", html)) == 1 and len(inline_script_hashes()) == 1
    csp = client.get("/").headers["content-security-policy"]
    assert f"'{inline_script_hashes()[0]}'" in csp and "unsafe-inline" not in csp


def test_the_page_is_gzipped_and_revalidated_by_etag(client):
    r = client.get("/", headers={"accept-encoding": "gzip"})
    assert r.headers["content-encoding"] == "gzip" and r.text == render_page()
    assert int(r.headers["content-length"]) < len(render_page().encode()) / 3
    assert client.get("/", headers={"if-none-match": r.headers["etag"]}).status_code == 304
    plain = client.get("/", headers={"accept-encoding": "identity"})
    assert "content-encoding" not in plain.headers and plain.text == render_page()


def test_locales_are_served_by_language_and_nothing_else(client):
    assert client.get("/locales/zh.json").json() == page_locale("zh")
    r = client.get("/locales/en.json")
    assert r.json() == page_locale("en") and client.get("/locales/en.json", headers={"if-none-match": r.headers["etag"]}).status_code == 304
    assert client.get("/locales/fr.json").status_code == 404
    assert client.get("/locales/..%2Fapp.json").status_code == 404


def test_a_page_whose_first_answer_cannot_be_computed_is_still_served(monkeypatch):
    import lab.web.workspace_view

    def broken(*args, **kwargs):
        raise RuntimeError("no view")

    monkeypatch.setattr(lab.web.workspace_view, "view", broken)
    html = _render_parts.__wrapped__()[0]
    assert 'id="boot-view"' not in html and 'id="boot-locale"' in html  # the page asks the API instead


def test_the_controls_come_set_to_the_first_answer():
    """Every control already shows the fresh workspace's value, so the first draw sets none of them."""
    from html.parser import HTMLParser

    from lab.core.experiment import LEAF_FIELDS

    html = render_page()
    b = _block(html, "boot-view")["workspace"]["b"]

    class Controls(HTMLParser):
        def __init__(self):
            super().__init__()
            self.values, self.select = {}, None

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if tag == "select" and "data-field" in a:
                self.select = a["data-field"]
            elif tag == "option" and self.select and "selected" in a:
                self.values[self.select] = a["value"]
            elif tag == "input" and "data-field" in a:
                self.values[a["data-field"]] = "checked" in a if a["data-kind"] == "bool" else a.get("value", "")

        def handle_endtag(self, tag):
            if tag == "select":
                self.select = None

    parser = Controls()
    parser.feed(html + render_later_steps())  # steps 2-6 come apart (GET /later-steps.html), set the same way
    for path in LEAF_FIELDS:
        v = b
        for part in path.split("."):
            v = v[part]
        if v is None:
            continue
        want = v if isinstance(v, bool) else ", ".join(v) if isinstance(v, list) else \
            (str(int(v)) if isinstance(v, float) and v.is_integer() else str(v))
        assert parser.values.get(path) == want, path


def test_the_document_is_the_first_screen_and_steps_2_to_6_come_apart(client):
    """The page holds the intro and step 1; GET /later-steps.html holds steps 2-6 (gzipped, ETag),
    and between them every field has its one control."""
    from lab.web.page import field_specs

    html, later = render_page(), render_later_steps()
    assert 'id="step-1"' in html and 'id="intro"' in html
    for i in range(2, 7):
        assert f'id="step-{i}"' not in html and f'id="step-{i}"' in later
    assert "<html" not in later and "<script" not in later  # a fragment, and nothing the CSP would have to allow
    fields = re.findall(r'data-field="([^"]+)"', html + later)
    assert sorted(fields) == sorted(set(fields)) and set(fields) == set(field_specs())
    r = client.get("/later-steps.html", headers={"accept-encoding": "gzip"})
    assert r.status_code == 200 and r.headers["content-encoding"] == "gzip" and r.text == later
    assert r.headers["content-type"].startswith("text/html")
    assert client.get("/later-steps.html", headers={"if-none-match": r.headers["etag"]}).status_code == 304
    assert len(html.encode()) < 120_000  # was 177 KB with steps 2-6 inert in a <template>
