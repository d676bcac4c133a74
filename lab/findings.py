"""A finding: one incompatibility, naming the fields it concerns and the fix."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class Finding(BaseModel):
    id: str = Field(description="Rule id, e.g. PAR-1 (see validation-rules.md); LAB-* for the lab's own.")
    level: Literal["error", "warning", "info"]
    fields: list[str] = Field(description="Field paths the finding names; the page shows it next to them.")
    message: str
    fix: str
