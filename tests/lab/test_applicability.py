"""The page folds controls that cannot apply to the current choices (lab/rules/applicability.py), and
recipes start from ordinary serving with EAGLE as the next step."""
from __future__ import annotations

from fastapi.testclient import TestClient

from lab.core.experiment import Experiment
from lab.core.recipes import all_recipes
from lab.rules.applicability import folded_fields
from lab.web.app import create_app
from lab.web.page import field_specs


def _view(edits: dict | None = None) -> dict:
    client = TestClient(create_app(), base_url="http://127.0.0.1")
    v = client.post("/api/workspace", json={"workspace": None, "action": {"type": "view"}}).json()
    if edits:
        v = client.post("/api/workspace", json={"workspace": v["workspace"],
                                                "action": {"type": "edit_many", "values": edits, "label": "t"}}).json()
    return v


def test_switched_off_features_fold_their_settings_and_switching_on_unfolds_them() -> None:
    v = _view({"model.recipe": "glm4-9b"})
    folded = set(v["folded"])
    assert {"serving.pd.prefill_engines", "serving.pd.decode_engines", "serving.pd.rdma_devices",
            "task.custom_generate_path", "task.custom_reward_path", "precision.recurrent_state_dtype",
            "precision.state_kv_ratio", "serving.eagle.steps"} <= folded
    assert folded <= set(field_specs())
    assert "serving.pd.enabled" not in folded and "serving.eagle.enabled" not in folded  # the switches stay
    on = set(_view({"model.recipe": "glm4-9b", "serving.pd.enabled": True, "task.kind": "custom"})["folded"])
    assert not on & {"serving.pd.prefill_engines", "serving.pd.rdma_devices", "task.custom_generate_path"}


def test_hybrid_controls_appear_only_for_hybrid_models() -> None:
    assert "precision.state_kv_ratio" not in _view({"model.recipe": "qwen3.8-27b"})["folded"]
    for name, recipe in all_recipes().items():
        f = folded_fields(Experiment(), recipe.kind)
        assert ("precision.state_kv_ratio" in f) == (recipe.kind != "hybrid"), name


def test_a_field_named_by_a_finding_is_never_folded() -> None:
    exp = Experiment()
    assert "serving.pd.rdma_devices" in folded_fields(exp, "dense")
    assert "serving.pd.rdma_devices" not in folded_fields(exp, "dense", ["serving.pd.rdma_devices"])


def test_every_recipe_starts_from_ordinary_serving_with_eagle_ready_as_the_next_step() -> None:
    with_draft = 0
    for name in all_recipes():
        v = _view({"model.recipe": name})
        b = v["workspace"]["b"]
        assert b["serving"]["eagle"]["enabled"] is False, name
        with_draft += all_recipes()[name].rollout.eagle is not None
        eagle_files = [f for f, text in v["files"].items() if "speculative" in text]
        assert not eagle_files, (name, eagle_files)
    assert with_draft >= 5  # the draft settings are still there for the next step


def test_every_recipe_carries_its_summary_and_notes_in_chinese_and_the_api_sends_them():
    for name, recipe in all_recipes().items():
        zh = recipe.translations.get("zh")
        assert zh is not None and zh.summary, f"{name}: no Chinese summary"
        assert len(zh.notes) == len(recipe.notes), f"{name}: the Chinese notes do not match the English ones"
    client = TestClient(create_app(), base_url="http://127.0.0.1")
    body = {"workspace": None, "action": {"type": "edit", "path": "model.recipe", "value": "glm5.3"}, "lang": "zh"}
    r = client.post("/api/workspace", json=body).json()["recipe"]
    assert r["summary"] == all_recipes()["glm5.3"].translations["zh"].summary and "稀疏注意力" in r["summary"]
    assert all(any("\u4e00" <= ch <= "\u9fff" for ch in n) for n in r["notes"])


def test_server_errors_are_ids_with_parameters_localised_at_the_api_edge():
    client = TestClient(create_app(), base_url="http://127.0.0.1")
    ws = client.post("/api/workspace", json={"workspace": None, "action": {"type": "view"}}).json()["workspace"]
    cases = [
        ({"type": "edit", "path": "task.n_samples_per_prompt", "value": 0}, "error.range", "超出允许范围"),
        ({"type": "edit", "path": "task.num_rollout", "value": "many"}, "error.wrong_type", "类型错误"),
        ({"type": "edit", "path": "placement.ownrship", "value": "x"}, "error.unknown_field_hint", "未知字段"),
        ({"type": "load_json", "text": "{not json"}, "input.not_json", "不是合法的 JSON"),
        ({"type": "open_share", "link": "https://x/#s=@@@"}, "error.share.corrupt", "分享链接已损坏"),
        ({"type": "restore_a"}, "error.no_a", "尚未保存 A"),
    ]
    for action, key, zh_text in cases:
        en = client.post("/api/workspace", json={"workspace": ws, "action": action}).json()["detail"][0]
        zh = client.post("/api/workspace", json={"workspace": ws, "action": action, "lang": "zh"}).json()["detail"][0]
        assert en["key"] == zh["key"] == key and en["params"] == zh["params"], (action, en, zh)
        assert zh_text in zh["msg"] and zh["msg"] != en["msg"], zh
        assert not any(w in zh["msg"] for w in ("must", "unknown", "wrong", "not valid", "corrupt")), zh["msg"]
