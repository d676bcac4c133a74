"""The Jinja environment for shell and YAML: strict, unescaped, every value quoted by a filter.

- StrictUndefined: a missing variable is an error, never an empty string in a shell command.
- autoescape off: HTML escaping would corrupt shell.
- Comment delimiters are `<#--` / `--#>`, not `{#` / `#}`: bash's `${#arr[@]}` would otherwise
  open a Jinja comment ("Missing end of comment tag").
- Filters: `q` (shlex.quote: every user value), `words` (a list of tokens, each quoted; a `Var`
  token renders as "${NAME}" or "${NAME[@]}"), `comment` (a value made safe for a `#` comment
  line: no newline can end the comment), `yq` (a YAML double-quoted scalar).
"""
from __future__ import annotations

import json
import re
import shlex
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import jinja2

from lab.core.shell_var import Var

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
_UNSAFE_COMMENT = re.compile(r"[\x00-\x1f\x7f\u2028\u2029\x85]")


def q(value: Any) -> str:
    """Quote one value for bash. Booleans and numbers render as their JSON spelling."""
    if isinstance(value, Var):
        return value.render()
    if isinstance(value, bool):
        value = "true" if value else "false"
    elif value is None:
        value = ""
    return shlex.quote(str(value))


def words(tokens: Iterable[Any]) -> str:
    return " ".join(q(t) for t in tokens)


def comment(value: Any) -> str:
    """A value inside a `# ...` line: control characters (newlines above all) become visible escapes."""
    return _UNSAFE_COMMENT.sub(lambda m: json.dumps(m.group(0))[1:-1], str(value))


def yq(value: Any) -> str:
    """A YAML double-quoted scalar (JSON escapes are valid YAML); never spans lines."""
    return json.dumps(str(value), ensure_ascii=True)


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        comment_start_string="<#--",
        comment_end_string="--#>",
        auto_reload=False,
        cache_size=50,
    )
    env.filters.update(q=q, words=words, comment=comment, yq=yq)
    return env


@lru_cache(maxsize=8)
def template(name: str) -> jinja2.Template:
    return environment().get_template(name)
