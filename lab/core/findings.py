"""A finding: one incompatibility, naming the fields it concerns and the fix.

`message` and `fix` are the English text. A finding built from the message catalogue
(`lab/locales/messages.*.json`) also carries `message_id` and `params`, from which
`lab.core.messages.localize_finding(f, lang)` renders it in another language.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator


class Finding(BaseModel):
    id: str = Field(description="Rule id, e.g. PAR-1 (see docs/en/lab.md#findings-and-rule-ids); LAB-* for the lab's own.")
    level: Literal["error", "warning", "info"]
    fields: list[str] = Field(description="Field paths the finding names; the page shows it next to them.")
    message: str = ""
    fix: str = ""
    message_id: str | None = Field(None, description="Catalogue key prefix of message and fix, e.g. RES-4.idle; "
                                                     "null for a finding written directly in English.")
    params: dict[str, Any] = Field(default_factory=dict, description="str.format parameters of the catalogue texts.")

    @model_validator(mode="after")
    def _render_english(self) -> Finding:
        if self.message_id is not None and not (self.message and self.fix):
            from lab.core.messages import render

            if not self.message:
                self.message = render(f"{self.message_id}.message", self.params, "en")
            if not self.fix:
                self.fix = render(f"{self.message_id}.fix", self.params, "en")
        return self

    @classmethod
    def of(cls, id: str, level: str, fields: list[str], variant: str | None = None, **params: Any) -> Finding:
        """A finding whose texts come from the catalogue: key `<id>[.<variant>].message` / `.fix`."""
        return cls(id=id, level=level, fields=fields, message_id=id if variant is None else f"{id}.{variant}", params=params)
