"""An answer leaves out the parts the page holds (lab/web/answer_parts.py): the page's copies stand
in for them, and what it then draws is the whole answer, action for action."""
from __future__ import annotations

import json
import random
import re

import pytest
from fastapi.testclient import TestClient

from lab.core.recipes import REPO_ROOT
from lab.web.answer_parts import LINE, TAG_MIN, apply_ops, lines, tag, text_ops
from lab.web.app import create_app
from lab.web.page import boot_view
from lab.web.workspace_view import to_json
from tests.page_protocol import actions, applied, tail_request


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app(), base_url="http://127.0.0.1")


def _kept(view: dict, answer: dict) -> dict:
    """What the page draws (lab/static/app.js withParts): the answer, its left-out parts from the
    last view, its patched parts from the last view's texts."""
    patched = {k: {name: apply_ops(view[k].get(name, ""), ops) for name, ops in p["texts"].items()}
               for k, p in answer["patch"].items()}
    return {**answer, **{k: view[k] for k in answer["same"]}, **patched}


def _without_delta_keys(v: dict) -> dict:
    return {k: x for k, x in v.items() if k not in ("tags", "same", "patch")}


def test_the_page_draws_the_whole_answer_from_the_parts_it_held_and_the_parts_it_was_sent(client):
    rng = random.Random(5)
    first = client.post("/api/workspace", json={"workspace": None, "action": {"type": "view"}}).json()
    ws, view, held = first["workspace"], first, first["tags"]
    left_out = sent = patched = 0
    steps = actions(rng)
    for step in range(60):
        action = next(steps)
        lang = "zh" if step % 7 == 3 else "en"  # another language changes the translated parts
        whole = client.post("/api/workspace", json=tail_request(ws, action, lang))
        delta = client.post("/api/workspace", json={**tail_request(ws, action, lang), "held": held})
        assert whole.status_code == delta.status_code, (step, action)
        if whole.status_code != 200:
            continue
        w, d = whole.json(), delta.json()
        assert w["same"] == [] and w["patch"] == {} and d["tags"].keys() == w["tags"].keys() - set(d["same"])
        drawn = _kept(view, d)
        assert _without_delta_keys(drawn) == _without_delta_keys(w), (step, action)
        left_out += len(d["same"])
        patched += len(d["patch"])
        sent += len(d) - 3
        ws, view = applied(ws, d), drawn
        held = {**{k: held[k] for k in d["same"]}, **d["tags"]}
        assert held == w["tags"]  # the page's tags are the whole answer's
    assert left_out > sent / 2  # most of the large parts do come from the page's copy
    assert patched > 10  # and the files, mostly, as patches of it


def test_an_edit_brings_back_only_the_parts_it_changed_and_the_files_as_line_patches(client):
    first = client.post("/api/workspace", json={"workspace": None, "action": {"type": "view"}}).json()
    answer = client.post("/api/workspace", json={**tail_request(first["workspace"], {
        "type": "edit", "path": "evaluation.enabled", "value": not first["workspace"]["b"]["evaluation"]["enabled"]}),
        "held": first["tags"]})
    d = answer.json()
    assert "share_link" in d and {"diagrams", "image", "derived"} <= set(d["same"])
    assert "files" not in d and d["patch"]["files"]["base"] == first["tags"]["files"]
    changed = sum(len(new) for ops in d["patch"]["files"]["texts"].values() for _, _, new in ops)
    assert 0 < changed < 20
    assert len(answer.content) < len(json.dumps(first)) / 4


@pytest.mark.parametrize("old, new", [
    ("", "a\nb"), ("a\nb\n", ""), ("a\nb\nc\n", "a\nB\nc\n"), ("a\nb", "a\nb\n"), ("x\r\ny\u2028z\n", "x\r\nq\u2028z\n"),
    ("1\n2\n3\n4\n5\n6\n", "0\n1\n2\n3\nx\n5\n6\n7\n"), ("same\n", "same\n"),
])
def test_a_line_patch_turns_the_held_text_into_the_new_one(old, new):
    ops = text_ops(old, new)
    assert apply_ops(old, ops) == new and "".join(lines(new)) == new
    assert (ops == []) == (old == new)


def test_a_tag_the_server_does_not_know_only_costs_the_part(client):
    first = client.post("/api/workspace", json={"workspace": None, "action": {"type": "view"}}).json()
    wrong = {k: "0" * 16 for k in first["tags"]}
    d = client.post("/api/workspace", json={**tail_request(first["workspace"], {"type": "view"}), "held": wrong}).json()
    assert d["same"] == [] and d["tags"] == first["tags"]


def test_small_parts_and_the_workspace_always_travel(client):
    first = client.post("/api/workspace", json={"workspace": None, "action": {"type": "view"}}).json()
    assert "workspace" not in first["tags"] and "last_change" not in first["tags"]
    assert all(len(to_json(first[k])) >= TAG_MIN for k in first["tags"])
    assert all(first["tags"][k] == tag(to_json(first[k])) for k in first["tags"])


@pytest.mark.parametrize("held", [{f"part{i}": "x" for i in range(65)}, {"files": "x" * 17}, {"f" * 41: "x"}])
def test_an_oversized_held_is_refused_naming_it_and_changes_nothing(client, held):
    first = client.post("/api/workspace", json={"workspace": None, "action": {"type": "view"}}).json()
    r = client.post("/api/workspace", json={**tail_request(first["workspace"], {"type": "undo"}), "held": held})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"][:2] == ["body", "held"]


def test_the_first_answer_inside_the_page_carries_the_tags_the_api_gives():
    inline = boot_view()
    assert inline is not None
    client = TestClient(create_app(), base_url="http://127.0.0.1")
    api = client.post("/api/workspace", json={"workspace": None, "action": {"type": "view"}}).json()
    assert inline["tags"] == api["tags"]


def test_the_page_cuts_lines_with_the_servers_pattern():
    js = (REPO_ROOT / "lab" / "static" / "app.js").read_text()
    m = re.search(r"^const textLines = \(text\) => text\.match\(/(.+?)/g\)", js, re.M)
    assert m and m.group(1) == LINE


def test_line_patches_of_random_edits_turn_the_held_text_into_the_new_one():
    # Texts of repeated and unique lines, with and without a last "\n", edited by deletions,
    # insertions and swaps: every patch applies, and in order.
    rng = random.Random(7)
    for _ in range(3000):
        pool = [f"line {k}\n" for k in range(rng.randint(1, 20))] + ["\n", "x\n", "no newline", "\u2028\r\n"]
        old = "".join(rng.choice(pool) for _ in range(rng.randint(0, 40)))
        new = lines(old)
        for _ in range(rng.randint(1, 5)):
            k, r = rng.randint(0, len(new)), rng.random()
            if r < 0.3 and new:
                del new[min(k, len(new) - 1)]
            elif r < 0.6 and len(new) > 2:
                i, j = rng.sample(range(len(new)), 2)
                new[i], new[j] = new[j], new[i]
            else:
                new.insert(k, rng.choice(pool))
        ops = text_ops(old, "".join(new))
        assert apply_ops(old, ops) == "".join(new), (old, new, ops)
        assert all(0 <= i <= j for i, j, _ in ops) and all(a[1] <= b[0] for a, b in zip(ops, ops[1:]))


def test_a_long_file_changed_at_both_ends_is_patched_by_the_changed_lines_only():
    old = "".join(f"FLAG_{k}=value{k}\n" for k in range(400))
    new = old.replace("FLAG_3=value3\n", "FLAG_3=changed\n").replace("FLAG_396=value396\n", "FLAG_396=changed\n")
    assert text_ops(old, new) == [(3, 4, ["FLAG_3=changed\n"]), (396, 397, ["FLAG_396=changed\n"])]


def test_anchors_are_taken_once_per_patch_so_its_depth_never_grows_with_the_input(monkeypatch):
    # Unique lines moved in blocks: the stretches between the anchors are compared without looking
    # for anchors again (one level deep), however many there are.
    import lab.web.answer_parts as parts

    rng = random.Random(3)
    old_lines = [f"line {k}\n" for k in range(3000)]
    blocks = [old_lines[i:i + 7] for i in range(0, len(old_lines), 7)]
    rng.shuffle(blocks)
    old, new = "".join(old_lines), "".join(line for block in blocks for line in block)
    calls = []
    real = parts._unique_in_order
    monkeypatch.setattr(parts, "_unique_in_order", lambda a, b: calls.append(len(a)) or real(a, b))
    ops = text_ops(old, new)
    assert apply_ops(old, ops) == new and len(calls) == 1
