"""English and Chinese: the same keys in both locale files, and no English left in the zh controls."""
from __future__ import annotations

import re

import pytest
from conftest import act, assert_clean, wait_until

from lab.core.experiment import LEAF_FIELDS
from lab.web.page import page_locale

# Proper nouns, flags and file names that stay as they are in Chinese text, plus the technical
# terms the Chinese tutorial (the spec of the zh wording) itself leaves in English.
ALLOWED = {
    "token", "serving", "MoE", "mask", "batch", "micro-batch", "staleness", "Attention", "attention",
    "hybrid", "Hybrid", "score", "rank", "all-reduce", "all-gather", "all-to-all", "zigzag", "key", "value",
    "DSA", "Mamba", "GDN", "SSM", "InfiniBand", "Hugging", "Face", "parquet", "checkout", "tokenizer",
    "REINFORCE++",
    "GLM", "GLM-4-9B", "SGLang", "TP", "PP", "CP", "EP", "DP", "ZeRO", "FP8", "FP32", "BF16", "INT4", "E4M3", "Ray",
    "experiment.sh", "experiment.json", "serving-reference.sh", "rayjob.yaml", "JSON", "JSONL", "GPU", "CPU", "Adam",
    "GRPO", "GSPO", "CISPO", "PPO", "REINFORCE", "TIS", "IcePop", "R3", "SC", "PD", "HiCache", "EAGLE", "MTP",
    "RDMA", "HF", "KV", "ID", "RL", "MFU", "cuBLAS", "straw", "torch_dist", "deepscaler", "dapo", "gpqa", "bash", "RUNTIME", "remote_rm", "boxed_math", "dr_grpo", "math", "f1", "Megatron",
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
    en = page_locale("en")  # en.json + each field's description as its help (lab/web/page.py)
    zh = page_locale("zh")
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


@pytest.mark.browser
def test_counts_agree_with_their_nouns_in_both_languages(new_page):
    probe = """async () => { const m = await import('/static/util.js');
        return [m.tr('srv_engines', {n: 1, e: 1}), m.tr('srv_engines', {n: 3, e: 8}),
                m.tr('cmd_worker', {n: 1}), m.tr('summary_counts', {e: 1, w: 0, i: 2})]; }"""
    en = new_page().evaluate(probe)
    assert en == ["1 engine × 1 GPU", "3 engines × 8 GPUs", "On each of the 1 worker node:",
                  "Static checks: 1 error, 0 warnings, 2 notes."]
    zh = new_page(lang="zh").evaluate(probe)
    assert zh[0] == "1 个引擎 × 每个 1 张 GPU" and zh[1] == "3 个引擎 × 每个 8 张 GPU"
    assert not any("|" in s or "{" in s for s in en + zh)


# Technical words the Chinese tutorial itself keeps in English (or that name code, flags and units).
TUTORIAL_TERMS = {
    "Colocated", "Disaggregated", "External", "External SGLang", "producer",
    "Ray", "worker", "head", "kernel", "shell", "replay", "offload", "Deterministic", "deterministic", "Flash",
    "Gated", "DeltaNet", "Delta", "Net", "FLA", "MLA", "GQA", "Dense", "dense", "repair", "finding", "findings",
    "profiling", "trace", "Trace", "Profiling", "schema", "commit", "hash", "Docker", "tokens", "masks",
    "verifier", "reward", "Reward", "sampler", "server", "launcher", "host", "port", "Batch", "Checkpoint",
    "Prompt", "Agent", "Megatron", "HiCache", "draft", "top-k", "stage", "micro-batch", "query", "rank",
    "int", "float", "bool", "str", "list", "Mooncake", "DeepSeek-R1", "Qwen3", "GLM-4", "GLM-5", "NUL", "UTF-8",
    "fully", "debug", "check", "reference", "trainer", "log-prob", "clipping", "masking", "OOM", "schema-1",
    "choices", "spec", "colocated", "separate", "logits", "float32", "bfloat16", "CUDA", "context", "graph",
    "NCCL", "PyTorch", "Megatron-core", "Hopper", "hopper", "Ampere", "Blackwell", "router", "dispatcher",
    "DP-attention", "old-actor", "OPD", "KL", "radix", "cache", "flash-linear-attention", "DeepSeek", "Qwen3.5",
}
# ids and names that are technical by shape: finding ids (SGL-5, LAB-CKP-1), engine labels (E12), model
# and GPU names (GLM-4.7, Qwen3.8-27B, 355B-A32B, H100), field paths (serving.concurrency)
TECHNICAL = re.compile(r"^([A-Z]+(-[A-Z0-9]+)+|E\d+|H\d+|[A-Za-z]+[-.]?\d[\w.\-]*|\d*B-A\d+B|[a-z_]+\.[a-z_.]+)$")


def _visible_text(page) -> list[str]:
    return page.evaluate("""() => {
        document.querySelectorAll('details').forEach(d => d.open = true);
        const skip = 'pre, code, .cmd, #previews, #provenance-body, #share-link, [data-field="model.recipe"], ' +
                     '[data-field="install.image"], #lang, .diag-cells b, .private-marker + input';
        const out = [];
        const walker = document.createTreeWalker(document.querySelector('main'), NodeFilter.SHOW_TEXT);
        for (let n = walker.nextNode(); n; n = walker.nextNode()) {
            const el = n.parentElement;
            if (!el || el.closest(skip) || el.closest('[hidden]') || !el.offsetParent) continue;
            const t = n.textContent.trim();
            if (t) out.push(t);
        }
        const err = document.querySelector('#error');
        if (err && !err.hidden) out.push(err.textContent.trim());
        return out;
    }""")


def _shown_error(page, fn, expect: str) -> str:
    """Run `fn`, wait for the error banner to show a text containing `expect`, return the banner."""
    page.evaluate("document.querySelector('#error').textContent = ''")
    fn()
    wait_until(page, f"document.querySelector('#error').textContent.includes({expect!r})")
    return page.locator("#error").inner_text()


def _server_errors(page) -> list[str]:
    """The server's refusals of a bad field value, a bad launch script and a bad schema 1 file,
    as the page shows them: each worded in Chinese from its catalogue key (lab/locales/messages.zh.json)."""
    def load(name: str, body: bytes):
        return lambda: page.set_input_files("#load-json", files=[{"name": name, "mimeType": "text/plain", "buffer": body}])

    def edit(path: str, value: str):
        return lambda: (page.fill(f'[data-field="{path}"]', value), page.locator(f'[data-field="{path}"]').dispatch_event("change"))

    shown = [
        _shown_error(page, edit("paths.hf_checkpoint", "-weights"), "不能以"),
        _shown_error(page, edit("task.n_samples_per_prompt", "0"), "超出允许范围"),
        _shown_error(page, load("run-bad.sh", b"#!/bin/bash\nARGS=(\n  --num-rollout 3\n"), "第 2 行"),
        _shown_error(page, load("no-train.sh", b"#!/bin/bash\necho hi\n"), "没有任何命令运行"),
        _shown_error(page, load("old.json", b'{"schema": 1, "choices": {"foo": 1}}'), "未知的键"),
        _shown_error(page, load("section.json", b'{"task": {"input_key": "-x"}}'), "不能以"),
    ]
    assert all("未应用" in e for e in shown), shown  # the page's own prefix is Chinese too
    page.lab.errors.clear()  # each 422 is logged by Chromium as a failed resource load
    return [e.replace("'foo'", "").replace("ARGS=(", "") for e in shown]  # the user's own words, quoted back


@pytest.mark.browser
@pytest.mark.parametrize("recipe", ["glm4-9b", "glm4.7", "qwen3.8-27b"])
def test_chinese_page_has_no_english_after_every_step_and_a_server_error(new_page, recipe):
    page = new_page(lang="zh")
    act(page, lambda: page.select_option('[data-field="model.recipe"]', recipe))
    for switch in ("serving.pd.enabled", "serving.hicache.enabled", "serving.eagle.enabled", "evaluation.enabled"):
        act(page, lambda: page.locator(f'[data-field="{switch}"]').check())
    seen: list[str] = []
    for step in ["intro"] + [f"step-{i}" for i in range(1, 7)] + ["export"]:
        page.locator(f'[data-goto="{step}"]').first.click()
        seen += _visible_text(page)
    page.set_input_files("#load-json", files=[{"name": "broken.json", "mimeType": "application/json", "buffer": b"{not json"}])
    wait_until(page, "document.querySelector('#error').textContent.includes('broken.json')")
    error = page.locator("#error").inner_text()
    assert "JSON" in error and "不是合法的" in error, error
    seen += _visible_text(page)
    seen += _server_errors(page)
    allowed = ALLOWED | TUTORIAL_TERMS
    leftovers = {t: [w for w in _leftovers(t) if w not in allowed and w.rstrip(".,;:)") not in allowed
                     and not TECHNICAL.match(w.rstrip(".,;:)"))] for t in set(seen)}
    leftovers = {t: w for t, w in leftovers.items() if w}
    assert len(seen) > 300
    assert not leftovers, "\n".join(f"{t!r}: {w}" for t, w in sorted(leftovers.items()))


@pytest.mark.browser
def test_chinese_page_words_the_runtime_refusals_in_chinese(new_page):
    """A GPU recipe with CP > 1 (refused by the runtime: no Transformer Engine) and SC with TIS
    (refused: the ratio would weigh the loss twice): the runtime's codes are worded in Chinese,
    with flags and values as code, and no refusal falls back to the runtime's English."""
    page = new_page(lang="zh")
    act(page, lambda: page.select_option('[data-field="model.recipe"]', "glm4-9b"))
    act(page, lambda: page.locator('[data-field="corrections.tis"]').check())
    act(page, lambda: page.locator('[data-field="corrections.sc"]').check())
    found = page.evaluate("""() => Array.from(document.querySelectorAll('.finding:not(.ref)')).filter(
        (el) => (el.querySelector('b')?.textContent || '').includes('RUNTIME')).map((el) => {
            const copy = el.cloneNode(true);
            copy.querySelectorAll('code, b, button').forEach((c) => c.remove());
            return {prose: copy.textContent, codes: Array.from(el.querySelectorAll('code')).map((c) => c.textContent),
                    verbatim: el.querySelectorAll('code.runtime-reason').length};
        })""")
    codes = {c for f in found for c in f["codes"]}
    assert {"--context-parallel-size 2", "--use-sc", "--use-tis"} <= codes, found
    assert all(f["verbatim"] == 0 and "运行时拒绝" in f["prose"] for f in found), found
    allowed = ALLOWED | TUTORIAL_TERMS
    leftovers = {f["prose"]: [w for w in _leftovers(f["prose"]) if w not in allowed
                              and w.rstrip(".,;:)") not in allowed and not TECHNICAL.match(w.rstrip(".,;:)"))]
                 for f in found}
    assert not {t: w for t, w in leftovers.items() if w}, leftovers
    assert_clean(page)
