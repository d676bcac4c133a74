"""The runtime's refusals live once: each is a stable code with parameter names (slime/refusals.py),
worded once per language in slime/locales/refusals.<lang>.json, which the runtime prints (in
SLIME_LANG) and the lab shows (in the page's language): the same text, never a copy."""
from __future__ import annotations

import collections
import json
import os
import pickle
import re
import subprocess
import sys

import pytest

from lab.core.messages import LANGS, LOCALE_DIR, catalogue, localize_finding, localize_text, placeholders
from lab.rules.dependents import apply_change, new_experiment
from lab.rules.runtime_verdict import RUNTIME_KEY, runtime_finding
from lab.rules.validate import validate
from slime.dry_run import dry_run
from slime.refusals import CATALOGUE_DIR, LANG_ENV, Refusal, all_codes
from slime.refusals import catalogue as runtime_catalogue
from tests.refusal_codes import codes

CODES = all_codes()
SPAN = re.compile(r"`([^`]*)`")


def _sample(code: str) -> Refusal:
    """A refusal of `code` with a distinct value for each declared parameter."""
    return Refusal(code, {name: f"<{name}>" for name in CODES[code]})


def test_the_runtime_declares_its_codes_and_they_are_many():
    assert len(CODES) > 100 and "args.tis_icepop" in CODES and "megatron.context_parallel" in CODES


def test_every_declared_code_is_worded_in_every_language_with_its_declared_parameters():
    for lang in LANGS:
        words = runtime_catalogue(lang)
        missing = sorted(set(CODES) - set(words))
        assert not missing, (lang, missing)
        wrong = {c: (placeholders(words[c]), CODES[c]) for c in CODES if set(placeholders(words[c])) != set(CODES[c])}
        assert not wrong, (lang, wrong)
    for code in CODES:
        en = runtime_catalogue("en")[code]
        for lang in LANGS:
            text = runtime_catalogue(lang)[code]
            # flags, values and paths stay literal (the same code spans) in every language
            assert collections.Counter(SPAN.findall(text)) == collections.Counter(SPAN.findall(en)), (lang, code)
            assert text.count("`") % 2 == 0, (lang, code)


def test_no_catalogue_entry_without_a_declared_code():
    for lang in LANGS:
        data = json.loads((CATALOGUE_DIR / f"refusals.{lang}.json").read_text(encoding="utf-8"))
        stale = {k for k in data if not k.startswith("_")} - set(CODES)
        assert not stale, (lang, stale)
        stale = {k for k in catalogue(lang) if k.startswith("runtime.")} - {RUNTIME_KEY.format(code=c) for c in CODES}
        assert not stale, (lang, stale)


def test_the_lab_keeps_no_copy_of_the_runtime_wording():
    for lang in LANGS:
        own = json.loads((LOCALE_DIR / f"messages.{lang}.json").read_text(encoding="utf-8"))
        assert not [k for k in own if k.startswith("runtime.")], lang


def test_the_lab_shows_the_text_the_runtime_prints_in_each_language():
    for code in CODES:
        refusal = _sample(code)
        text = runtime_finding("error", ["model.recipe"], refusal).params["text"]
        assert isinstance(text, dict), code
        for lang in LANGS:
            shown = localize_text(text["key"], text["params"], lang)
            assert shown.replace("`", "") == refusal.text(lang), (code, lang)


def test_slime_lang_picks_the_runtime_catalogue(monkeypatch):
    r = Refusal("args.min_lr", {"min_lr": 2.0, "lr": 1.0})
    monkeypatch.setenv(LANG_ENV, "zh_CN.UTF-8")
    zh = Refusal("args.min_lr", {"min_lr": 2.0, "lr": 1.0})
    assert zh == r.text("zh") and zh != r and zh.text("en") == r
    assert "--min-lr 2.0" in zh and "`" not in zh  # console text: the flags as they are, unmarked
    # the lab words it by code, in the page's language, whatever the runtime's language
    f = runtime_finding("error", ["model.recipe"], zh)
    assert f.params["reason"] == r
    assert localize_finding(f, "en").message.endswith(runtime_catalogue("en")["args.min_lr"].format(min_lr=2.0, lr=1.0))
    monkeypatch.setenv(LANG_ENV, "fr")  # a language without a catalogue: English
    assert Refusal("args.min_lr", {"min_lr": 2.0, "lr": 1.0}) == r


def test_a_refusal_keeps_its_code_through_pickling_and_prints_its_english():
    r = Refusal("args.min_lr", {"min_lr": 2.0, "lr": 1.0})
    assert r == "--min-lr 2.0 must lie in [0, --lr 1.0]"
    back = pickle.loads(pickle.dumps(r))
    assert back.code == "args.min_lr" and back.params == {"min_lr": 2.0, "lr": 1.0} and back == r


def test_a_refusal_from_a_module_the_reader_never_imported_unpickles_in_its_own_words():
    """A Ray actor's refusal reaches a driver that never imported the module declaring its code (the
    Megatron backend's optimizer-resume refusal, in train.py's driver): it must read back as that
    refusal, not as Ray's "Failed to deserialize exception"."""
    from slime.backends.megatron.optimizer_resume import optimizer_resume_refusal

    saved = {"optimizers": 2, "ep": 2}
    now = {"optimizers": 1, "ep": 1}
    r = optimizer_resume_refusal(saved, now)
    assert isinstance(r, Refusal) and r.code == "megatron.resume.optimizer_count"
    reader = ("import pickle, sys; import slime.refusals as R; r = pickle.loads(sys.stdin.buffer.read()); "
              "assert 'slime.backends.megatron.optimizer_resume' not in sys.modules; "
              "print(type(r).__name__, r.code, r.params['ep_saved'], str(r))")
    out = subprocess.run([sys.executable, "-c", reader], input=pickle.dumps(r), capture_output=True, check=True,
                         env={**os.environ, LANG_ENV: "en"}).stdout.decode()
    assert out.strip() == f"Refusal megatron.resume.optimizer_count 2 {r}"


def test_parser_refusals_have_codes_too():
    errors = dry_run(["--use-scx", "1", "--kl-los-type"]).errors
    assert codes(errors) == ["usage.unknown_flag_hint", "usage.unknown_flag_hint"]
    assert errors[0].params == {"flag": "--use-scx", "close": "--use-sc"}
    (choice,) = dry_run(["--kl-loss-type", "k9"]).errors
    assert choice.code == "usage.invalid_choice" and choice.params["flag"] == "--kl-loss-type"


def test_a_runtime_refusal_reads_in_chinese_with_its_flags_as_code():
    exp, _ = apply_change(new_experiment("glm4.7"), "corrections.sc", True)
    (f,) = [f for f in validate(exp) if f.params.get("code") == "args.sc_ratio"]
    assert f.params["reason"].startswith("--use-sc with --use-tis:")  # the runtime's own English
    zh = localize_finding(f, "zh")
    assert zh.message == "运行时拒绝：`--use-sc` 与 `--use-tis` 同时开启：SC 已经用截断后的序列比值（`--tis-clip`）给每个样本加权；请去掉 `--use-tis`"
    assert "`--use-sc` with `--use-tis`" in localize_finding(f, "en").message


def test_a_refusal_without_a_worded_code_falls_back_to_the_runtime_english():
    plain = runtime_finding("error", ["model.recipe"], "a message written without a code")
    assert plain.params == {"reason": "a message written without a code", "code": None,
                            "text": "a message written without a code"}
    assert localize_finding(plain, "zh").message == "运行时拒绝：a message written without a code"
    unknown = Refusal("args.tis_icepop")
    unknown.code = "nowhere.unknown"  # a code this lab's catalogue does not word (e.g. a newer runtime)
    f = runtime_finding("error", ["corrections.tis"], unknown)
    assert f.params["text"] == str(unknown) and localize_finding(f, "zh").message.endswith(str(unknown))


@pytest.mark.parametrize("recipe", ["glm4-9b", "glm4.7", "tiny-cpu"])
def test_every_refusal_the_lab_shows_for_a_recipe_has_a_worded_code(recipe):
    exp = new_experiment(recipe)
    for path, value in (("corrections.sc", True), ("task.n_samples_per_prompt", 1), ("rollout.partial_rollout", True)):
        exp, _ = apply_change(exp, path, value)
    shown = [f for f in validate(exp) if f.id == "RUNTIME" and f.message_id in ("RUNTIME.error", "RUNTIME.warning")]
    assert shown
    assert all(isinstance(f.params["text"], dict) for f in shown), [f.params["reason"] for f in shown]


def test_the_code_registry_imports_neither_torch_nor_ray():
    import subprocess
    import sys

    probe = ("import sys; from slime.refusals import all_codes; all_codes(); "
             "print(sorted(m for m in ('torch', 'ray') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_declaration_takes_parameter_names_not_a_template():
    from slime.refusals import declare

    with pytest.raises(TypeError, match="slime/locales"):
        declare("test_only", {"old_style": "{flag} is refused"})
