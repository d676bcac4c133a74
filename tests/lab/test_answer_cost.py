"""What makes an edit's answer cheap changes nothing in it: each part is computed once and passed on,
an experiment seen before is answered from a bounded memory, and the body reader's shortcuts
refuse exactly what its full walk refuses."""
from __future__ import annotations

import json
import os
import random
import re
import threading

import pytest
from fastapi.testclient import TestClient

from lab.core import change, safe_json
from lab.core.experiment import Experiment
from lab.core.history_memo import HistoryMemo, contents_key
from lab.core.memo import Memo
from lab.core.recipes import all_recipes
from lab.core.workspace import MAX_HISTORY, SENT_HISTORIES, HistoryEntry, Workspace, undo, workspace_json
from lab.render import render_all
from lab.render.env import TEMPLATES_DIR
from lab.rules.dependents import new_experiment
from lab.rules.derive import derive
from lab.rules.edit import edit, edit_many, fresh_workspace, reset
from lab.rules.repair import propose_repairs
from lab.rules.validate import validate
from lab.web import api_workspace as api
from lab.web import workspace_view as wv
from lab.web.app import create_app
from lab.web.export import experiment_files


def _reference_depth(text: str) -> int:
    """Nesting depth by walking the text character by character (the slow, obvious way)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _random_doc(rng: random.Random, level: int = 0):
    pieces = ["[", "]", "{", "}", '"', "\\", "a", " ", "é", "\n", '\\"', "\\\\", "𝛑"]
    r = rng.random()
    if level > 6 or r < 0.3:
        return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
    if r < 0.6:
        return [_random_doc(rng, level + 1) for _ in range(rng.randint(0, 4))]
    return {_random_doc(rng, 7): _random_doc(rng, level + 1) for _ in range(rng.randint(0, 4))}


def test_the_depth_check_counts_only_brackets_outside_strings_whatever_the_strings_hold():
    rng = random.Random(7)
    for _ in range(3000):
        doc = _random_doc(rng)
        for text in (json.dumps(doc), json.dumps(doc, ensure_ascii=False), json.dumps(doc, indent=1)):
            assert safe_json._max_depth(text) == _reference_depth(text), text
            assert safe_json._max_depth(text.encode()) == _reference_depth(text), text
            assert safe_json.loads(text) == doc


def test_deep_nesting_is_still_refused_when_strings_are_full_of_brackets():
    deep = "[" * 40 + '"]]]]\\"]]"' + "]" * 40
    with pytest.raises(safe_json.JSONInputError) as exc:
        safe_json.loads(deep)
    assert exc.value.key == "input.too_deep"
    shallow = json.dumps({"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[" * 3})
    assert safe_json.loads(shallow) == json.loads(shallow)


_ODD_NUMBER = re.compile(rb"[0-9]{21}|[0-9][eE][+-]?[0-9]{3}|NaN|Infinity")


def test_the_number_hooks_are_skipped_only_where_no_number_could_need_them():
    rng = random.Random(3)
    alphabet = b"0123456789eE+-.aNIfinty \"[]"
    for _ in range(50_000):
        text = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        assert safe_json._odd_numbers(text) == bool(_ODD_NUMBER.search(text)), text


@pytest.mark.parametrize("text, key", [
    ('{"x": "aime-2024", "n": 1e999}', "input.non_finite"),
    ('{"x": "/data/aime-2024.jsonl", "n": -1E+400}', "input.non_finite"),
    ('[1, 2, 123456789012345678901]', "input.big_int"),
    ('{"t": NaN}', "input.non_finite"),
    ('{"t": -Infinity}', "input.non_finite"),
])
def test_numbers_json_cannot_hold_are_refused_next_to_strings_that_look_like_numbers(text, key):
    with pytest.raises(safe_json.JSONInputError) as exc:
        safe_json.loads(text)
    assert exc.value.key == key


def test_strings_that_look_like_numbers_are_read_as_they_are():
    doc = {"path": "/data/aime-2024/aime-2024.jsonl", "id": "123456789012345678901234", "s": "NaN Infinity 1e999",
           "n": [12345678901234567890, -1.5e-300, 2.5e99]}
    assert safe_json.loads(json.dumps(doc)) == doc


def _exp_with_repairs():
    ws = edit(fresh_workspace(), "model.recipe", "glm5.3")
    return edit_many(ws, {"placement.train_gpus": 12, "placement.rollout_gpus": 12}, "t").b


@pytest.mark.parametrize("make", [lambda: fresh_workspace().b, _exp_with_repairs,
                                  lambda: edit(fresh_workspace(), "placement.ownership", "external").b])
def test_each_part_computed_once_equals_the_part_computed_on_its_own(make):
    exp = make()
    prov = wv._provenance(exp)
    shown = wv._compute_experiment_view(exp, prov)
    assert shown["findings"] == wv.dump(validate(exp))
    assert shown["derived"] == wv.dump(derive(exp))
    assert shown["files"] == experiment_files(exp)
    assert shown["repairs"] == wv.dump(propose_repairs(exp))
    assert render_all(exp, validate(exp), derive(exp), prov) == experiment_files(exp)


def test_a_remembered_answer_equals_one_computed_afresh():
    client = TestClient(create_app(), base_url="http://127.0.0.1")
    ws = client.post("/api/workspace", json={"workspace": None, "action": {"type": "view"}}).json()["workspace"]
    ws = client.post("/api/workspace", json={"workspace": ws, "action": {"type": "save_a"}}).json()["workspace"]
    body = {"workspace": ws, "action": {"type": "edit", "path": "placement.train_gpus", "value": 12}}
    remembered = client.post("/api/workspace", json=body)
    remembered = client.post("/api/workspace", json=body)  # the second one comes from the memory
    wv._SHOWN.clear()
    wv._FINDINGS.clear()
    fresh = client.post("/api/workspace", json=body)
    assert remembered.status_code == fresh.status_code == 200
    assert remembered.json() == fresh.json()
    assert remembered.json()["repairs"] and remembered.json()["a_findings"] is not None


def test_the_remembered_answers_stay_bounded_however_many_experiments_come():
    ws = fresh_workspace()
    for n in range(wv._SHOWN.size + 20):
        wv.view(edit(ws, "task.num_rollout", 5000 + n))
    assert len(wv._SHOWN) == wv._SHOWN.size


def test_a_changed_source_or_template_is_not_answered_from_memory(tmp_path):
    exp = fresh_workspace().b
    prov = wv._provenance(exp)
    key = wv._sources_key(prov)
    changed = json.loads(json.dumps(prov))
    changed["sources"]["model_spec"]["sha256"] = "0" * 64
    assert wv._sources_key(changed) != key
    template = next(TEMPLATES_DIR.iterdir())
    st = template.stat()
    try:
        os.utime(template, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
        assert wv._sources_key(prov) != key
    finally:
        os.utime(template, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert wv._sources_key(prov) == key


def test_a_plain_edit_travels_in_the_history_as_its_label_and_its_change_alone():
    """The history goes to the server and back with every request: an entry carries no key that
    holds its default (no label key, no reason, no empty parameters), which kept a plain edit's
    entry to a third of its size and made each request at 200 entries 20 KB smaller."""
    client = TestClient(create_app(), base_url="http://127.0.0.1")
    ws = client.post("/api/workspace", json={"workspace": None, "action": {"type": "view"}}).json()["workspace"]
    for i in range(3):
        ws = client.post("/api/workspace", json={"workspace": ws, "action": {
            "type": "edit", "path": "task.num_rollout", "value": 10 + i}}).json()["workspace"]
    entry = ws["undo"][-1]
    assert set(entry) == {"label", "changes"} and set(entry["changes"][0]) == {"path", "old", "new"}
    assert ws["redo"] == [] and len(ws["undo"]) == 3
    v = client.post("/api/workspace", json={"workspace": ws, "action": {"type": "reset"}}).json()
    keyed = v["workspace"]["undo"][-1]  # a keyed label and keyed reasons keep their keys
    assert keyed["label_id"] == "label.reset" and all(c.get("reason_id") for c in keyed["changes"])
    assert v["history_labels"]["undo"] == keyed["label"]


def test_the_history_as_sent_reads_back_equal_to_the_workspace():
    ws = fresh_workspace()
    for n in range(MAX_HISTORY + 5):
        ws = edit(ws, "task.num_rollout", 100 + n)
    ws = undo(undo(reset(edit(ws, "placement.ownership", "colocated"))))
    sent = workspace_json(ws)
    assert list(sent) == list(ws.model_dump(mode="json")) and len(sent["undo"]) == MAX_HISTORY - 2 and len(sent["redo"]) == 2
    assert Workspace.model_validate(json.loads(json.dumps(sent))) == ws
    full = json.dumps(ws.model_dump(mode="json", include={"undo", "redo"}))
    assert len(json.dumps({k: sent[k] for k in ("undo", "redo")})) < 0.7 * len(full)


def _history(n: int) -> Workspace:
    ws = fresh_workspace()
    for i in range(n):
        ws = edit(ws, "task.num_rollout", 100 + i)
    return ws


def test_a_history_sent_back_as_answered_is_not_validated_or_dumped_again():
    dumped: list[HistoryEntry] = []

    def dump(e: HistoryEntry):
        dumped.append(e)
        return e.model_dump(mode="json", exclude_defaults=True)

    memo: HistoryMemo[HistoryEntry] = HistoryMemo(dump)
    ws = _history(MAX_HISTORY)
    sent = json.loads(json.dumps(memo.dump(ws.undo)))  # what the page stores and sends back
    assert len(dumped) == MAX_HISTORY and contents_key(sent) is not None
    known = memo.known(sent)
    assert known is not None and all(a is b for a, b in zip(known, ws.undo, strict=True))
    after = edit(ws.model_copy(update={"undo": known}), "rollout.temperature", 0.5)
    dumped.clear()
    again = memo.dump(after.undo)
    assert dumped == [after.undo[-1]], "only the new entry is dumped"
    assert again == after.model_dump(mode="json", include={"undo"}, exclude_defaults=True)["undo"]


@pytest.mark.parametrize("change", [
    lambda h: h[3]["changes"][0].update(old=float(h[3]["changes"][0]["old"])),  # 103 -> 103.0
    lambda h: h[3]["changes"][0].update(new=True),
    lambda h: h[3]["changes"][0].update(path="task.nope"),
    lambda h: h[3].update(label="mine"),
    lambda h: h.pop(0),
    lambda h: h.reverse(),
    lambda h: h[3].update({"label": h[3].pop("label")}),  # the same values, keys in another order
])
def test_a_history_not_exactly_as_answered_is_validated_in_full(change):
    ws = _history(6)
    sent = json.loads(json.dumps(workspace_json(ws)))
    assert Workspace.model_validate(sent).undo[0] is ws.undo[0]
    change(sent["undo"])
    assert SENT_HISTORIES.known(sent["undo"]) is None
    mine = Workspace.model_validate(sent)
    assert not any(a is b for a in mine.undo for b in ws.undo)
    assert mine.model_dump(mode="json") == Workspace.model_validate(json.loads(json.dumps(sent))).model_dump(mode="json")


def test_a_tampered_history_path_is_refused_even_after_the_history_was_answered():
    client = TestClient(create_app(), base_url="http://127.0.0.1")
    ws = client.post("/api/workspace", json={"workspace": None, "action": {"type": "view"}}).json()["workspace"]
    ws = client.post("/api/workspace", json={"workspace": ws, "action": {
        "type": "edit", "path": "task.num_rollout", "value": 10}}).json()["workspace"]
    ws["undo"][0]["changes"][0]["path"] = "task.nope"
    r = client.post("/api/workspace", json={"workspace": ws, "action": {"type": "undo"}})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "path"


def test_the_remembered_histories_stay_bounded():
    memo: HistoryMemo[HistoryEntry] = HistoryMemo(lambda e: e.model_dump(mode="json"), histories=4)
    ws = _history(30)
    for n in range(10):
        ws = edit(ws, "task.num_rollout", 1000 + n)
        memo.dump(ws.undo)
        memo.dump(_history(5).undo)  # another user's history
    assert len(memo) == 4
    # only the entries of the remembered histories are kept: our last three (40 entries in all) and
    # the other user's latest five (the same contents again stand for the latest entries)
    assert len(memo._items) == 30 + 10 + 5 and set(memo._items) == set(memo._uses)
    assert all(memo._items[id(e)][0] is e for e in ws.undo)


def _parts(answer: dict) -> dict:
    """The answer's parts, without what it says of the page's copies (lab/web/answer_parts.py)."""
    return {k: v for k, v in answer.items() if k not in ("tags", "same", "patch")}


def test_the_encoded_answer_holds_the_same_values_as_json_dumps():
    v = wv.view(edit(fresh_workspace(), "rollout.temperature", 0.7))
    v["probe"] = {"tiny": 1e-06, "text": "é\u2028<script>", "big": 2**62}
    assert _parts(json.loads(api.AnswerResponse(v).body)) == json.loads(json.dumps(v))


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_an_answer_written_from_remembered_bytes_equals_one_encoded_whole(lang):
    """The parts of a remembered view are encoded once and spliced into each answer; a part the
    answer replaced (a translation, another workspace's value) is encoded afresh, never taken from
    the bytes of the value it replaced."""
    ws = edit(fresh_workspace(), "model.recipe", "glm5.3")
    tops = wv.history_tail.tops(ws)
    answer, encoded = wv.answer_view(ws, tops, None, ws)
    content = wv.localized(answer, lang, tops)
    stale = {**encoded, "files": ({"experiment.sh": "stale"}, b'{"experiment.sh":"stale"}')}
    spliced = _parts(json.loads(api.AnswerResponse(content, stale).body))
    assert spliced == _parts(json.loads(api.AnswerResponse(content).body)) == json.loads(json.dumps(content))
    assert spliced["files"]["experiment.sh"] != "stale" and "history" in spliced
    if lang == "zh":
        assert content["findings"] is not encoded["findings"][0]  # translated: encoded afresh


def test_the_memo_keeps_the_latest_entries_under_concurrent_use():
    memo: Memo[int] = Memo(16)
    errors: list[BaseException] = []

    def use(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(2000):
                k = rng.randint(0, 40)
                assert memo.get(k, lambda k=k: k * k) == k * k
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=use, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(memo) <= 16
    memo.get("new", lambda: 1)
    assert memo.get("new", lambda: 2) == 1  # a remembered value is not recomputed


def test_one_process_computes_one_answer_at_a_time(monkeypatch):
    """Concurrent edits wait their turn instead of time-slicing the GIL (docs/en/lab.md)."""
    import threading
    import time

    import anyio
    import httpx

    import lab.web.api_workspace as aw
    from lab.web.app import create_app

    running, most = [0], [0]
    lock = threading.Lock()
    answer = aw._answer

    def counted(ws, req):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.02)  # long enough for the other requests to arrive meanwhile
        try:
            return answer(ws, req)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(aw, "_answer", counted)

    async def six_at_once() -> list[int]:
        transport = httpx.ASGITransport(app=create_app())
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            codes: list[int] = []

            async def view() -> None:
                r = await client.post("/api/workspace", json={"workspace": None, "action": {"type": "view"}})
                codes.append(r.status_code)

            async with anyio.create_task_group() as tg:
                for _ in range(6):
                    tg.start_soon(view)
            return codes

    assert anyio.run(six_at_once) == [200] * 6
    assert most[0] == 1


# --- validation and provenance memos: what they answer is what a fresh computation answers ------

@pytest.mark.parametrize("recipe", sorted(all_recipes()))
def test_an_experiment_dumped_into_an_answer_validates_back_to_itself(recipe):
    """What lets SENT_EXPERIMENTS stand for validation: the dump of every recipe's experiment reads
    back equal, also as JavaScript writes it back (whole floats as integers)."""
    from lab.core.workspace import _as_javascript_writes

    exp = new_experiment(recipe)
    sent = json.loads(json.dumps(exp.model_dump(mode="json")))
    assert Experiment.model_validate(sent) == exp == Experiment.model_validate(sent, strict=True)
    as_js = _as_javascript_writes(sent)
    back = Experiment.model_validate(as_js)
    assert back == exp and back.model_dump_json() == exp.model_dump_json()


def test_every_field_that_holds_a_float_reads_an_integer_as_that_float():
    """Why the JavaScript form of a dump validates to the same experiment: no field takes int or float both."""
    import typing

    from lab.core.experiment import iter_field_paths

    for path, info in iter_field_paths():
        args = set(typing.get_args(info.annotation)) or {info.annotation}
        if float in args:
            assert args <= {float, type(None)}, (path, info.annotation)
        assert not ({int, float} <= args), path


def test_a_remembered_experiment_is_never_answered_for_other_contents():
    from lab.core.workspace import SENT_EXPERIMENTS, known_experiment

    client = TestClient(create_app(), base_url="http://127.0.0.1")
    ws = client.post("/api/workspace", json={"workspace": None, "action": {"type": "view"}}).json()["workspace"]
    body = {"workspace": ws, "action": {"type": "edit", "path": "rollout.temperature", "value": 0.9}}
    ws = client.post("/api/workspace", json=body).json()["workspace"]
    remembered = known_experiment(ws["b"])
    assert remembered is not None and remembered.rollout.temperature == 0.9  # the answer's B is known as sent
    as_js = json.loads(json.dumps(ws["b"]))  # as the page sends it back: JSON.stringify writes 2.0 as 2
    assert as_js["corrections"]["tis_clip"] == 2.0 and isinstance(as_js["corrections"]["tis_clip"], float)
    as_js["corrections"]["tis_clip"] = as_js["corrections"]["icepop_high"] = 2
    assert known_experiment(as_js) is remembered
    as_js["corrections"]["tis_clip"] = 2.5  # any other value: not the remembered experiment
    assert known_experiment(as_js) is None
    # The same B edited by hand (a value, a type, a refused value): validated in full, never the memo's.
    for path, value in (("rollout.temperature", 0.5), ("rollout.temperature", 1), ("task.num_rollout", 3.0),
                        ("task.num_rollout", 0), ("task.input_key", "-x")):
        sent = json.loads(json.dumps(ws))
        section, name = path.split(".")
        sent["b"][section][name] = value
        assert known_experiment(sent["b"]) is None, (path, value)
        r = client.post("/api/workspace", json={"workspace": sent, "action": {"type": "view"}})
        fresh = Workspace.model_validate(sent).b if r.status_code == 200 else None
        if fresh is None:  # refused with the field named, as without any memo
            assert r.status_code == 422 and r.json()["detail"][0]["loc"][-2:] == [section, name], (path, value)
        else:
            assert r.json()["workspace"]["b"] == fresh.model_dump(mode="json"), (path, value)
    # An edit after an answer from memory is the edit, not the remembered experiment.
    again = client.post("/api/workspace", json={"workspace": ws, "action": {"type": "edit", "path": "rollout.temperature",
                                                                            "value": 0.7}}).json()
    assert again["workspace"]["b"]["rollout"]["temperature"] == 0.7
    assert len(SENT_EXPERIMENTS) <= SENT_EXPERIMENTS.size and len(change.VALIDATED) <= change.VALIDATED.size


def test_a_strict_check_is_not_answered_by_a_lax_memo():
    """rules.validated is strict: contents that only lax validation accepts are refused, whatever was sent before."""
    from lab.core.workspace import SENT_EXPERIMENTS, remember_sent

    exp = fresh_workspace().b
    data = exp.model_dump(mode="json")
    data["task"]["num_rollout"] = "7"  # lax validation makes it 7; strict refuses a string
    remember_sent(exp, data)  # even if such contents were ever remembered as sent
    with pytest.raises(change.ChangeError):
        change.validated(data)
    SENT_EXPERIMENTS.clear()


def test_an_edited_source_gives_a_new_provenance_record_at_once(tmp_path, monkeypatch):
    from lab.core import provenance as P
    from lab.core.recipes import REPO_ROOT, get_recipe

    recipe = get_recipe("glm4-9b")
    first = P.provenance(recipe, "x")
    assert P.provenance(recipe, "x") is first  # remembered while nothing changed
    spec = REPO_ROOT / recipe.model_spec
    st = spec.stat()
    try:
        os.utime(spec, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # touched: hashed again
        assert P.provenance(recipe, "x") is not first
    finally:
        os.utime(spec, ns=(st.st_atime_ns, st.st_mtime_ns))
    copy = tmp_path / "spec.sh"
    copy.write_bytes(spec.read_bytes() + b"# edited\n")
    monkeypatch.setattr(P, "_source_paths", lambda r: {"recipe": f"recipes/{r.name}.yaml", "model_spec": str(copy)})
    rec = P.provenance(recipe, "x")
    assert rec["sources"]["model_spec"]["sha256"] != first["sources"]["model_spec"]["sha256"]
    copy.write_bytes(spec.read_bytes() + b"# edited again, same size\n"[:9])
    os.utime(copy, ns=(copy.stat().st_atime_ns, copy.stat().st_mtime_ns + 2_000_000))
    assert P.provenance(recipe, "x")["sources"]["model_spec"]["sha256"] != rec["sources"]["model_spec"]["sha256"]
    P.reset_cache()
    assert P.provenance(recipe, "x") is not first and len(P._RECORDS) == 1
