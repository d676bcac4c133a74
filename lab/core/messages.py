"""The message catalogue: the lab's server-side texts in English and Chinese.

`lab/locales/messages.<lang>.json` maps a key to a `str.format` template. Namespaces:

- `<finding id>[.<variant>].message` / `.fix`: the findings of `lab.rules.checks` and `lab.rules.validate`
  (a Finding carries `message_id` = the prefix and `params`);
- `term.*`: words used inside another message (a parameter `{"key": "term.…", "params": {…}}`);
- `change.*`: the reasons of dependent changes (`lab.rules`, `lab.core.workspace`), `repair.*`: repair
  titles (`lab.rules.repair`), `label.*`: history labels, `memory.*`: memory item names and exclusions;
- `error.*`, `input.*`, `import.*`: refusals of bad input (ChangeError, LoadError, ShareError,
  ScriptImportError; pydantic's own errors through `pydantic_text`), worded at the API edge too;
- `runtime.<code>`: the runtime's refusals, read from the runtime's own catalogue
  (`slime/locales/refusals.<lang>.json`), never copied here.

Every producer emits a `Text` (key + parameters), never a finished sentence: a FieldChange carries
`reason_id`/`reason_params`, a HistoryEntry `label_id`/`label_params`, a Repair `title_id`/`params`,
a memory item its `key`/`params`. The English text beside them (`reason`, `label`, `title`,
`items_gib`) is `render(key, params, "en")`, kept for the CLI, the stored history and old clients.
The API edge (`localize_*`) renders the key in the page's language. A text without a key (a
user's own history label, an entry stored before keys existed) is returned unchanged: nothing is
ever matched back from English.
"""
from __future__ import annotations

import json
import re
import string
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from slime.refusals import catalogue as runtime_catalogue

LOCALE_DIR = Path(__file__).parent.parent / "locales"
LANGS = ("en", "zh")
DEFAULT_LANG = "en"
# Namespaces of the texts that are not findings (a Text carries their key).
TEXT_NAMESPACES = ("change.", "repair.", "label.", "memory.")


class MissingMessage(KeyError):
    """A key without a template in the requested language."""


def normalize_lang(lang: str | None) -> str:
    """'zh', 'zh-CN', 'zh_Hans' → 'zh'; anything unknown (or None) → 'en'."""
    if lang in LANGS:  # the common case, on every rendered text
        return lang
    if not lang:
        return DEFAULT_LANG
    base = re.split(r"[-_]", lang.strip().lower(), maxsplit=1)[0]
    return base if base in LANGS else DEFAULT_LANG


RUNTIME_PREFIX = "runtime."  # runtime.<code>: the runtime's own wording of a refusal code


@cache
def catalogue(lang: str) -> dict[str, str]:
    """The templates of one language (read once): the lab's own, and under `runtime.<code>` the
    runtime's refusal catalogue (slime/locales/refusals.<lang>.json), its one home."""
    path = LOCALE_DIR / f"messages.{lang}.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    own = {k: v for k, v in data.items() if not k.startswith("_")}  # "_comment" keys are notes
    return own | {RUNTIME_PREFIX + code: t for code, t in runtime_catalogue(lang).items()}


def placeholders(template: str) -> list[str]:
    """The parameter names of a template, in order (format specs and conversions dropped)."""
    return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]


class Text(BaseModel):
    """A server text as a catalogue key and its parameters; each language renders it at the API edge."""

    key: str = Field(description="Catalogue key, e.g. change.recipe.tp.")
    params: dict[str, Any] = Field(default_factory=dict, description="str.format parameters of the template.")

    def en(self) -> str:
        return render(self.key, self.params, DEFAULT_LANG)


def text(key: str, /, **params: Any) -> Text:
    """The Text `key` with `params` (the key must exist in the catalogue: checked when rendered)."""
    return Text(key=key, params=params)


def keyed(key: str | None, params: dict[str, Any] | None, fallback: str | None, lang: str) -> str | None:
    """The text `key` in `lang`; `fallback` (the stored English) when there is no key."""
    if not key:
        return fallback
    return localize_text(key, params, lang)


def ref(key: str, /, **params: Any) -> dict[str, Any]:
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


# --- pydantic's errors ----------------------------------------------------------------------------

# pydantic error type → the kind of value it expected (input.kind.*)
_PYDANTIC_KINDS = {
    "int_type": "integer", "int_parsing": "integer", "int_from_float": "integer",
    "float_type": "number", "float_parsing": "number", "bool_type": "bool", "bool_parsing": "bool",
    "string_type": "text", "list_type": "list", "dict_type": "object", "model_type": "object",
    "model_attributes_type": "object",
}
# pydantic error type → (catalogue key, the ctx entry holding the limit)
_PYDANTIC_BOUNDS = {"greater_than_equal": ("input.ge", "ge"), "greater_than": ("input.gt", "gt"),
                    "less_than_equal": ("input.le", "le"), "less_than": ("input.lt", "lt"),
                    "string_too_long": ("input.too_long", "max_length"),
                    "string_too_short": ("input.too_short", "min_length")}


def pydantic_text(err: Mapping[str, Any]) -> Text:
    """One pydantic error (an item of `ValidationError.errors()`) as a catalogue text, so that it
    reaches the user in the page's language. A type without its own entry is `input.invalid`,
    naming pydantic's type code (a technical word, the same in every language)."""
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind == "text_rule":
        return Text(key=ctx["key"], params=ctx["params"])
    simple = {"missing": "input.missing", "extra_forbidden": "input.unknown_field"}
    if kind in simple:
        return Text(key=simple[kind])
    if kind == "literal_error":
        return Text(key="input.choice", params={"expected": ctx.get("expected", "")})
    if kind == "string_pattern_mismatch":
        return Text(key="input.pattern", params={"pattern": ctx.get("pattern", "")})
    if kind in _PYDANTIC_BOUNDS:
        key, name = _PYDANTIC_BOUNDS[kind]
        return Text(key=key, params={"limit": ctx.get(name)})
    if kind in _PYDANTIC_KINDS:
        return Text(key="input.type", params={"expected": ref(f"input.kind.{_PYDANTIC_KINDS[kind]}")})
    return Text(key="input.invalid", params={"type": kind})


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


# --- texts with a key (reasons, titles, labels, memory) --------------------------------------------

def _as_dict(obj: Any) -> tuple[dict[str, Any], bool]:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json"), True
    return dict(obj), False


def localize_change(change: Any, lang: str) -> dict[str, Any]:
    """A FieldChange (or its dict) as a dict whose `reason` is in `lang` (rendered from `reason_id`)."""
    data, _ = _as_dict(change)
    data["reason"] = keyed(data.get("reason_id"), data.get("reason_params"), data.get("reason"), lang)
    return data


def entry_label(entry: Any, lang: str) -> str | None:
    """The label of a history entry in `lang`: from `label_id`, else as stored (a field path, the
    page names fields itself; or the user's own label)."""
    data, _ = _as_dict(entry)
    return keyed(data.get("label_id"), data.get("label_params"), data.get("label"), lang)


def localize_entry(entry: Any, lang: str) -> dict[str, Any] | None:
    """A history entry (or the API's last_change dict): label and reasons in `lang`."""
    if entry is None:
        return None
    data, _ = _as_dict(entry)
    data["label"] = entry_label(data, lang)
    if isinstance(data.get("changes"), list):
        data["changes"] = [localize_change(c, lang) for c in data["changes"]]
    return data


def localize_repair(repair: Any, lang: str) -> dict[str, Any]:
    """A Repair (or its dict) as a dict: title, change reasons, its finding and the remaining findings in `lang`."""
    data, _ = _as_dict(repair)
    data["title"] = keyed(data.get("title_id"), data.get("params"), data.get("title"), lang)
    data["changes"] = [localize_change(c, lang) for c in data.get("changes", [])]
    data["remaining"] = [localize_finding(f, lang) for f in data.get("remaining", [])]
    if data.get("finding"):
        data["finding"] = localize_finding(data["finding"], lang)
    return data


def localize_memory(memory: Any, lang: str) -> Any:
    """A MemoryEstimate (or its dict) with item names and exclusions in `lang` (None stays None).

    `items_gib` is rebuilt from the phase's keyed `items`; `exclusions` from `exclusion_ids`."""
    if memory is None:
        return None
    data, _ = _as_dict(memory)
    for phase in ("training", "rollout"):
        p = data.get(phase)
        if isinstance(p, dict) and isinstance(p.get("items"), list):
            data[phase] = {**p, "items_gib": {localize_text(i["key"], i.get("params"), lang): i["gib"] for i in p["items"]}}
    if isinstance(data.get("exclusion_ids"), list):
        data["exclusions"] = [localize_text(k, {}, lang) for k in data["exclusion_ids"]]
    return data
