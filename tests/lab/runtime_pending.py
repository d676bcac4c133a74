"""Refusals the runtime makes today of every GPU recipe, pending a runtime capability.

`train.py` does not place `--train-backend megatron` yet (#12); the lab shows that refusal at
model.recipe, as it must. Tests about other rules look past it with `lab_only`; the day the runtime
gains the capability the refusal disappears and these helpers filter nothing.
"""
from __future__ import annotations

MEGATRON_NOT_PLACED = "--train-backend megatron: the Megatron trainer"


def pending(f) -> bool:
    return f.id == "RUNTIME" and MEGATRON_NOT_PLACED in f.message


def without_pending(findings):
    return [f for f in findings if not pending(f)]
