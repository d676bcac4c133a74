"""English and Chinese: the same keys in both locale files, and no English left in the zh controls."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import assert_clean, wait_until

from lab.experiment import LEAF_FIELDS

LOCALES = Path(__file__).resolve().parents[2] / "lab" / "static" / "locales"

# Proper nouns, flags and file names that stay as they are in Chinese text, plus the technical
# terms the Chinese tutorial (the spec of the zh wording) itself leaves in English.
ALLOWED = {
    "token", "serving", "MoE", "mask", "batch", "micro-batch", "staleness", "Attention", "attention",
    "hybrid", "Hybrid", "score", "rank", "all-reduce", "all-gather", "all-to-all", "zigzag", "key", "value",
    "DSA", "Mamba", "GDN", "SSM", "InfiniBand", "Hugging", "Face", "parquet", "checkout", "tokenizer",
    "REINFORCE++",
    "GLM", "SGLang", "TP", "PP", "CP", "EP", "DP", "ZeRO", "FP8", "FP32", "BF16", "INT4", "E4M3", "Ray",
    "experiment.sh", "experiment.json", "serving-reference.sh", "JSON", "JSONL", "GPU", "CPU", "Adam",
    "GRPO", "GSPO", "PPO", "REINFORCE", "TIS", "IcePop", "R3", "SC", "PD", "HiCache", "EAGLE", "MTP",
    "RDMA", "HF", "KV", "ID", "RL", "straw", "torch_dist", "deepscaler", "dapo", "math", "f1", "Megatron",
    "Mooncake", "Serving", "Prompt", "prompt", "label", "rollout", "Rollout", "Partial", "chat", "template",
    "Advantage", "top-k", "dtype", "checkpoint", "Checkpoint", "beta", "Prefill", "Decode", "prefill",
    "decode", "hook", "Agent", "slime", "Quick", "Start", "English", "A", "B", "GiB", "GB", "N_actor",
}


def _keys(obj, prefix=""):
    if isinstance(obj, dict):
        out = set()
        for k, v in obj.items():
            out |= _keys(v, f"{prefix}{k}\x00")
        return out
    return {prefix}


def test_locales_have_the_same_keys_and_cover_every_field():
    en = json.loads((LOCALES / "en.json").read_text(encoding="utf-8"))
    zh = json.loads((LOCALES / "zh.json").read_text(encoding="utf-8"))
    assert _keys(en) == _keys(zh)
    assert set(en["fields"]) == set(LEAF_FIELDS)
    for path, f in zh["fields"].items():
        assert f["label"].strip() and f["help"].strip(), path
    placeholders = re.compile(r"\{(\w+)\}")
    for k in en["ui"]:
        assert set(placeholders.findall(en["ui"][k])) == set(placeholders.findall(zh["ui"][k])), k


def _leftovers(text: str) -> list[str]:
    text = re.sub(r"--[a-z0-9-]+", " ", text)  # command-line flags stay as users type them
    text = re.sub(r"[\w.\-]+\.(sh|py|jsonl|json|yaml)\b", " ", text)  # file names
    text = re.sub(r"\S*[_/:<>]\S*", " ", text)  # code: paths, dotted hooks, host:port, tags, ids
    words = re.findall(r"[A-Za-z][A-Za-z0-9_.+\-]*", text)
    return [w for w in words if w not in ALLOWED and w.rstrip(".") not in ALLOWED and len(w) > 1]


@pytest.mark.browser
def test_chinese_page_has_no_english_leftovers_in_its_controls(new_page):
    page = new_page(lang="zh")
    assert page.evaluate("document.documentElement.lang") == "zh-CN"
    texts = page.evaluate("""() => {
        const out = [];
        const skip = (el) => el.closest('[data-field="model.recipe"], [data-field="install.image"], #lang');
        const sel = 'label, option, button, summary, nav a, h1, h2, h3, .legend, .private-marker, .help, .lead, ' +
                    '.stepnav, #derived dt, .walk-controls, .tabs, figcaption span';
        for (const el of document.querySelectorAll(sel)) {
            if (skip(el)) continue;
            const t = (el.innerText || el.textContent || '').trim();
            if (t) out.push(t);
        }
        return out;
    }""")
    assert len(texts) > 200
    bad = {t: _leftovers(t) for t in texts if _leftovers(t)}
    assert not bad, "\n".join(f"{t!r}: {w}" for t, w in bad.items())
    assert_clean(page)


@pytest.mark.browser
def test_language_switch_is_remembered(new_page):
    page = new_page()
    assert page.evaluate("document.documentElement.lang") == "en"
    page.select_option("#lang", "zh")
    wait_until(page, "document.documentElement.lang === 'zh-CN'")
    assert page.locator('label[for="f-placement-ownership"]').inner_text() == "GPU 归属"
    page.reload()
    page.wait_for_selector("body[data-ready='1']")
    assert page.evaluate("document.documentElement.lang") == "zh-CN"
    assert page.locator("#undo").inner_text() == "撤销"
    assert_clean(page)
