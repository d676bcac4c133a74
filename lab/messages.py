"""The message catalogue: the lab's server-side texts in English and Chinese.

`lab/locales/messages.<lang>.json` maps a key to a `str.format` template. Namespaces:

- `<finding id>[.<variant>].message` / `.fix`: the findings of `lab.checks` and `lab.rules.validate`
  (a Finding carries `message_id` = the prefix and `params`);
- `term.*`: words used inside another message (a parameter `{"key": "term.…", "params": {…}}`);
- `change.*`: the reasons of dependent changes (`lab.rules`), `repair.*`: repair titles
  (`lab.repair`), `label.*`: history labels, `memory.*`: memory item names and exclusions.

Findings are rendered forward from their id and parameters. The other texts are stored as
English (in the history, in share links, in repair previews), so they are localized by matching
the English text against the English templates of their namespace and rendering the matching
template of the other language with the same parameters (`localize_english`). A text that matches
no template is returned unchanged (e.g. a user's own history label).

English is the source language: the English catalogue reproduces exactly what the rules wrote
before the catalogue existed, and `render(key, params, "en")` is what the rules emit.
"""
from __future__ import annotations

import json
import re
import string
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel

LOCALE_DIR = Path(__file__).parent / "locales"
LANGS = ("en", "zh")
DEFAULT_LANG = "en"
# Namespaces whose texts are stored as English and localized by matching (no format specs there).
REVERSE_NAMESPACES = ("change.", "repair.", "label.", "memory.")


class MissingMessage(KeyError):
    """A key without a template in the requested language."""


def normalize_lang(lang: str | None) -> str:
    """'zh', 'zh-CN', 'zh_Hans' → 'zh'; anything unknown (or None) → 'en'."""
    if not lang:
        return DEFAULT_LANG
    base = re.split(r"[-_]", lang.strip().lower(), maxsplit=1)[0]
    return base if base in LANGS else DEFAULT_LANG


@cache
def catalogue(lang: str) -> dict[str, str]:
    """The templates of one language (read once)."""
    path = LOCALE_DIR / f"messages.{lang}.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    return {k: v for k, v in data.items() if not k.startswith("_")}  # "_comment" keys are notes


def placeholders(template: str) -> list[str]:
    """The parameter names of a template, in order (format specs and conversions dropped)."""
    return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]


def ref(key: str, **params: Any) -> dict[str, Any]:
    """A parameter that is itself a catalogue text (rendered in the target language)."""
    return {"key": key, "params": params}


def _param(value: Any, lang: str) -> Any:
    if isinstance(value, dict) and set(value) <= {"key", "params"} and "key" in value:
        return render(value["key"], value.get("params") or {}, lang)
    return value


def render(key: str, params: dict[str, Any] | None = None, lang: str = DEFAULT_LANG) -> str:
    """The template `key` of `lang` filled with `params`; raises MissingMessage when absent."""
    lang = normalize_lang(lang)
    try:
        template = catalogue(lang)[key]
    except KeyError:
        raise MissingMessage(f"no {lang} message for {key!r}") from None
    values = {k: _param(v, lang) for k, v in (params or {}).items()}
    return template.format(**values)


def localize_text(key: str, params: dict[str, Any] | None = None, lang: str = DEFAULT_LANG) -> str:
    """`render`, falling back to English when `lang` lacks the key (never raises for a known key)."""
    try:
        return render(key, params, lang)
    except MissingMessage:
        return render(key, params, DEFAULT_LANG)


# --- findings -------------------------------------------------------------------------------------

def localize_finding(f: Any, lang: str) -> Any:
    """A copy of `f` (a Finding or its JSON dict) with message and fix in `lang`.

    Findings without a message_id (written directly in English) are returned unchanged."""
    lang = normalize_lang(lang)
    is_model = isinstance(f, BaseModel)
    data = f.model_dump() if is_model else dict(f)
    mid = data.get("message_id")
    if lang == DEFAULT_LANG or not mid:
        return f.model_copy() if is_model else data
    update = {"message": localize_text(f"{mid}.message", data.get("params"), lang),
              "fix": localize_text(f"{mid}.fix", data.get("params"), lang)}
    return f.model_copy(update=update) if is_model else {**data, **update}


def localize_findings(findings: Iterable[Any], lang: str) -> list[Any]:
    return [localize_finding(f, lang) for f in findings]


# --- texts stored in English (reasons, titles, labels, memory) ------------------------------------

@cache
def _patterns(prefix: str) -> list[tuple[re.Pattern[str], str]]:
    """(regex of the English template, key) for one namespace, most specific template first."""
    out = []
    for key, template in catalogue(DEFAULT_LANG).items():
        if not key.startswith(prefix):
            continue
        regex, seen = [], set()
        for literal, name, _, _ in string.Formatter().parse(template):
            regex.append(re.escape(literal))
            if name is None:
                continue
            regex.append(f"(?P={name})" if name in seen else f"(?P<{name}>.+?)")
            seen.add(name)
        literal_len = len(re.sub(r"\{[^{}]*\}", "", template))
        out.append((literal_len, re.compile("".join(regex), re.DOTALL), key))
    out.sort(key=lambda t: -t[0])
    return [(rx, key) for _, rx, key in out]


def match_english(text: str, namespaces: Iterable[str] = REVERSE_NAMESPACES) -> tuple[str, dict[str, str]] | None:
    """(key, params) of the English template that produced `text`, or None."""
    for ns in namespaces:
        for rx, key in _patterns(ns):
            m = rx.fullmatch(text)
            if m:
                return key, m.groupdict()
    return None


def localize_english(text: str | None, lang: str, namespaces: Iterable[str] = REVERSE_NAMESPACES) -> str | None:
    """`text` (English, from a catalogue template) in `lang`; unchanged when no template matches."""
    lang = normalize_lang(lang)
    if not text or lang == DEFAULT_LANG:
        return text
    hit = match_english(text, namespaces)
    if hit is None:
        return text
    return localize_text(hit[0], hit[1], lang)


def _as_dict(obj: Any) -> tuple[dict[str, Any], bool]:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json"), True
    return dict(obj), False


def localize_change(change: Any, lang: str) -> dict[str, Any]:
    """A FieldChange (or its dict) as a dict whose `reason` is in `lang`."""
    data, _ = _as_dict(change)
    if data.get("reason"):
        data["reason"] = localize_english(data["reason"], lang, ("change.",))
    return data


def localize_entry(entry: Any, lang: str) -> dict[str, Any] | None:
    """A history entry (or the API's last_change dict): label and reasons in `lang`.

    A label that is a field path is left as it is (the page names fields itself)."""
    if entry is None:
        return None
    data, _ = _as_dict(entry)
    if isinstance(data.get("label"), str):
        data["label"] = localize_english(data["label"], lang, ("label.", "repair."))
    if isinstance(data.get("changes"), list):
        data["changes"] = [localize_change(c, lang) for c in data["changes"]]
    return data


def localize_repair(repair: Any, lang: str) -> dict[str, Any]:
    """A Repair (or its dict) as a dict: title, change reasons, its finding and the remaining findings in `lang`."""
    data, _ = _as_dict(repair)
    data["title"] = localize_english(data.get("title"), lang, ("repair.",))
    data["changes"] = [localize_change(c, lang) for c in data.get("changes", [])]
    data["remaining"] = [localize_finding(f, lang) for f in data.get("remaining", [])]
    if data.get("finding"):
        data["finding"] = localize_finding(data["finding"], lang)
    return data


def localize_memory(memory: Any, lang: str) -> Any:
    """A MemoryEstimate (or its dict) with item names and exclusions in `lang` (None stays None)."""
    if memory is None:
        return None
    data, _ = _as_dict(memory)
    for phase in ("training", "rollout"):
        p = data.get(phase)
        if isinstance(p, dict) and isinstance(p.get("items_gib"), dict):
            data[phase] = {**p, "items_gib": {localize_english(k, lang, ("memory.item.",)): v for k, v in p["items_gib"].items()}}
    if isinstance(data.get("exclusions"), list):
        data["exclusions"] = [localize_english(x, lang, ("memory.exclusion.",)) for x in data["exclusions"]]
    return data
