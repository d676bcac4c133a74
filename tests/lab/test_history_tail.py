"""The page sends only the tops of its history stacks and applies the stack changes the answer
names: the result is the workspace the server computes from the whole history, action for action."""
from __future__ import annotations

import random

import pytest
from fastapi.testclient import TestClient

from lab.core.history_tail import TAIL_SENT
from lab.core.recipes import REPO_ROOT
from lab.core.workspace import MAX_HISTORY
from lab.web.app import create_app
from tests.page_protocol import actions, applied, tail_request


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app(), base_url="http://127.0.0.1")


def test_the_tops_and_the_stack_changes_give_the_workspace_the_whole_history_gives(client):
    rng = random.Random(11)
    full = client.post("/api/workspace", json={"workspace": None, "action": {"type": "view"}}).json()["workspace"]
    page = dict(full)
    steps = actions(rng)
    for step in range(160):
        action = next(steps)
        a = client.post("/api/workspace", json={"workspace": full, "action": action})
        b = client.post("/api/workspace", json=tail_request(page, action))
        assert a.status_code == b.status_code, (step, action, b.text[:300])
        if a.status_code != 200:  # e.g. restore_a without A: both refuse, nothing changes
            continue
        va, vb = a.json(), b.json()
        full, page = va["workspace"], applied(page, vb)
        assert page == full, (step, action)
        assert set(vb["workspace"]) == {"b", "a"}
        for key in ("history_labels", "last_change", "findings", "files", "share_link"):
            assert va[key] == vb[key], (step, action, key)
    assert len(full["undo"]) > 10 and full["redo"] is not None


def test_the_oldest_entry_goes_when_the_history_is_full_and_only_the_tops_were_sent(client):
    ws = client.post("/api/workspace", json={"workspace": None, "action": {"type": "view"}}).json()["workspace"]
    for i in range(MAX_HISTORY + 3):
        answer = client.post("/api/workspace", json=tail_request(ws, {"type": "edit", "path": "task.num_rollout",
                                                                       "value": 100 + i})).json()
        ws = applied(ws, answer)
    assert len(ws["undo"]) == MAX_HISTORY
    assert [e["changes"][0]["new"] for e in ws["undo"][:2]] == [103, 104]
    assert answer["history"]["undo"]["start"] == 1 and len(answer["history"]["undo"]["push"]) == 1


def test_the_request_no_longer_grows_with_the_history(client):
    import json

    ws = client.post("/api/workspace", json={"workspace": None, "action": {"type": "view"}}).json()["workspace"]
    sizes = {}
    for i in range(MAX_HISTORY):
        ws = applied(ws, client.post("/api/workspace", json=tail_request(
            ws, {"type": "edit", "path": "task.num_rollout", "value": 100 + i})).json())
        if len(ws["undo"]) in (2, MAX_HISTORY):
            sizes[len(ws["undo"])] = len(json.dumps(tail_request(ws, {"type": "undo"})))
    assert abs(sizes[MAX_HISTORY] - sizes[2]) < 16  # the lengths' digits and the values differ, nothing else
    body = {"workspace": ws, "action": {"type": "edit", "path": "task.num_rollout", "value": 7}}
    tail = tail_request(ws, body["action"])
    assert len(json.dumps(tail)) * 8 < len(json.dumps(body))
    full_answer = client.post("/api/workspace", json=body)
    tail_answer = client.post("/api/workspace", json=tail)
    assert len(tail_answer.content) + 10_000 < len(full_answer.content)


def test_undo_labels_the_next_entry_from_the_second_top_it_was_sent(client):
    ws = client.post("/api/workspace", json={"workspace": None, "action": {"type": "view"}}).json()["workspace"]
    for path, value in (("task.num_rollout", 9), ("rollout.temperature", 0.6), ("task.num_rollout", 10)):
        ws = applied(ws, client.post("/api/workspace", json=tail_request(
            ws, {"type": "edit", "path": path, "value": value})).json())
    answer = client.post("/api/workspace", json=tail_request(ws, {"type": "undo"}, "zh")).json()
    assert answer["history_labels"]["undo"] == "rollout.temperature" and answer["history_labels"]["redo"]
    assert answer["last_change"]["undone"] is True


@pytest.mark.parametrize("history, side", [({"undo": 0, "redo": 0}, "undo"), ({"undo": 5, "redo": -1}, None),
                                          ({"undo": 10**9, "redo": 0}, None)])
def test_lengths_that_contradict_the_tops_are_refused_naming_the_stack(client, history, side):
    ws = client.post("/api/workspace", json={"workspace": None, "action": {"type": "view"}}).json()["workspace"]
    ws = client.post("/api/workspace", json={"workspace": ws, "action": {
        "type": "edit", "path": "task.num_rollout", "value": 9}}).json()["workspace"]
    r = client.post("/api/workspace", json={"workspace": ws, "history": history, "action": {"type": "undo"},
                                            "lang": "zh"})
    assert r.status_code == 422
    loc = r.json()["detail"][0]["loc"]
    assert loc[:2] == ["body", "history"] and (side is None or loc[2] == side)
    assert any("\u4e00" <= ch <= "\u9fff" for ch in r.json()["detail"][0]["msg"])


def test_a_stack_said_to_hold_entries_but_sent_without_its_top_is_refused(client):
    ws = client.post("/api/workspace", json={"workspace": None, "action": {"type": "view"}}).json()["workspace"]
    r = client.post("/api/workspace", json={"workspace": ws, "history": {"undo": 0, "redo": 3},
                                            "action": {"type": "redo"}})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "history", "redo"]


def test_the_page_sends_as_many_tops_as_the_server_expects():
    import re

    js = (REPO_ROOT / "lab" / "static" / "app.js").read_text()
    assert re.search(r"^const TAIL_SENT = (\d+);", js, re.M).group(1) == str(TAIL_SENT)
