"""A shell variable inside a flag list: experiment.sh sets it once at its top (a private path, an
address) and every flag line refers to it, so a reviewer edits one place."""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass


@dataclass(frozen=True)
class Var:
    """A shell variable reference inside a flag list: renders as "${NAME}" (or "${NAME[@]}")."""

    name: str
    array: bool = False
    suffix: str = ""  # literal text after the value, e.g. "/weights" -> "${OUTPUT_DIR}"/weights

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", self.name):
            raise ValueError(f"not a shell variable name: {self.name!r}")

    def render(self) -> str:
        if self.array:
            return f'"${{{self.name}[@]}}"'
        return f'"${{{self.name}}}"' + (shlex.quote(self.suffix) if self.suffix else "")
