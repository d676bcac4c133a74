"""The documentation in docs/: every English page has a Chinese counterpart with the same heading
structure, every relative link resolves, and every flag the runtime pages name is one the runtime
really accepts (slime.args' parser, its Megatron / --sglang-* pass-through, or SGLang's own flag
table for the engine launch lines), or belongs to a tool whose source spells it.

Light on purpose: slime.args and the SGLang flag table import neither torch nor Ray.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from slime.args import HELP_FLAGS, MEGATRON_FLAGS, MEGATRON_PREFIXES
from slime.flags import describe
from slime.rollout.engines.sglang_flags import FLAGS as SGLANG_FLAGS
from slime.rollout.engines.sglang_flags import canonical as sglang_canonical

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
EN, ZH = DOCS / "en", DOCS / "zh"

# English pages that may lack a Chinese version, each with the reason.
ZH_PENDING: dict[str, str] = {}

# Flags the runtime pages name that are not train.py's: the command they belong to, and the file
# whose text must contain the flag (so a renamed tool flag still fails here).
FOREIGN_FLAGS = {
    "--backend": "tools/convert_hf_to_torch_dist.py",
    "--model-dir": "tools/tiny/prepare.py",
    "--data-dir": "tools/tiny/prepare.py",
    # `ray start` / `ray job submit`, as tools/tiny/run_local.sh runs them
    "--head": "tools/tiny/run_local.sh",
    "--block": "tools/tiny/run_local.sh",
    "--node-ip-address": "tools/tiny/run_local.sh",
    "--port": "tools/tiny/run_local.sh",
    "--dashboard-host": "tools/tiny/run_local.sh",
    "--dashboard-port": "tools/tiny/run_local.sh",
    "--num-cpus": "tools/tiny/run_local.sh",
    "--num-gpus": "tools/tiny/run_local.sh",
    "--address": "tools/tiny/run_local.sh",
    "--runtime-env-json": "tools/tiny/run_local.sh",
    # sglang-router's PD mode, as slime/rollout/router.py launches it
    "--pd-disaggregation": "slime/rollout/router.py",
    "--prefill": "slime/rollout/router.py",
    "--decode": "slime/rollout/router.py",
}

# Pages whose flags are checked, and whether SGLang's own launch flags (--tp-size, ...) are allowed.
FLAG_PAGES = {"runtime.md": False, "rollout-queue.md": False, "rollout-engines.md": True}

FLAG_RE = re.compile(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)(\*?)")
LINK_RE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING_RE = re.compile(r"^(#{1,6})\s")


def _pages(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.md"))


def _prose_lines(text: str) -> list[tuple[int, str, bool]]:
    """(line number, line, inside a fenced code block)."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        out.append((n, line, fenced))
    return out


def _runtime_flags() -> set[str]:
    return {f.name for f in describe()} | {h for h in HELP_FLAGS if h.startswith("--")} | set(MEGATRON_FLAGS)


def _is_sglang_field(name: str) -> bool:
    return sglang_canonical(name.replace("-", "_")) in SGLANG_FLAGS


def test_the_english_pages_are_the_ones_this_test_expects() -> None:
    pages = _pages(EN)
    # Guard against a silently empty or moved folder: these pages must be among those walked.
    assert {"index.md", "lab.md", "provenance.md", "runtime.md", "experiment-sh.md", "rollout-engines.md",
            "rollout-queue.md", "megatron.md"} <= set(pages), pages


def test_every_english_page_has_a_chinese_counterpart() -> None:
    en, zh = _pages(EN), _pages(ZH)
    missing = [p for p in en if p not in zh and p not in ZH_PENDING]
    assert not missing, f"docs/zh lacks {missing}: translate them (or list them in ZH_PENDING with the reason)"
    orphans = [p for p in zh if p not in en]
    assert not orphans, f"docs/zh/{orphans} have no English page"
    done = [p for p in ZH_PENDING if p in zh]
    assert not done, f"{done} now exist in docs/zh: remove them from ZH_PENDING"
    assert len(en) >= 8 and len(zh) == len(en) - len([p for p in ZH_PENDING if p in en]), (en, zh)


@pytest.mark.parametrize("page", [p for p in _pages(EN) if (ZH / p).exists()])
def test_chinese_page_keeps_the_english_heading_structure(page: str) -> None:
    def levels(path: Path) -> list[int]:
        return [len(m.group(1)) for _, line, fenced in _prose_lines(path.read_text(encoding="utf-8"))
                if not fenced and (m := HEADING_RE.match(line))]

    en, zh = levels(EN / page), levels(ZH / page)
    assert en, f"docs/en/{page} has no headings"
    assert zh == en, f"docs/zh/{page} headings {zh} differ from docs/en/{page} {en}"


def _doc_files() -> list[Path]:
    files = sorted(DOCS.rglob("*.md"))
    assert len(files) >= 16, [str(f) for f in files]
    return files


def test_every_relative_link_in_the_docs_resolves() -> None:
    broken, checked = [], 0
    for path in _doc_files():
        for n, line, fenced in _prose_lines(path.read_text(encoding="utf-8")):
            if fenced:
                continue
            for target in LINK_RE.findall(re.sub(r"`[^`]*`", "", line)):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                    continue  # http:, https:, mailto:, or an anchor in the same page
                checked += 1
                file_part = target.split("#", 1)[0]
                if not (path.parent / file_part).exists():
                    broken.append(f"{path.relative_to(REPO)}:{n}: {target}")
    assert not broken, "broken relative links:\n" + "\n".join(broken)
    assert checked >= 20, f"only {checked} relative links found: is the link pattern still right?"


def test_each_page_in_the_index_map_is_linked() -> None:
    for index in (EN / "index.md", ZH / "index.md"):
        text = index.read_text(encoding="utf-8")
        for page in _pages(EN):
            if page != "index.md":
                assert f"({page})" in text or f"(../en/{page})" in text, f"{index.relative_to(REPO)} does not link {page}"


@pytest.mark.parametrize("page,sglang_allowed", sorted(FLAG_PAGES.items()))
def test_every_flag_in_the_runtime_pages_is_known(page: str, sglang_allowed: bool) -> None:
    known = _runtime_flags()
    unknown, seen, foreign_seen = [], 0, set()
    for n, line, _fenced in _prose_lines((EN / page).read_text(encoding="utf-8")):
        for flag, star in FLAG_RE.findall(line):
            seen += 1
            if star or flag.endswith("-"):  # a family such as `--moe-*` or `--sglang-*`
                if flag.startswith(MEGATRON_PREFIXES) or flag == "--sglang-":
                    continue
                unknown.append(f"{page}:{n}: {flag}{star} (no such flag family)")
            elif flag in known:
                continue
            elif flag.startswith("--sglang-"):
                # passed through to SGLang: the field must be in slime's SGLang flag table
                if not _is_sglang_field(flag[len("--sglang-"):]):
                    unknown.append(f"{page}:{n}: {flag} (not a field of sglang_flags.FLAGS)")
            elif flag.startswith(MEGATRON_PREFIXES):
                continue
            elif sglang_allowed and _is_sglang_field(flag[2:]):
                continue
            elif flag in FOREIGN_FLAGS:
                foreign_seen.add(flag)
            else:
                unknown.append(f"{page}:{n}: {flag}")
    assert not unknown, "flags the runtime does not know:\n" + "\n".join(unknown)
    assert seen >= 10, f"only {seen} flags found in {page}"
    for flag in foreign_seen:
        owner = REPO / FOREIGN_FLAGS[flag]
        assert flag in owner.read_text(encoding="utf-8"), f"{flag} is not in {FOREIGN_FLAGS[flag]} any more"


def test_the_foreign_flag_list_has_no_stale_entries() -> None:
    text = "\n".join((EN / p).read_text(encoding="utf-8") for p in FLAG_PAGES)
    stale = [f for f in FOREIGN_FLAGS if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", text)]
    assert not stale, f"FOREIGN_FLAGS lists flags no checked page mentions: {stale}"


# --- the docs as the lab serves them, and the page's links into them -----------------------------

REFERENCE_NAMES = ("validation-rules.md", "glossary.md", "runtime-cli.md", "grpo.md")
SOURCE_DIRS = ("lab", "slime", "tests", "tools", "scripts", "recipes", "bench")


def _anchor_targets() -> list[tuple[str, str, str]]:
    """(docs file, link target page, anchor) for every relative link with an anchor in the docs."""
    out = []
    for path in _doc_files():
        for _, line, fenced in _prose_lines(path.read_text(encoding="utf-8")):
            if fenced:
                continue
            for target in LINK_RE.findall(re.sub(r"`[^`]*`", "", line)):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target) or "#" not in target:
                    continue
                file_part, anchor = target.split("#", 1)
                page = (path.parent / file_part).resolve() if file_part else path
                out.append((str(path.relative_to(REPO)), str(page.relative_to(DOCS)), anchor))
    return out


def test_every_anchor_link_in_the_docs_opens_an_existing_section() -> None:
    from lab.web.docs import section_ids

    targets = _anchor_targets()
    assert len(targets) >= 15, targets
    broken = [f"{src}: {page}#{anchor}" for src, page, anchor in targets if anchor not in section_ids(page)]
    assert not broken, "links to sections that do not exist:\n" + "\n".join(broken)


def test_every_why_and_see_link_of_the_page_opens_a_section_in_both_languages() -> None:
    from lab.web.doc_links import SEE, WHY, WHY_EXTRA, all_targets
    from lab.web.docs import section_ids
    from lab.web.page import field_specs, render_later_steps, render_page

    html = render_page() + render_later_steps()  # the first screen, and steps 2-6 that app.js inserts
    drawn = set(re.findall(r'data-doc="([^"]+)"', html))
    assert set(all_targets()) == drawn, "every link of lab/web/doc_links.py is drawn, and only those"
    assert set(WHY) <= set(field_specs()), set(WHY) - set(field_specs())
    switches = {"task.advantage_estimator", "corrections.tis", "corrections.icepop", "corrections.r3", "corrections.sc",
                "corrections.deterministic", "placement.scheduling", "precision.rollout", "serving.pd.enabled",
                "serving.hicache.enabled", "serving.eagle.enabled"}
    assert switches <= set(WHY), switches - set(WHY)
    assert "kl" in WHY_EXTRA and len(SEE) >= 7
    broken = []
    for target in sorted(drawn):
        page, _, anchor = target.partition("#")
        for lang in ("en", "zh"):
            ids = section_ids(f"{lang}/{page}")
            if not ids:
                broken.append(f"{lang}/{page} does not exist")
            elif anchor and anchor not in ids:
                broken.append(f"{lang}/{page}#{anchor}: no such section")
    assert not broken, "\n".join(broken)


def test_each_why_and_math_derivation_cites_its_original_paper() -> None:
    from lab.web.doc_links import WHY, WHY_EXTRA
    from lab.web.docs import render_markdown

    targets = set(WHY.values()) | {t for _, t in WHY_EXTRA.values()}
    for target in sorted(targets):
        page, _, anchor = target.partition("#")
        for lang in ("en", "zh"):
            _, body = render_markdown(f"{lang}/{page}")
            start = body.index(f'id="{anchor}"')
            nxt = re.search(r"<h[12] id=", body[start + 1:])
            section = body[start: start + 1 + nxt.start()] if nxt else body[start:]
            assert re.search(r"arXiv:\d{4}\.\d{4,5}|\b(19|20)\d\d\b", section), f"{lang}/{target} cites no paper"
            if page in ("corrections.md", "speculative-decoding.md", "serving-cost.md", "precision.md"):
                assert "<math" in section or "<math" in body, f"{lang}/{page} has no formula"


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_lab_serves_every_docs_page_with_mathml_and_working_links(lang: str) -> None:
    from fastapi.testclient import TestClient

    from lab.web.app import create_app

    client = TestClient(create_app(), base_url="http://127.0.0.1")
    math_pages = 0
    for page in _pages(EN):
        r = client.get(f"/docs/{lang}/{page}")
        assert r.status_code == 200, (page, r.status_code)
        assert "<script" not in r.text and "tex-error" not in r.text, page
        math_pages += "<math" in r.text
        for href in re.findall(r'href="(/docs/[^"#]+)', r.text):
            assert client.get(href).status_code == 200, f"{lang}/{page} links {href}"
    assert math_pages >= 7
    assert client.get("/docs/en/../../README.md").status_code == 404
    missing = client.get(f"/docs/{lang}/no-such-page.md")
    assert missing.status_code == 404 and "text/html" in missing.headers["content-type"]
    assert {"en": "There is no docs page", "zh": "没有文档页面"}[lang] in missing.text  # the reader's language
    assert f'href="/docs/{lang}/index.md"' in missing.text


def test_source_files_cite_docs_pages_not_reference_files_outside_the_repository() -> None:
    hits = []
    for folder in SOURCE_DIRS:
        for path in (REPO / folder).rglob("*"):
            if path.suffix not in (".py", ".js", ".j2", ".sh", ".yaml", ".html") or path.name == "test_docs.py":
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            hits += [f"{path.relative_to(REPO)}: {name}" for name in REFERENCE_NAMES if name in text]
    assert not hits, "cite docs/ instead:\n" + "\n".join(hits)


def test_docs_in_an_unknown_language_are_a_404_naming_the_known_ones() -> None:
    from fastapi.testclient import TestClient

    from lab.web.app import create_app

    r = TestClient(create_app(), base_url="http://127.0.0.1").get("/docs/fr/")
    assert r.status_code == 404 and "text/html" in r.headers["content-type"]
    assert "There are no docs in &#39;fr&#39;; the docs exist in en, zh." in r.text


_CODE_PATH_RE = re.compile(r"`((?:slime|lab|recipes|scripts|docker|tools)/[^`\s]*|train(?:_async)?\.py)`")


@pytest.mark.parametrize("folder", [EN, ZH])
def test_the_code_architecture_page_names_only_paths_that_exist(folder: Path) -> None:
    """The code map goes stale silently when a module moves: every path it names must exist."""
    from lab.core.experiment import LEAF_FIELDS

    text = (folder / "code-architecture.md").read_text(encoding="utf-8")
    named = set(_CODE_PATH_RE.findall(text))
    assert len(named) >= 60, sorted(named)
    missing = [p for p in sorted(named) if not any(REPO.glob(p.rstrip("/")))]
    assert not missing, f"docs/{folder.name}/code-architecture.md names missing paths: {missing}"
    edited = re.search(r'path: "([a-z_.]+)"', text)
    assert edited and edited.group(1) in LEAF_FIELDS  # the edit it follows is a real field
