"""The message catalogue: en and zh have the same keys and placeholders, and every finding, dependent
change reason, repair title, history label and memory text the lab produces is a catalogue key with
parameters, localized to Chinese without a missing key, while the English output stays what the
rules wrote. Nothing is matched back from English."""
from __future__ import annotations

import re
import string

import pytest
from test_rules_findings import CASES  # the rule cases: each fires one rule

from lab.core import messages
from lab.core.change import ChangeError, validated
from lab.core.experiment import set_path
from lab.core.findings import Finding
from lab.core.messages import (
    catalogue,
    localize_change,
    localize_entry,
    localize_finding,
    localize_memory,
    localize_repair,
    localize_text,
    normalize_lang,
    placeholders,
    render,
)
from lab.core.recipes import all_recipes
from lab.rules.dependents import apply_change, new_experiment
from lab.rules.memory import EXCLUSION_IDS, EXCLUSIONS, estimate_memory
from lab.rules.validate import validate

CJK = re.compile(r"[\u4e00-\u9fff]")
RECIPES = list(all_recipes())
EN, ZH = catalogue("en"), catalogue("zh")
FINDING_KEYS = [k for k in EN if k.endswith((".message", ".fix")) and not k.startswith(messages.TEXT_NAMESPACES)]

# Toggles that trigger many rules on every recipe (set directly, without dependent changes).
TOGGLES = [
    {},
    {"install.image": "my/own:image"},
    {"precision.recurrent_state_dtype": "float32", "precision.state_kv_ratio": 0.5},
    {"resources.cp": 4}, {"resources.ep": 3}, {"resources.pp": 4}, {"resources.tp": 3}, {"resources.tp": 8},
    {"placement.scheduling": "async", "evaluation.enabled": True, "rollout.partial_rollout": True, "task.num_steps_per_rollout": 2},
    {"placement.ownership": "external", "serving.pd.enabled": True, "serving.hicache.enabled": True},
    {"serving.hicache.enabled": True, "serving.mem_fraction_static": 0.9},
    {"serving.eagle.enabled": True, "serving.eagle.head": "separate"},
    {"precision.training": "fp8", "precision.rollout": "int4", "precision.kv_cache_dtype": "fp8_e4m3",
     "corrections.tis": False, "corrections.icepop": False},
    {"install.image": "slimerl/slime:0.1.0-cu130-ampere", "precision.training": "fp8", "precision.rollout": "fp8"},
    {"task.kind": "custom", "task.custom_generate_path": "bad path", "task.label_key": ""},
    {"paths.load": "/data/x", "paths.save": "", "paths.prompt_data": "", "evaluation.enabled": True, "evaluation.data_path": ""},
    {"placement.ownership": "disaggregated", "placement.rollout_gpus": 3, "serving.pd.enabled": True},
    {"corrections.r3": True, "corrections.tis": True, "corrections.icepop": True, "rollout.queue": True},
    {"task.num_steps_per_rollout": 7, "task.n_samples_per_prompt": 1, "rollout.over_sampling_batch_size": 1},
    {"resources.pp": 2, "resources.pp_first_stage_layers": 3, "resources.pp_last_stage_layers": 2},
    {"resources.pp_first_stage_layers": 3}, {"placement.gpus_per_node": 0}, {"placement.engine_gpus": 0},
    {"placement.engine_gpus": 12, "placement.rollout_gpus": 24}, {"placement.train_gpus": 64},
    {"advanced.extra_flags": "0.3 --eps-clip"}, {"advanced.extra_flags": "--eps-clip '0.3"},
    {"advanced.extra_flags": "--rm-type math"}, {"advanced.extra_flags": "--dry-run"},
]


def _raw(recipe: str, changes: dict):
    data = new_experiment(recipe).model_dump(mode="json")
    for path, value in changes.items():
        set_path(data, path, value)
    return validated(data)


def _sweep():
    """(name, experiment): every recipe × the toggles and the rule cases' changes, plus the cases."""
    seen = []
    for recipe in RECIPES:
        for i, changes in enumerate(TOGGLES + [c[2] for c in CASES]):
            try:
                seen.append((f"{recipe}/{i}", _raw(recipe, changes)))
            except ChangeError:
                continue
    for case in CASES:
        seen.append((case[0], _raw(case[1], case[2])))
    return seen


SWEEP = _sweep()


def _check_zh(text: str, what: str) -> None:
    assert text and CJK.search(text), f"{what}: no Chinese in {text!r}"


# --- the catalogues ---------------------------------------------------------------------------------

def test_en_and_zh_have_the_same_keys():
    assert sorted(set(EN) - set(ZH)) == [], "keys without a Chinese text"
    assert sorted(set(ZH) - set(EN)) == [], "Chinese keys without an English text"


@pytest.mark.parametrize("key", sorted(EN))
def test_same_placeholders_in_both_languages(key):
    def fields(t):
        return sorted({(name, spec) for _, name, spec, _ in string.Formatter().parse(t) if name is not None})
    assert fields(EN[key]) == fields(ZH[key]), key


def test_chinese_texts_are_chinese():
    # term.* are fragments inside other texts (GPU arithmetic, "FP8 rollout"): technical terms kept as is.
    missing = [k for k, v in ZH.items() if not k.startswith("term.") and not CJK.search(v)]
    assert missing == []


def test_every_finding_text_has_both_parts():
    prefixes = {k.rsplit(".", 1)[0] for k in FINDING_KEYS}
    for p in prefixes:
        assert f"{p}.message" in EN and f"{p}.fix" in EN, p


@pytest.mark.parametrize("key", sorted(k for k in EN if k.startswith(messages.TEXT_NAMESPACES)))
def test_every_text_key_renders_in_both_languages(key):
    sample = {name: 7 for name in placeholders(EN[key])}
    assert "{" not in render(key, sample, "en") and "{" not in render(key, sample, "zh")


def test_language_names():
    assert normalize_lang("zh-CN") == normalize_lang("zh_Hans") == normalize_lang("ZH") == "zh"
    assert normalize_lang(None) == normalize_lang("fr") == normalize_lang("") == "en"
    with pytest.raises(messages.MissingMessage):
        render("NO-SUCH.message", {}, "zh")
    assert localize_text("PAR-1.fix", {"n": 8, "choices": "TP 1/PP 1/CP 1 → DP 8"}, "zh") == "8 张 GPU 的可选组合：TP 1/PP 1/CP 1 → DP 8。"


# --- findings ---------------------------------------------------------------------------------------

def test_sweep_covers_most_finding_texts():
    used = {f.message_id for _, exp in SWEEP for f in validate(exp)}
    defined = {k.rsplit(".", 1)[0] for k in FINDING_KEYS}
    # PAR-6 and router groups need an inconsistent model spec, LAB-MODEL-* a broken recipe: rendered below.
    assert defined - used <= {"PAR-6.dsa", "PAR-6.non_dsa", "PAR-2.router_groups", "LAB-MODEL-1", "LAB-MODEL-2",
                              "RES-4.no_gpu"}, defined - used
    assert len(used) >= 60


@pytest.mark.parametrize("key", FINDING_KEYS)
def test_every_finding_text_renders_in_both_languages(key):
    sample = {name: 7 for name in placeholders(EN[key])}
    for lang in ("en", "zh"):
        assert "{" not in render(key, sample, lang).replace("{{", "")


def test_every_finding_of_the_sweep_localizes_to_chinese():
    count = 0
    for name, exp in SWEEP:
        for f in validate(exp):
            assert f.message_id, f"{name}: {f.id} has no message_id"
            assert f.message == render(f"{f.message_id}.message", f.params, "en")
            assert f.fix == render(f"{f.message_id}.fix", f.params, "en")
            zh = localize_finding(f, "zh")
            _check_zh(zh.message, f"{name} {f.message_id}.message")
            _check_zh(zh.fix, f"{name} {f.message_id}.fix")
            assert (zh.id, zh.level, zh.fields, zh.message_id, zh.params) == (f.id, f.level, f.fields, f.message_id, f.params)
            # the page's JSON goes through the same function
            assert localize_finding(f.model_dump(mode="json"), "zh") == zh.model_dump(mode="json")
            count += 1
    assert count > 1000


def test_english_is_the_default_and_unchanged():
    f = validate(_raw("glm4-9b", {"resources.tp": 4}))[0]
    assert localize_finding(f, "en") == f and localize_finding(f, None) == f
    assert f.message.startswith("TP×PP×CP = 4×1×2 = 8 does not divide the 4 training GPUs")
    assert localize_finding(f, "zh").message.startswith("TP×PP×CP = 4×1×2 = 8 不能整除 4 张训练 GPU")


def test_nested_terms_are_localized():
    f = next(f for f in validate(_raw("glm4-9b", {"precision.training": "fp8"})) if f.id == "LAB-PRC-1")
    assert f.message.startswith("FP8 training is experimental for ")
    assert "FP8 训练" in localize_finding(f, "zh").message
    f = next(f for f in validate(_raw("glm4-9b", {"placement.ownership": "external", "placement.train_gpus": 64,
                                                  "placement.external_engine_addrs": ["h:1"]})) if f.id == "RES-2")
    assert "(external engines are outside Ray)" in f.message
    assert "外部引擎不在 Ray 内" in localize_finding(f, "zh").message


def test_a_finding_written_in_english_stays_as_it_is():
    f = Finding(id="X-1", level="info", fields=["task.kind"], message="Plain.", fix="Nothing.")
    assert localize_finding(f, "zh") == f


def test_unknown_recipe_finding_localizes():
    data = new_experiment("glm4-9b").model_dump(mode="json")
    data["model"]["recipe"] = "no-such-model"
    exp = validated(data)
    (f,) = validate(exp)
    assert f.id == "LAB-MODEL-1" and f.fix.startswith("Choose one of: ")
    _check_zh(localize_finding(f, "zh").message, "LAB-MODEL-1")


# --- dependent changes, history labels, repairs -----------------------------------------------------

def _change_sweep():
    out = []
    for a in RECIPES:
        base = new_experiment(a)
        for b in RECIPES:
            out += apply_change(base, "model.recipe", b)[1]
        asy = apply_change(base, "placement.scheduling", "async")[0]
        out += apply_change(asy, "placement.scheduling", "async")[1]
        for b in RECIPES:
            out += apply_change(asy, "model.recipe", b)[1]
        out += apply_change(asy, "placement.ownership", "colocated")[1]
        for path, value in (("placement.scheduling", "async"), ("placement.ownership", "colocated"),
                            ("placement.ownership", "disaggregated"), ("placement.nodes", 2), ("placement.gpus_per_node", 4),
                            ("placement.train_gpus", 2), ("placement.rollout_gpus", 2)):
            try:
                out += apply_change(base, path, value)[1]
            except ChangeError:
                pass
    return [c for c in out if c.reason]


def _raw_reasons():
    """Every reason the dependency rules can write, including those whose value happens not to change."""
    from lab.core.recipes import get_recipe
    from lab.rules import dependents as rules

    out = []
    for name in RECIPES:
        recipe = get_recipe(name)
        data = new_experiment(name).model_dump(mode="json")
        out += [r for _, _, r in rules._recipe_values(recipe, data)]
        for nodes in (1, 2, 4):
            data["placement"]["nodes"] = nodes
            out += [r for _, _, r in rules.split_pools(data, recipe)]
        data = new_experiment(name).model_dump(mode="json")
        data["placement"]["scheduling"] = "async"
        for other in RECIPES:
            d = {**data, "placement": dict(data["placement"])}
            out += [r for _, _, r in rules._dependents("model.recipe", other, d, new_experiment(name))]
    return out


def test_every_dependent_change_reason_localizes():
    changes = _change_sweep()
    assert len(changes) > 200
    used = set()
    for c in changes:
        assert c.reason_id, f"{c.path}: a reason without a key: {c.reason!r}"
        assert c.reason == render(c.reason_id, c.reason_params, "en")
        used.add(c.reason_id)
        zh = localize_change(c, "zh")
        _check_zh(zh["reason"], c.path)
        assert {k: v for k, v in zh.items() if k != "reason"} == {k: v for k, v in c.model_dump(mode="json").items() if k != "reason"}
    for reason in _raw_reasons():
        used.add(reason.key)
        _check_zh(render(reason.key, reason.params, "zh"), reason.key)
    unused = {k for k in EN if k.startswith("change.") and k not in ("change.reset", "change.restored_a")} - used
    # no recipe turns TIS or EAGLE on by default (ordinary serving is the starting point) ...
    assert unused <= {"change.recipe.eagle_on", "change.recipe.tis_on"}, unused


def test_history_entries_localize_label_and_reasons():
    from lab.core import workspace
    from lab.rules import edit as E

    ws = E.edit(workspace.Workspace(b=new_experiment("glm4.7")), "placement.scheduling", "async")
    entry = localize_entry(ws.undo[-1], "zh")
    assert entry["label"] == "placement.scheduling" and entry["label_id"] is None  # a field path: the page names it
    assert all(CJK.search(c["reason"]) for c in entry["changes"] if c["reason"])
    ws = E.reset(ws)
    assert (ws.undo[-1].label, ws.undo[-1].label_id) == ("reset", "label.reset")
    assert localize_entry(ws.undo[-1], "zh")["label"] == "重置"
    assert localize_entry({"undone": True, "label_id": "label.grpo", "label": "GRPO starting point", "changes": []}, "zh")["label"] == "GRPO 起点"
    assert localize_entry({"label": "my own label", "changes": []}, "zh")["label"] == "my own label"
    assert localize_entry(None, "zh") is None


def test_a_text_without_a_key_is_never_matched_back_from_english():
    """An entry stored before texts had keys keeps its English words: no regex guesses its key."""
    assert localize_entry({"label": "reset", "changes": [{"path": "task.kind", "reason": EN["change.colocated.equal"]}]},
                          "zh") == {"label": "reset", "changes": [{"path": "task.kind", "reason": EN["change.colocated.equal"]}]}
    assert not hasattr(messages, "match_english")


def test_every_repair_of_the_sweep_localizes():
    from lab.rules.repair import propose_repairs

    count = 0
    for name, exp in SWEEP[:: max(1, len(SWEEP) // 120)] + [(c[0], _raw(c[1], c[2])) for c in CASES]:
        for r in propose_repairs(exp):
            assert r.title == render(r.title_id, r.params, "en"), f"{name}: {r.id}"
            zh = localize_repair(r, "zh")
            _check_zh(zh["title"], f"{name} {r.id}")
            for c in zh["changes"]:
                if c["reason"]:
                    _check_zh(c["reason"], f"{name} {r.id} {c['path']}")
            for f in zh["remaining"] + ([zh["finding"]] if zh.get("finding") else []):
                _check_zh(f["message"], f"{name} {r.id} {f['id']}")
            count += 1
    assert count > 20


# --- memory -----------------------------------------------------------------------------------------

def test_memory_exclusions_are_catalogue_texts():
    assert EXCLUSIONS == [render(k) for k in EXCLUSION_IDS]
    assert all(CJK.search(render(k, {}, "zh")) for k in EXCLUSION_IDS)


@pytest.mark.parametrize("name", RECIPES)
def test_memory_items_and_exclusions_localize(name):
    for rollout in ("bf16", "fp8", "int4"):
        m = estimate_memory(_raw(name, {"precision.rollout": rollout}))
        zh = localize_memory(m, "zh")
        for phase in ("training", "rollout"):
            p = getattr(m, phase)
            assert p.items_gib == {render(i.key, i.params): i.gib for i in p.items}
            assert list(zh[phase]["items_gib"].values()) == list(p.items_gib.values())
            for item in zh[phase]["items_gib"]:
                _check_zh(item, f"{name} {phase} item")
        assert len(zh["exclusions"]) == len(m.exclusions)
        for x in zh["exclusions"]:
            _check_zh(x, f"{name} exclusion")
    assert localize_memory(None, "zh") is None


# --- every key the producers emit ---------------------------------------------------------------------

def _api_entries():
    """History entries written by the API's own actions (labels come from the API, the share module,
    the workspace and the repairs)."""
    from lab.core import share, workspace
    from lab.rules import edit as E
    from lab.rules import open_share
    from lab.rules.repair import apply_repair, propose_repairs
    from lab.web.api_workspace import Action, _apply

    ws = workspace.Workspace(b=new_experiment("glm4-9b"))
    out = []
    for action in (Action(type="edit_many", values={"resources.tp": 1}), Action(type="adopt_grpo"),
                   Action(type="load_json", data={"model": {"recipe": "glm4.7"}}), Action(type="reset")):
        ws = _apply(ws, action)
        out.append(ws.undo[-1])
    ws = workspace.restore_a(E.edit(workspace.save_a(ws), "task.num_rollout", 9))
    out.append(ws.undo[-1])
    opened = open_share.open_share_link(ws, share.encode_link(new_experiment(RECIPES[-1])))
    out.append(opened.undo[-1])
    ab = open_share.open_share_link(E.fresh_workspace(), share.encode_ab_link(new_experiment("glm4-9b"), new_experiment(RECIPES[-1])))
    out.append(ab.undo[-1])
    from test_import_script import FIXTURES  # launch scripts in the form users have them

    script = (FIXTURES / "run-glm4-9B.sh").read_text()
    out.append(_apply(ws, Action(type="import_script", text=script)).undo[-1])
    bad = _raw("glm4-9b", {"resources.tp": 4})
    (r, *_) = propose_repairs(bad)
    out.append(apply_repair(workspace.Workspace(b=bad), r.id).undo[-1])
    return out


# Layouts the memory estimate does not fit (its advice: a layout, one with CPU Adam, none) and a
# variant whose repair is its own (SC on top of a recipe's TIS).
LAYOUT_CASES = [
    ("advice_layout", "glm4-9b", {"resources.tp": 1, "resources.cp": 1}),
    ("advice_cpu_adam", "glm4.7", {"resources.cpu_adam": False}),
    ("advice_none", "deepseek-r1", {"placement.train_gpus": 8, "placement.nodes": 2, "resources.tp": 1, "resources.pp": 1,
                                    "resources.ep": 8, "resources.pp_last_stage_layers": None}),
    ("sc_on_tis", "glm4.7", {"corrections.sc": True}),
]


def _emitted():
    """(key, params, English as stored, where) of every text the producers emit over all recipes."""
    from lab.rules.repair import propose_repairs

    out = []
    for c in _change_sweep():
        out.append((c.reason_id, c.reason_params, c.reason, f"change {c.path}"))
    for t in _raw_reasons():
        out.append((t.key, t.params, t.en(), "rule reason"))
    for e in _api_entries():
        if e.label_id:
            out.append((e.label_id, e.label_params, e.label, "history label"))
        out += [(c.reason_id, c.reason_params, c.reason, f"history {c.path}") for c in e.changes if c.reason]
    for name, exp in SWEEP[:: max(1, len(SWEEP) // 120)] + [(c[0], _raw(c[1], c[2])) for c in CASES + LAYOUT_CASES]:
        for r in propose_repairs(exp):
            out.append((r.title_id, r.params, r.title, f"repair {name} {r.id}"))
        for f in validate(exp):  # the memory warning's advice: a text given as a parameter
            advice = f.params.get("advice") if f.id == "LAB-MEM-1" else None
            if advice:
                out.append((advice["key"], advice["params"], render(advice["key"], advice["params"]), f"advice {name}"))
    for name in RECIPES:
        for changes in ({}, {"precision.rollout": "fp8"}, {"precision.state_kv_ratio": 0.5}):
            m = estimate_memory(_raw(name, changes))
            for phase in (m.training, m.rollout):
                out += [(i.key, i.params, render(i.key, i.params), f"memory {name}") for i in phase.items]
            out += [(k, {}, x, "memory exclusion") for k, x in zip(m.exclusion_ids, m.exclusions, strict=True)]
    return out


EMITTED = _emitted()


def test_every_emitted_text_has_both_languages_with_the_same_placeholders():
    assert len(EMITTED) > 500
    for key, params, english, where in EMITTED:
        assert key, f"{where}: a text without a key: {english!r}"
        assert key in EN and key in ZH, f"{where}: {key} is missing from a catalogue"
        assert sorted(placeholders(EN[key])) == sorted(placeholders(ZH[key])), key
        assert set(placeholders(EN[key])) <= set(params), f"{where}: {key} lacks parameters"
        assert english == render(key, params, "en"), where
        _check_zh(render(key, params, "zh"), where)


def test_every_text_key_of_the_catalogue_is_emitted():
    """No dead text: each change/repair/label/memory template is produced by some producer."""
    used = {key for key, *_ in EMITTED}
    defined = {k for k in EN if k.startswith(messages.TEXT_NAMESPACES)}
    # No recipe turns TIS or EAGLE on by default (ordinary serving is the starting point); the A side
    # of an A/B link is built as an entry whose history is dropped (only its experiment is kept).
    assert defined - used <= {"change.recipe.eagle_on", "change.recipe.tis_on", "label.share_a"}, defined - used
