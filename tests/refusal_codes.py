"""Tests match the runtime's refusals by their stable code (slime/refusals.py), never by their
wording: the wording lives in slime/locales/refusals.<lang>.json and may change, or be read in
another language (SLIME_LANG), without a test about the rule noticing."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from slime.refusals import code_of, message_of


def codes(messages: Iterable[str]) -> list[str | None]:
    """The code of each message (None for one written without a code)."""
    return [code_of(m)[0] for m in messages]


def with_code(messages: Iterable[str], code: str, **params: Any) -> list[str]:
    """The messages with `code` whose params include `params`."""
    out = []
    for m in messages:
        got, args = code_of(m)
        if got == code and all(args.get(k) == v for k, v in params.items()):
            out.append(m)
    return out


def has(messages: Iterable[str], code: str, **params: Any) -> bool:
    return bool(with_code(list(messages), code, **params))


def refusal(messages: Iterable[str], code: str, **params: Any) -> str:
    """The first message with `code` (and `params`); fails naming the codes there were."""
    messages = list(messages)
    found = with_code(messages, code, **params)
    assert found, f"no {code} {params or ''} among {[(code_of(m)[0], str(m)) for m in messages]}"
    return found[0]


def code_of_exc(exc: BaseException) -> str | None:
    """The code an exception was raised with (its single Refusal argument), else None."""
    return code_of(message_of(exc))[0]


def exc_codes(exc: BaseException) -> list[str | None]:
    """The codes of an exception: its `problems` (a UsageError's list), else its own message."""
    problems = getattr(exc, "problems", None)
    return codes(problems) if problems else [code_of_exc(exc)]


def raised(exc: BaseException, code: str, **params: Any) -> bool:
    """Whether `exc` was raised with a refusal of `code` (and `params`): its single Refusal
    argument, or one of its `problems` (a UsageError lists each)."""
    problems = getattr(exc, "problems", None)
    return has(problems if problems else [message_of(exc)], code, **params)
