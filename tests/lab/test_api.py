"""The HTTP API through FastAPI's TestClient: each endpoint, 4xx shapes, body-size limits."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from lab.core.experiment import PRIVATE_FIELDS
from lab.core.recipes import all_recipes
from lab.rules.dependents import apply_change, new_experiment
from lab.web.app import create_app
from lab.web.export import experiment_files


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app(), base_url="http://127.0.0.1")


def body(exp) -> dict:
    return {"experiment": exp.model_dump(mode="json")}


def test_recipes_in_picker_order(client):
    r = client.get("/api/recipes")
    assert r.status_code == 200 and [x["name"] for x in r.json()] == list(all_recipes())


def test_schema_marks_private_fields(client):
    r = client.get("/api/schema")
    assert r.status_code == 200 and r.json()["x-schema-version"] == 2 and '"x-private": true' in r.text.replace(":true", ": true")


def test_images_lists_known_images(client):
    r = client.get("/api/images")
    assert r.status_code == 200 and any(im["tag"].endswith("-hopper") for im in r.json())


def test_validate_returns_findings_and_derived(client):
    exp, _ = apply_change(new_experiment("glm4-9b"), "resources.tp", 3)
    r = client.post("/api/validate", json=body(exp))
    assert r.status_code == 200
    assert any(f["id"] == "PAR-1" and f["level"] == "error" for f in r.json()["findings"])
    assert r.json()["derived"]["n_actor"] == 4


def test_render_equals_render_all_byte_for_byte(client):
    for name in all_recipes():
        exp = new_experiment(name)
        r = client.post("/api/render", json=body(exp))
        assert r.status_code == 200 and r.json()["files"] == experiment_files(exp)


def test_render_bad_field_value_is_422_with_its_location(client):
    r = client.post("/api/render", json={"experiment": {"placement": {"nodes": 0}}})
    assert r.status_code == 422
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "experiment", "placement", "nodes"] and err["msg"]


def test_render_unknown_field_is_422_naming_it(client):
    r = client.post("/api/render", json={"experiment": {"placement": {"nodez": 2}}})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "experiment", "placement", "nodez"]


def test_render_unknown_recipe_is_422_on_model_recipe(client):
    r = client.post("/api/render", json={"experiment": {"model": {"recipe": "nope"}}})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "experiment", "model", "recipe"]


def test_malformed_json_is_400_with_line_and_column(client):
    r = client.post("/api/validate", content=b'{"experiment": ', headers={"content-type": "application/json"})
    assert r.status_code == 400 and "line 1" in r.json()["detail"][0]["msg"]


def test_oversize_body_with_content_length_is_413(client):
    r = client.post("/api/render", content=b" " * 1_000_001, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["detail"][0]["loc"] == ["body"]


def test_oversize_chunked_body_is_413(client):
    def chunks():
        for _ in range(300):
            yield b" " * 4096

    r = client.post("/api/render", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_share_strips_private_fields_and_opens(client):
    exp, _ = apply_change(new_experiment("glm4-9b"), "paths.save", "/secret/ckpt")
    link = client.post("/api/share", json=body(exp)).json()["link"]
    r = client.post("/api/share/open", json={"link": link})
    assert r.status_code == 200 and "/secret/ckpt" not in r.text
    assert r.json()["choices"]["model"]["recipe"] == "glm4-9b"
    choices = r.json()["choices"]
    for field in PRIVATE_FIELDS:  # no private field survives a share link
        section, _, rest = field.partition(".")
        node = choices.get(section, {})
        for part in rest.split(".")[:-1]:
            node = node.get(part, {})
        assert rest.split(".")[-1] not in node, field


def test_share_open_bad_link_is_400_on_link(client):
    r = client.post("/api/share/open", json={"link": "garbage"})
    assert r.status_code == 400 and r.json()["detail"][0]["loc"] == ["body", "link"]
