"""Refusals with a stable code: what the runtime says when it will not run a flag combination.

A refusal is its English text (a ``str``, so printing, joining and ``in`` checks behave as
before) that also carries a stable ``code`` and the ``params`` its template was filled with.
Another program can then word the same refusal in another language from code and params alone
(the lab does, from its locale files), while the rule itself stays here in the runtime.

Every code is declared once, with its English template, in a module-level table (``declare``), so
the whole set is known as soon as the declaring modules are imported (``all_codes``): a test can
check that each one has a wording in every language. Torch-free and Ray-free.
"""
from __future__ import annotations

import importlib
from typing import Any

# code -> English template (str.format). Filled by declare() at import time.
CODES: dict[str, str] = {}

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
)


class Refusal(str):
    """English text of one refusal, with its ``code`` and ``params`` (JSON-friendly values)."""

    code: str
    params: dict[str, Any]

    def __new__(cls, code: str, params: dict[str, Any] | None = None) -> Refusal:
        params = dict(params or {})
        obj = super().__new__(cls, CODES[code].format(**params))
        obj.code, obj.params = code, params
        return obj

    def __reduce__(self):  # pickles (Ray) as code + params, not as a plain str
        return (Refusal, (self.code, self.params))


class Templates:
    """The codes of one namespace: ``t("key", **params)`` is the Refusal ``namespace.key``."""

    def __init__(self, namespace: str, templates: dict[str, str]) -> None:
        self.namespace = namespace
        for key, template in templates.items():
            code = f"{namespace}.{key}"
            if CODES.get(code, template) != template:
                raise ValueError(f"refusal code {code} declared twice with different texts")
            CODES[code] = template

    def __call__(self, key: str, /, **params: Any) -> Refusal:
        return Refusal(f"{self.namespace}.{key}", params)


def declare(namespace: str, templates: dict[str, str]) -> Templates:
    return Templates(namespace, templates)


def all_codes() -> dict[str, str]:
    """Every code the runtime can emit, with its English template."""
    for name in DECLARING_MODULES:
        importlib.import_module(name)
    return dict(CODES)


def message_of(exc: BaseException) -> str:
    """An exception's message, keeping the Refusal (code and params) it was raised with; ``str(exc)``
    would turn it into plain English."""
    if len(exc.args) == 1 and isinstance(exc.args[0], Refusal):
        return exc.args[0]
    return str(exc)


def code_of(message: str) -> tuple[str | None, dict[str, Any]]:
    """(code, params) of a refusal; (None, {}) for a message written without a code."""
    if isinstance(message, Refusal):
        return message.code, dict(message.params)
    return None, {}
