"""POST /api/workspace, GET /api/grpo-example and GET / through FastAPI's TestClient."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from lab.core.experiment import LEAF_FIELDS, PRIVATE_FIELDS, Experiment
from lab.core.recipes import all_recipes
from lab.web.app import create_app

KEYS = {"workspace", "findings", "a_findings", "derived", "memory", "layout", "commands", "files",
        "render_error", "ab_diff", "share_link", "share_link_ab", "recipe", "last_change", "history_labels",
        "repairs", "provenance", "image", "folded", "diagrams", "placement_plan", "placement_lines",
        "tags", "same", "patch"}  # the last three: lab/web/answer_parts.py
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app(), base_url="http://127.0.0.1")


def post(client, ws, action, status=200):
    r = client.post("/api/workspace", json={"workspace": ws, "action": action})
    assert r.status_code == status, r.text
    return r.json()


def edit(client, ws, path, value, status=200):
    return post(client, ws, {"type": "edit", "path": path, "value": value}, status)


def test_view_of_a_fresh_workspace_has_everything_the_page_draws(client):
    v = post(client, None, {"type": "view"})
    assert set(v) == KEYS
    assert v["workspace"]["b"] == json.loads(Experiment.model_validate(v["workspace"]["b"]).model_dump_json())
    assert v["workspace"]["undo"] == [] and v["last_change"] is None
    assert {"experiment.sh", "experiment.json"} <= set(v["files"]) and v["render_error"] is None
    assert v["share_link"].startswith("#s=") and v["share_link_ab"] is None
    assert v["memory"]["exclusions"], "the memory estimate states what it excludes"
    assert v["derived"]["n_actor"] > 0


def test_files_are_exactly_render_all(client):
    from lab.web.export import experiment_files

    v = edit(client, None, "model.recipe", "glm5.3")
    assert v["files"] == experiment_files(Experiment.model_validate(v["workspace"]["b"]))


def test_edit_is_one_history_entry_and_undo_redo(client):
    v = edit(client, None, "task.num_rollout", 9)
    assert v["workspace"]["b"]["task"]["num_rollout"] == 9
    assert len(v["workspace"]["undo"]) == 1 and v["last_change"]["changes"][0]["path"] == "task.num_rollout"
    u = post(client, v["workspace"], {"type": "undo"})
    assert u["workspace"]["b"]["task"]["num_rollout"] == 3 and u["last_change"]["undone"]
    r = post(client, u["workspace"], {"type": "redo"})
    assert r["workspace"]["b"]["task"]["num_rollout"] == 9


@pytest.mark.parametrize("path,value", [("placement.nodes", 0), ("placement.ownership", "shared"),
                                        ("task.n_samples_per_prompt", "many"), ("nope.field", 1)])
def test_bad_value_is_4xx_naming_the_field(client, path, value):
    v = post(client, None, {"type": "view"})
    r = client.post("/api/workspace", json={"workspace": v["workspace"], "action": {"type": "edit", "path": path, "value": value}})
    assert 400 <= r.status_code < 500
    detail = r.json()["detail"][0]
    assert detail["loc"][-1] == path and detail["msg"]


def test_a_broken_workspace_is_refused_naming_the_field(client):
    ws = post(client, None, {"type": "view"})["workspace"]
    ws["b"]["placement"]["ownership"] = "somewhere"
    r = client.post("/api/workspace", json={"workspace": ws, "action": {"type": "view"}})
    assert r.status_code == 422
    assert "ownership" in r.json()["detail"][0]["loc"]


def test_async_from_colocated_is_one_change_and_one_undo_restores_both(client):
    v = edit(client, None, "model.recipe", "glm4.7-flash")
    assert v["workspace"]["b"]["placement"]["ownership"] == "colocated"
    assert any(c[0] == "shared" for n in v["layout"]["nodes"] for c in n)
    a = edit(client, v["workspace"], "placement.scheduling", "async")
    assert a["workspace"]["b"]["placement"]["ownership"] == "disaggregated"
    assert len(a["workspace"]["undo"]) == len(v["workspace"]["undo"]) + 1
    assert any(c["reason"] for c in a["last_change"]["changes"]), "dependent changes carry their reason"
    roles = {c[0] for n in a["layout"]["nodes"] for c in n}
    assert "shared" not in roles and {"train", "rollout"} <= roles
    u = post(client, a["workspace"], {"type": "undo"})
    assert u["workspace"]["b"]["placement"] == v["workspace"]["b"]["placement"]


def test_layouts_follow_the_recipes(client):
    for name, recipe in all_recipes().items():
        v = edit(client, None, "model.recipe", name)
        L, d = v["layout"], v["derived"]
        if recipe.training.gpus_per_node == 0:
            assert L["cpu_only"]
            continue
        cells = [c for n in L["nodes"] for c in n]
        assert len(L["nodes"]) + L["hidden_nodes"] >= recipe.training.nodes
        assert sum(c[0] in ("train", "shared") for c in cells) == d["n_actor"] or L["hidden_nodes"]
        engines = {c[1] for c in cells if c[1] is not None}
        assert len(engines) == d["engines"] or L["hidden_nodes"], name
        assert v["commands"]["workers"] == d["ray_nodes"] - 1
        assert f"--num-gpus {d['ray_gpus_per_node']}" in v["commands"]["head"]


def test_external_engines_are_drawn_outside_ray(client):
    v = edit(client, None, "placement.ownership", "external")
    v = edit(client, v["workspace"], "placement.external_engine_addrs", ["10.0.0.1:30000", "10.0.0.2:30000"])
    assert v["layout"]["external"], "external engines are listed apart from the Ray nodes"
    assert all(c[0] != "rollout" for n in v["layout"]["nodes"] for c in n)
    assert v["commands"]["external"] is True
    assert "serving-reference.sh" in v["files"]


def test_share_link_opens_as_one_change_keeping_private_fields(client):
    mine = edit(client, None, "paths.hf_checkpoint", "/my/own/model")
    theirs = edit(client, None, "model.recipe", "deepseek-r1")
    theirs = edit(client, theirs["workspace"], "paths.save", "/their/secret/save")
    link = theirs["share_link"]
    assert "secret" not in json.dumps(__import__("lab.core.share", fromlist=["decode_link"]).decode_link(link))
    o = post(client, mine["workspace"], {"type": "open_share", "link": "http://elsewhere/" + link})
    b = o["workspace"]["b"]
    assert b["model"]["recipe"] == "deepseek-r1"
    assert b["paths"]["hf_checkpoint"] == "/my/own/model" and b["paths"]["save"] != "/their/secret/save"
    assert len(o["workspace"]["undo"]) == len(mine["workspace"]["undo"]) + 1
    u = post(client, o["workspace"], {"type": "undo"})
    assert u["workspace"]["b"] == mine["workspace"]["b"]


def test_bad_share_link_is_refused_and_names_the_link(client):
    ws = post(client, None, {"type": "view"})["workspace"]
    r = client.post("/api/workspace", json={"workspace": ws, "action": {"type": "open_share", "link": "#s=notatoken!!"}})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "action.link"


def test_a_b_save_restore_clear(client):
    v = edit(client, None, "task.num_rollout", 5)
    a = post(client, v["workspace"], {"type": "save_a"})
    assert a["workspace"]["undo"] == v["workspace"]["undo"], "saving A is not part of B's history"
    b = edit(client, a["workspace"], "placement.scheduling", "async")
    assert {"path": "placement.scheduling", "a": "sync", "b": "async"} in b["ab_diff"]
    assert b["share_link_ab"].startswith("#s=")
    r = post(client, b["workspace"], {"type": "restore_a"})
    assert r["workspace"]["b"] == a["workspace"]["b"] and r["ab_diff"] == []
    u = post(client, r["workspace"], {"type": "undo"})
    assert u["workspace"]["b"] == b["workspace"]["b"]
    c = post(client, u["workspace"], {"type": "clear_a"})
    assert c["workspace"]["a"] is None and c["ab_diff"] == []


def test_load_json_of_an_export_and_of_schema1_is_one_change(client):
    base = post(client, None, {"type": "view"})
    export = edit(client, None, "model.recipe", "glm4.7")["files"]["experiment.json"]
    v = post(client, base["workspace"], {"type": "load_json", "text": export})
    assert v["workspace"]["b"]["model"]["recipe"] == "glm4.7" and len(v["workspace"]["undo"]) == 1
    s1 = FIXTURES / "schema1_export.json"
    if s1.exists():
        v = post(client, base["workspace"], {"type": "load_json", "text": s1.read_text()})
        assert len(v["workspace"]["undo"]) == 1
    r = client.post("/api/workspace", json={"workspace": base["workspace"], "action": {"type": "load_json", "text": "{not json"}})
    assert r.status_code == 422 and "JSON" in r.json()["detail"][0]["msg"]
    r = client.post("/api/workspace", json={"workspace": base["workspace"],
                                            "action": {"type": "load_json", "data": {"placement": {"ownrship": "external"}}}})
    assert r.status_code == 422 and "ownrship" in r.json()["detail"][0]["loc"][-1]


def test_grpo_example_comes_from_the_runtime_function(client, monkeypatch):
    import slime.data.batch_builder as bb

    calls = []
    real = bb.normalize_group_rewards
    monkeypatch.setattr(bb, "normalize_group_rewards", lambda *a, **k: calls.append(a) or real(*a, **k))
    g = client.get("/api/grpo-example").json()
    assert calls, "the numbers come from slime.data.batch_builder.normalize_group_rewards"
    assert g["rewards"] == [1, 1, 1, 1, 0, 0, 0, 0] and g["mean"] == 0.5
    assert math.isclose(g["std"], math.sqrt(2 / 7)) and g["std_expr"] == "√(2/7)"
    expected = 0.5 / (math.sqrt(2 / 7) + 1e-6)  # docs/en/corrections.md#grpo-normalisation: unbiased std, epsilon added to the std
    assert all(math.isclose(a, s * expected, abs_tol=1e-9) for a, s in zip(g["advantages"], [1] * 4 + [-1] * 4))
    assert round(abs(g["advantages"][0]), 2) == 0.94  # a biased std would give ±1.0


def test_adopting_the_grpo_starting_point_is_one_undoable_change(client):
    v = edit(client, None, "task.n_samples_per_prompt", 4)
    v = edit(client, v["workspace"], "task.rm_type", "math")
    g = post(client, v["workspace"], {"type": "adopt_grpo"})
    assert g["workspace"]["b"]["task"]["n_samples_per_prompt"] == 8 and g["workspace"]["b"]["task"]["rm_type"] == "deepscaler"
    assert len(g["workspace"]["undo"]) == len(v["workspace"]["undo"]) + 1
    assert post(client, g["workspace"], {"type": "undo"})["workspace"]["b"] == v["workspace"]["b"]


def test_page_has_one_labelled_control_per_field_and_marks_private_ones(client):
    html = client.get("/").text + client.get("/later-steps.html").text  # steps 2-6 come apart (lab/page.py)
    for path in LEAF_FIELDS:
        assert html.count(f'data-field="{path}"') == 1, path
        ident = "f-" + path.replace(".", "-")
        assert f'<label for="{ident}"' in html, path
    assert html.count('class="private-marker"') == len(PRIVATE_FIELDS)
    # The page's markup names no outside address; its JSON data blocks (the fresh workspace's answer,
    # lab/web/page.py) are text the page shows, e.g. experiment.sh's default local Ray dashboard address.
    markup = re.sub(r'<script type="application/json" id="boot-[a-z]+">.*?</script>', "", html, flags=re.DOTALL)
    assert "http://" not in markup.replace("http://www.w3.org", "") and "https://" not in markup
