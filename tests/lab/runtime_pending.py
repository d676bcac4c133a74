"""Refusals the runtime makes today of seeded GPU recipes, pending a runtime capability.

The lab shows each of them, as it must (the runtime is the one judge). Tests about other rules look
past them; the day the runtime gains a capability its code leaves this list. Matched by the
refusal's stable code (slime.refusals), never by its English text.
"""
from __future__ import annotations

import re

from slime.refusals import code_of, plain, template

PENDING_CODES = (
    "megatron.context_parallel",  # CP > 1 needs Transformer Engine's ring attention (slime/backends/megatron/capabilities.py)
)


def is_pending(message: str) -> bool:
    return code_of(message)[0] in PENDING_CODES


def pending(f) -> bool:
    return f.id == "RUNTIME" and f.params.get("code") in PENDING_CODES


def without_pending(findings):
    return [f for f in findings if not pending(f)]


def pending_texts() -> tuple[str, ...]:
    """The longest literal piece of each pending code's English wording (slime/locales): for output
    that carries text only (experiment.sh check prints the runtime's English)."""
    return tuple(max(re.split(r"\{[^}]*\}", plain(template(c, "en"))), key=len) for c in PENDING_CODES)
