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

from slime.args import MEGATRON_FLAGS, MEGATRON_PREFIXES, build_parser
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
    parser = build_parser()
    return {o for a in parser._actions for o in a.option_strings if o.startswith("--")} | set(MEGATRON_FLAGS)


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
