"""Refusals with a stable code: what the runtime says when it will not run a flag combination.

A refusal is its text (a ``str``, so printing, joining and ``in`` checks behave as before) that
also carries a stable ``code`` and the ``params`` its template was filled with. Another program can
word the same refusal in another language from code and params alone (the lab does).

Every code is declared once, with the names of its parameters, in a module-level table
(``declare``), so the whole set is known as soon as the declaring modules are imported
(``all_codes``). Its wording lives once per language, in ``slime/locales/refusals.<lang>.json``,
read by the runtime and by the lab alike; a test checks that every code has a wording in every
language with exactly its declared parameters. In the catalogue, `backticks` mark flags, values and
paths: the lab shows them as code, the console text drops the marks (``plain``).

The runtime words its refusals in ``SLIME_LANG`` (``en``, the default, or ``zh``). Torch-free and
Ray-free.
"""
from __future__ import annotations

import importlib
import json
import os
import re
from functools import cache
from pathlib import Path
from typing import Any

# code -> the names of its template's parameters. Filled by declare() at import time.
CODES: dict[str, tuple[str, ...]] = {}

CATALOGUE_DIR = Path(__file__).parent / "locales"
LANGS = ("en", "zh")
DEFAULT_LANG = "en"
LANG_ENV = "SLIME_LANG"  # the language of the runtime's own refusals (console, logs, errors)

# The modules that declare codes; all_codes() imports them so the table is complete.
DECLARING_MODULES = (
    "slime.args",
    "slime.limits",
    "slime.rewards",
    "slime.backends.embedded.capabilities",
    "slime.backends.megatron.capabilities",
    "slime.backends.megatron.model_args",
    "slime.rollout.engines.sglang",
    "slime.rollout.queue",
    "slime.model_spec",
    "slime.data.dataset",
    "slime.checkpoint",
    "slime.rollout.engines.external",
    "slime.ray.runtime",
    "slime.backends.registry",
    "slime.rewards.hooks",
    "slime.ray.placement",
    "slime.rollout.router",
    "slime.rollout.client",
    "slime.backends.megatron.optimizer_resume",
)


def normalize_lang(lang: str | None) -> str:
    """'zh', 'zh-CN', 'zh_CN.UTF-8' → 'zh'; anything unknown (or None) → 'en'."""
    base = re.split(r"[-_.]", (lang or "").strip().lower(), maxsplit=1)[0]
    return base if base in LANGS else DEFAULT_LANG


def runtime_lang() -> str:
    """The language the runtime words its refusals in (SLIME_LANG; read at each refusal)."""
    return normalize_lang(os.environ.get(LANG_ENV))


@cache
def catalogue(lang: str) -> dict[str, str]:
    """The marked templates of one language, by code (read once; "_comment" keys are notes)."""
    path = CATALOGUE_DIR / f"refusals.{normalize_lang(lang)}.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    return {k: v for k, v in data.items() if not k.startswith("_")}


def plain(template: str) -> str:
    """A marked template as console text: the `code` marks dropped (the catalogue's templates carry
    no backtick of their own, so the marks are all there is to drop)."""
    return template.replace("`", "")


def template(code: str, lang: str = DEFAULT_LANG) -> str:
    """The marked template of `code` in `lang`, English where `lang` lacks it."""
    return catalogue(normalize_lang(lang)).get(code) or catalogue(DEFAULT_LANG)[code]


def wording(code: str, params: dict[str, Any], lang: str) -> str:
    """The console text of `code` in `lang`; a parameter that is itself a refusal is worded in `lang` too."""
    values = {k: v.text(lang) if isinstance(v, Refusal) else v for k, v in params.items()}
    return plain(template(code, lang)).format(**values)


class Refusal(str):
    """The text of one refusal in the runtime's language, with its ``code`` and ``params``
    (JSON-friendly values)."""

    code: str
    params: dict[str, Any]

    def __new__(cls, code: str, params: dict[str, Any] | None = None) -> Refusal:
        params = dict(params or {})
        if code not in CODES:
            raise KeyError(code)
        obj = super().__new__(cls, wording(code, params, runtime_lang()))
        obj.code, obj.params = code, params
        return obj

    def text(self, lang: str) -> str:
        """The same refusal worded in `lang` (console text, without marks); as it was made when no
        catalogue words its code (one made by a newer runtime)."""
        if self.code not in catalogue(DEFAULT_LANG):
            return str(self)
        return wording(self.code, self.params, lang)

    def __reduce__(self):  # pickles (Ray) as code + params + text, not as a plain str
        return (_restored, (self.code, self.params, str(self)))


def _restored(code: str, params: dict[str, Any], text: str) -> Refusal:
    """A Refusal unpickled in another process (a Ray actor's refusal reaching the driver): worded
    again in this process's language from the catalogue. Never checked against CODES: the module
    that declares the code (the Megatron backend's, in an actor) may never have been imported
    here, and a refusal that cannot be read back reaches the user as Ray's "Failed to deserialize
    exception" instead of its own words. A code the catalogue lacks keeps the text it was made with."""
    if code in catalogue(DEFAULT_LANG):
        try:
            text = wording(code, params, runtime_lang())
        except (KeyError, IndexError, ValueError):  # params of another runtime's version
            pass
    obj = str.__new__(Refusal, text)
    obj.code, obj.params = code, params
    return obj


class Templates:
    """The codes of one namespace: ``t("key", **params)`` is the Refusal ``namespace.key``."""

    def __init__(self, namespace: str, params: dict[str, tuple[str, ...]]) -> None:
        self.namespace = namespace
        for key, names in params.items():
            code = f"{namespace}.{key}"
            if isinstance(names, str):  # an English template where the names belong (an old-style declaration)
                raise TypeError(f"refusal code {code}: declare its parameter names, e.g. ('flag', 'value'); "
                                "its wording goes in slime/locales/refusals.<lang>.json")
            if CODES.get(code, tuple(names)) != tuple(names):
                raise ValueError(f"refusal code {code} declared twice with different parameters")
            CODES[code] = tuple(names)

    def __call__(self, key: str, /, **params: Any) -> Refusal:
        return Refusal(f"{self.namespace}.{key}", params)


def declare(namespace: str, params: dict[str, tuple[str, ...]]) -> Templates:
    """Declare the codes ``namespace.<key>``, each with the names of its parameters (its wording is
    in the catalogues)."""
    return Templates(namespace, params)


def all_codes() -> dict[str, tuple[str, ...]]:
    """Every code the runtime can emit, with its parameter names."""
    for name in DECLARING_MODULES:
        importlib.import_module(name)
    return dict(CODES)


def english(message: str) -> str:
    """A message's English text, whatever SLIME_LANG says (a plain str is returned as it is)."""
    return message.text(DEFAULT_LANG) if isinstance(message, Refusal) else str(message)


def message_of(exc: BaseException) -> str:
    """An exception's message, keeping the Refusal (code and params) it was raised with; ``str(exc)``
    would turn it into plain text."""
    if len(exc.args) == 1 and isinstance(exc.args[0], Refusal):
        return exc.args[0]
    return str(exc)


def code_of(message: str) -> tuple[str | None, dict[str, Any]]:
    """(code, params) of a refusal; (None, {}) for a message written without a code."""
    if isinstance(message, Refusal):
        return message.code, dict(message.params)
    return None, {}
