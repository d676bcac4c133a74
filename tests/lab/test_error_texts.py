"""Every refusal the API sends for bad input (a field value, a launch script, a JSON file, a share
link) is a catalogue key with parameters, worded at the API edge in the request's language: a
Chinese page reads Chinese, an English one the same English the CLI prints."""
from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from lab.core.change import ChangeError, validated
from lab.core.messages import localize_text, pydantic_text, render
from lab.rules.import_script import ScriptImportError, import_script
from lab.web.app import create_app

CJK = re.compile(r"[\u4e00-\u9fff]")

BAD = [  # (action, the field the refusal names, the key it carries)
    ({"type": "edit", "path": "task.n_samples_per_prompt", "value": 0}, "task.n_samples_per_prompt", "error.range"),
    ({"type": "edit", "path": "task.n_samples_per_prompt", "value": "abc"}, "task.n_samples_per_prompt", "error.wrong_type"),
    ({"type": "edit", "path": "paths.hf_checkpoint", "value": "-x"}, "paths.hf_checkpoint", "input.dash"),
    ({"type": "edit", "path": "serving.eagle.head", "value": "zz"}, "serving.eagle.head", "error.choice"),
    ({"type": "edit", "path": "task.kindx", "value": 1}, "task.kindx", "error.unknown_field_hint"),
    ({"type": "load_json", "text": '{"task": {"input_key": "a\\nb"}}'}, "task.input_key", "input.char"),
    ({"type": "load_json", "text": '{"schema": 1, "choices": []}'}, "choices", "error.load.s1_choices"),
    ({"type": "load_json", "text": '{"schema": 1, "choices": {"foo": 1}}'}, "choices.foo", "error.load.s1_key"),
    ({"type": "load_json", "text": '{"schema": 1, "choices": {"eval": 3}}'}, "choices.eval", "error.load.s1_eval"),
    ({"type": "load_json", "text": '{"schema": 1, "choices": {"eval": {"x": 1}}}'}, "choices.eval.x", "error.load.s1_eval_key"),
    ({"type": "load_json", "text": '{"schema": 1, "choices": {"tpp": 1}}'}, "choices.tpp", "error.load.s1_key_hint"),
    ({"type": "load_json", "text": '{"schema": 2, "experiment": 3}'}, "experiment", "error.load.experiment"),
    ({"type": "load_json", "text": '{"task": {"kindd": 1}}'}, "task.kindd", "error.load.unknown_field_hint"),
    ({"type": "load_json", "text": "[1]"}, "action.text", "error.load.not_object"),
    ({"type": "import_script", "text": "echo hi\n"}, "action.text", "import.no_entry"),
    ({"type": "import_script", "text": "#!/bin/bash\nARGS=(\n  --num-rollout 3\n"}, "action.text", "import.array_open"),
    ({"type": "import_script", "text": "python train.py --num-rollout abc\n"}, "action.text", "import.bad_value"),
    ({"type": "import_script", "text": "python train.py --rollout-batch-size\n"}, "action.text", "import.no_value"),
    ({"type": "import_script", "text": "python train.py 'abc\n"}, "action.text", "import.syntax.quote"),
    ({"type": "open_share", "link": "#s=zzzz"}, "action.link", "error.share.corrupt"),
]


@pytest.fixture(scope="module")
def client():
    return TestClient(create_app(), base_url="http://127.0.0.1")


def _refusal(client, action, lang):
    r = client.post("/api/workspace", json={"workspace": None, "action": action, "lang": lang},
                    headers={"accept-language": lang})
    assert r.status_code == 422, r.text
    return r.json()["detail"][0]


@pytest.mark.parametrize(("action", "field", "key"), BAD, ids=[k for *_, k in BAD])
def test_a_refusal_is_worded_in_the_pages_language(client, action, field, key):
    zh = _refusal(client, action, "zh")
    assert zh["loc"][-1] == field and zh["key"] == key
    assert zh["msg"] == localize_text(key, zh["params"], "zh") and CJK.search(zh["msg"]), zh
    en = _refusal(client, action, "en")
    assert en["msg"] == render(key, en["params"], "en") and not CJK.search(en["msg"]), en


def test_a_script_error_names_its_line_in_english_for_the_cli():
    with pytest.raises(ScriptImportError) as exc:
        import_script("#!/bin/bash\nARGS=(\n  --num-rollout 3\n")
    assert str(exc.value) == "line 2: the array ARGS=( is never closed with )"
    assert exc.value.key == "import.array_open" and exc.value.params == {"line": 2, "name": "ARGS"}
    assert render(exc.value.key, exc.value.params, "zh") == "第 2 行：数组 ARGS=( 没有以 ) 结束"


def test_a_section_that_is_not_an_object_is_a_catalogue_text():
    with pytest.raises(ChangeError) as exc:
        validated({"task": "x"})
    assert exc.value.field == "task" and exc.value.key == "input.type"
    assert exc.value.message == "wrong type: expected an object"
    assert localize_text(exc.value.key, exc.value.params, "zh") == "类型错误：应为 对象"


def test_a_pydantic_error_without_its_own_text_names_its_type_in_either_language():
    t = pydantic_text({"type": "uuid_parsing", "msg": "Input should be a valid UUID", "ctx": {}})
    assert t.key == "input.invalid" and t.params == {"type": "uuid_parsing"}
    assert "uuid_parsing" in render(t.key, t.params, "zh") and CJK.search(render(t.key, t.params, "zh"))


def _link(envelope: dict) -> str:
    from lab.core.share import _encode

    return "#s=" + _encode(envelope)


@pytest.mark.parametrize(("envelope", "key"), [
    ({"v": 1, "schema": 2, "choices": {"placement": {"nodes": -1}}}, "error.share.refused"),
    ({"v": 1, "schema": 2, "a": {"placement": {"nodes": -1}}, "b": {}}, "error.share.refused_side"),
    ({"v": 1, "schema": 2, "choices": {"paths": {"save": "/x"}}}, "error.share.private"),
    ({"v": 1, "schema": 2, "choices": 3}, "error.share.side"),
    ({"v": 1, "schema": 2, "a": {}}, "error.share.no_choices"),
])
def test_a_refused_share_link_is_worded_in_the_pages_language(client, envelope, key):
    r = client.post("/api/share/open", json={"link": _link(envelope)}, headers={"accept-language": "zh"})
    d = r.json()["detail"][0]
    assert r.status_code == 400 and d["type"] == key and CJK.search(d["msg"]), d
    en = client.post("/api/share/open", json={"link": _link(envelope)}).json()["detail"][0]
    assert not CJK.search(en["msg"]) and en["msg"].startswith(("share link", "this is")), en
