"""A change to an experiment: its record (`FieldChange`), its refusal (`ChangeError`) and the strict
build every change ends in (`validated`).

Values are checked strictly (no "8" for 8, no 1 for true); strings must not contain NUL or newline
characters (everything else, spaces, quotes, `$(...)`, is legal: the renderer quotes it). Which
fields change together with a user's change is a rule (lab/rules/dependents.py); this module only
says whether the result is an experiment.
"""
from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, Field, ValidationError, model_validator

from lab.core.experiment import EXTRA_FLAGS_PATH, LEAF_FIELDS, Experiment, iter_field_paths
from lab.core.history_memo import contents_key
from lab.core.memo import Memo
from lab.core.messages import Text, pydantic_text, render

_FIELD_INFO = dict(iter_field_paths())
# Fields whose value is itself runtime flags: they may begin with `-`.
FLAG_WORD_FIELDS = frozenset({EXTRA_FLAGS_PATH, "advanced.unset_flags", "model.spec_args"})


class ChangeError(ValueError):
    """A change that cannot be applied. `key` + `params` name the text in lab/locales/messages.*.json
    (the API localises it); `message` is its English rendering, or a free text where no key exists."""

    def __init__(self, field: str, message: str | None = None, key: str | None = None,
                 params: dict[str, Any] | None = None) -> None:
        if message is None:
            message = render(key or "", params)
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.key = key
        self.params = dict(params or {})


class FieldChange(BaseModel):
    path: str
    old: Any = None
    new: Any = None
    reason: str | None = Field(None, description="Why a dependent field changed with the user's change, in English "
                                                 "(rendered from reason_id); null for the change itself.")
    reason_id: str | None = Field(None, description="Catalogue key of the reason (lab/locales/messages.*.json), "
                                                    "e.g. change.recipe.tp; null for the change itself.")
    reason_params: dict[str, Any] = Field(default_factory=dict, description="str.format parameters of the reason.")

    @model_validator(mode="after")
    def _render_english(self) -> FieldChange:
        if self.reason_id is not None and not self.reason:
            self.reason = render(self.reason_id, self.reason_params, "en")
        return self

    @classmethod
    def because(cls, path: str, old: Any, new: Any, why: Text | None) -> FieldChange:
        """A change whose reason is the catalogue text `why` (None: the user's own change)."""
        if why is None:
            return cls(path=path, old=old, new=new)
        return cls(path=path, old=old, new=new, reason_id=why.key, reason_params=why.params)


# --- value checks ---------------------------------------------------------------------------------

def _range_text(path: str) -> str:
    info = _FIELD_INFO[path]
    lo = hi = None
    for m in info.metadata:
        for attr, side in (("ge", "lo"), ("gt", "lo"), ("le", "hi"), ("lt", "hi")):
            v = getattr(m, attr, None)
            if v is not None:
                sym = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}[attr]
                if side == "lo":
                    lo = f"{sym} {v}"
                else:
                    hi = f"{sym} {v}"
    parts = [x for x in (lo, hi) if x]
    return f"allowed range: {' and '.join(parts)}" if parts else ""


def check_text(path: str, value: Any) -> None:
    """The one character rule (lab/core/text_rule.py) as a ChangeError naming `path`."""
    from lab.core.text_rule import TextRuleError
    from lab.core.text_rule import check_text as rule

    try:
        rule(value, allow_dash=path in FLAG_WORD_FIELDS)
    except TextRuleError as exc:
        raise ChangeError(path, key=exc.key, params=exc.params) from None


def unknown_field_error(path: str) -> ChangeError:
    close = difflib.get_close_matches(path, sorted(LEAF_FIELDS), n=3, cutoff=0.6)
    if not close:  # try the last segment, e.g. "tp" → resources.tp
        last = path.split(".")[-1]
        close = [p for p in sorted(LEAF_FIELDS) if p.split(".")[-1] == last][:3]
    if close:
        return ChangeError(path, key="error.unknown_field_hint", params={"close": ", ".join(close)})
    return ChangeError(path, key="error.unknown_field")


# Experiments validated strictly, by the exact contents they were validated from (`contents_key`:
# types and key order included, so 1, 1.0 and true never stand for one another). Validation is a
# pure function of those contents, so the same contents again ARE that experiment: users go back
# and forth between the same experiments, and each edit validated the whole model (a few hundred
# field checks) again. Bounded; the experiments are shared and never modified (every change builds
# a new one).
VALIDATED: Memo[Experiment] = Memo(256)


def validated(data: dict[str, Any], hint_path: str | None = None) -> Experiment:
    """Build an Experiment strictly; a failure names the first bad field and its allowed values."""
    key = contents_key(data)
    if key is not None:
        hit = VALIDATED.peek(key)
        if hit is not None:
            return hit
    try:
        exp = Experiment.model_validate(data, strict=True)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"] if not isinstance(x, int)) or (hint_path or "experiment")
        t, value = err["type"], err.get("input")
        if t == "extra_forbidden":
            raise unknown_field_error(loc) from exc
        if loc in _FIELD_INFO and t in {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}:
            bounds = _range_text(loc).removeprefix("allowed range: ").replace(" and ", ", ")
            raise ChangeError(loc, key="error.range", params={"value": repr(value), "bounds": bounds}) from exc
        if t in {"int_type", "float_type", "bool_type", "string_type", "list_type", "int_from_float"}:
            expected = {"int_from_float": "int", "string_type": "str"}.get(t, t.split("_")[0])
            raise ChangeError(loc, key="error.wrong_type", params={
                "expected": expected, "got": type(value).__name__, "value": repr(value)}) from exc
        if t == "literal_error":
            options = str(err.get("ctx", {}).get("expected", "")).replace(" or ", ", ")
            raise ChangeError(loc, key="error.choice", params={"value": repr(value), "options": options}) from exc
        if t == "string_pattern_mismatch":
            raise ChangeError(loc, key="error.pattern", params={"pattern": err.get("ctx", {}).get("pattern", "")}) from exc
        other = pydantic_text(err)  # a section that is not an object, a refused character, …
        raise ChangeError(loc, key=other.key, params=other.params) from exc
    if key is not None:
        VALIDATED.put(key, exp)
    return exp
