"""The state rules of Compare A / B and Load JSON, through the page's actions (lab/api_workspace).

A stays fixed under every action on B and every history move; restore and repair are one undo
step each; Load JSON replaces B as one undoable action (file fields win, the rest goes back to the
file's recipe defaults, private fields are kept unless the file has them) and a bad file changes
nothing.
"""
from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path

import pytest

from lab.core import share
from lab.core import workspace as W
from lab.core.change import ChangeError
from lab.core.experiment import PRIVATE_FIELDS
from lab.core.load_json import MAX_BYTES
from lab.rules import edit as E
from lab.rules.dependents import apply_change, new_experiment
from lab.web.api_workspace import Action, _apply
from lab.web.export import experiment_files
from lab.web.workspace_view import view

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MINE = {"paths.save": "/home/me/ckpt/secret-run", "paths.hf_checkpoint": "/home/me/models/glm",
        "serving.pd.rdma_devices": ["mlx5_7"], "task.custom_reward_path": "me.private.reward"}


def act(ws: W.Workspace, type: str, **kw) -> W.Workspace:
    return _apply(ws, Action(type=type, **kw))


def mine_ws() -> W.Workspace:
    """A user's B with their own private values, saved as A, then edited."""
    ws = E.edit_many(E.fresh_workspace(), dict(MINE), "my paths")
    ws = act(ws, "save_a")
    return act(ws, "edit", path="task.num_rollout", value=9)


def test_a_stays_fixed_under_every_action_and_history_move():
    ws = mine_ws()
    a = ws.a.model_copy(deep=True)
    s1 = (FIXTURES / "schema1_export.json").read_text()
    link = share.encode_link(apply_change(new_experiment("glm4.7"), "task.num_rollout", 4)[0])
    steps = [
        ("edit", dict(path="placement.scheduling", value="async")),
        ("edit_many", dict(values={"task.n_samples_per_prompt": 4, "corrections.tis": True}, label="two")),
        ("edit", dict(path="serving.pd.enabled", value=True)),
        ("edit", dict(path="serving.pd.decode_engines", value=3)),
        ("apply_repair", {}),
        ("undo", {}), ("redo", {}), ("undo", {}), ("undo", {}),
        ("restore_a", {}), ("undo", {}), ("redo", {}),
        ("load_json", dict(text=s1)), ("undo", {}),
        ("open_share", dict(link=link)),
        ("adopt_grpo", {}), ("reset", {}), ("undo", {}), ("redo", {}),
    ]
    for kind, kw in steps:
        if kind == "apply_repair":
            kw = dict(id=next(r["id"] for r in view(ws)["repairs"] if r["fixes"] == "SGL-4"))
        ws = act(ws, kind, **kw)
        assert ws.a == a, kind
    # ... and across a reload: the page stores the workspace JSON and sends it back
    assert W.Workspace.model_validate_json(ws.model_dump_json()).a == a


def test_save_and_clear_a_are_not_in_b_history_and_restore_is_one_undo_step():
    ws = mine_ws()
    undo_before = list(ws.undo)
    ws = act(act(ws, "edit", path="placement.scheduling", value="async"), "save_a")
    assert len(ws.undo) == len(undo_before) + 1 and ws.redo == []
    ws = act(ws, "edit", path="task.num_rollout", value=11)
    b = ws.b
    restored = act(ws, "restore_a")
    assert restored.b == ws.a and len(restored.undo) == len(ws.undo) + 1
    assert act(restored, "undo").b == b
    cleared = act(ws, "clear_a")
    assert cleared.a is None and cleared.undo == ws.undo and cleared.b == ws.b


def test_ab_diff_lists_dependent_changes_and_each_side_is_checked_on_its_own():
    ws = act(W.Workspace(b=new_experiment("glm4.7-flash")), "save_a")
    ws = act(ws, "edit", path="placement.scheduling", value="async")
    v = view(ws)
    paths = {d["path"] for d in v["ab_diff"]}
    assert {"placement.scheduling", "placement.ownership"} <= paths  # async selected separate pools
    assert v["a_findings"] != v["findings"]
    assert all(f["id"] != "ASY-1" for f in v["a_findings"]) and any(f["id"] == "ASY-1" for f in v["findings"])
    assert json.loads(v["files"]["experiment.json"])["experiment"] == ws.b.model_dump(mode="json")  # export is B


def _payload(link: str) -> dict:
    token = link.split("#s=", 1)[1]
    return json.loads(zlib.decompress(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))))


def test_ab_share_link_strips_private_fields_on_both_sides():
    ws = mine_ws()
    link = view(ws)["share_link_ab"]
    env = _payload(link)
    for side in ("a", "b"):
        assert not PRIVATE_FIELDS & set(W.flatten_choices(env[side]))
    text = json.dumps(env)
    for value in MINE.values():
        assert json.dumps(value).strip('"[]') not in text
    opened = act(E.fresh_workspace(), "open_share", link=link)  # a stranger: A and B, their own paths
    assert opened.a.task.num_rollout != opened.b.task.num_rollout and opened.b.paths.save != MINE["paths.save"]


# --- Load JSON ---------------------------------------------------------------------------------------

def test_load_our_export_replaces_b_exactly_in_one_undoable_step():
    src, _ = apply_change(new_experiment("glm4.7"), "paths.save", "/team/ckpt/glm47")
    text = experiment_files(src)["experiment.json"]
    ws = mine_ws()
    loaded = act(ws, "load_json", text=text)
    assert loaded.b == src and len(loaded.undo) == len(ws.undo) + 1 and loaded.a == ws.a
    assert act(loaded, "undo").b == ws.b


def test_load_schema1_migrates_and_resets_what_it_does_not_name_keeping_my_private_paths():
    ws = mine_ws()
    ws = act(ws, "edit", path="serving.concurrency", value=77)
    loaded = act(ws, "load_json", text=(FIXTURES / "schema1_export.json").read_text())
    b, defaults = loaded.b, new_experiment("glm4.7-flash")
    assert b.model.recipe == "glm4.7-flash" and b.resources.cpu_adam is True and b.corrections.tis is True
    assert b.evaluation.enabled and b.evaluation.interval == 10 and b.evaluation.data_path == "/mnt/team/aime-2024.jsonl"
    assert b.paths.hf_checkpoint == "/mnt/team/GLM-4.7-Flash"  # the file has it: the file wins
    assert b.paths.save == MINE["paths.save"] and b.serving.pd.rdma_devices == MINE["serving.pd.rdma_devices"]  # kept
    assert b.serving.concurrency == defaults.serving.concurrency and b.task.num_rollout == defaults.task.num_rollout
    assert len(loaded.undo) == len(ws.undo) + 1
    assert act(loaded, "undo").b == ws.b


@pytest.mark.parametrize("doc", [
    {"placement": {"ownership": "colocated"}, "model": {"recipe": "glm4.7-flash"}},
    {"placement.ownership": "colocated", "model.recipe": "glm4.7-flash"},
])
def test_load_bare_choices_nested_or_dotted(doc):
    ws = mine_ws()
    loaded = act(ws, "load_json", data=doc)
    assert loaded.b.placement.ownership == "colocated" and loaded.b.model.recipe == "glm4.7-flash"
    assert loaded.b.task.num_rollout == new_experiment("glm4.7-flash").task.num_rollout  # not named: default
    assert loaded.b.paths.save == MINE["paths.save"]
    assert len(loaded.undo) == len(ws.undo) + 1


@pytest.mark.parametrize("text, field, words", [
    ("{not json", "action.text", "not valid JSON"),
    ("[1, 2]", "action.text", "JSON object"),
    ('{"placement": {"ownrship": "external"}}', "placement.ownrship", "unknown field"),
    ('{"placement": {"ownership": "shared"}}', "placement.ownership", "colocated"),
    ('{"task": {"num_rollout": "many"}}', "task.num_rollout", "wrong type"),
    ('{"schema": 7, "experiment": {}}', "schema", "unknown schema"),
    ('{"schema": 1, "choices": {"modle": "glm4-9b"}}', "choices.modle", "did you mean 'model'"),
    ('{"model": {"recipe": "gpt-9"}}', "model.recipe", "unknown model"),
    (" " * (MAX_BYTES + 1) + "{}", "action.text", "at most"),
])
def test_a_bad_file_is_named_and_leaves_b_and_history_untouched(text, field, words):
    ws = mine_ws()
    before = ws.model_dump_json()
    with pytest.raises(ChangeError) as err:
        act(ws, "load_json", text=text)
    assert err.value.field == field and words in err.value.message
    assert ws.model_dump_json() == before


def test_view_regenerates_provenance_for_the_current_page():
    ws = act(mine_ws(), "load_json", text=json.dumps({"schema": 2, "experiment": new_experiment("glm4.7").model_dump(mode="json"),
                                                      "provenance": {"checkout": {"commit": "f" * 40, "dirty": False}}}))
    v = view(ws)
    assert v["provenance"]["checkout"]["commit"] != "f" * 40
    assert v["provenance"] == json.loads(v["files"]["experiment.json"])["provenance"]
    assert v["provenance"]["sources"]["recipe"]["path"] == "recipes/glm4.7.yaml"


def test_the_page_language_localizes_findings_and_repairs_but_not_the_workspace_or_files():
    from fastapi.testclient import TestClient

    from lab.web.app import create_app

    exp, _ = apply_change(new_experiment("glm4.7-flash"), "serving.pd.enabled", True)
    body = {"workspace": W.Workspace(b=exp).model_dump(mode="json"), "action": {"type": "view"}}
    client = TestClient(create_app(), base_url="http://127.0.0.1")
    en = client.post("/api/workspace", json=body).json()
    zh = client.post("/api/workspace", json={**body, "lang": "zh"}).json()
    assert en["repairs"][0]["id"] == zh["repairs"][0]["id"] and en["repairs"][0]["title"] != zh["repairs"][0]["title"]
    assert "引擎" in zh["repairs"][0]["title"] and any("GPU" in f["message"] and "张" in f["message"] for f in zh["findings"])
    assert zh["files"] == en["files"] and zh["workspace"] == en["workspace"]
