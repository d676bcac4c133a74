"""Read a bash launch script without running it: tree-sitter's bash grammar parses it, this module
evaluates the straight-line part statically.

Evaluated: scalar and array assignments (`X=…`, `X+=…`, `export`/`declare`/`local`), `${X}`, `$X`,
`${X:-d}` / `${X-d}` / `${X:=d}` / `${X:+v}`, `"${A[@]}"` / `${A[*]}` / `${A[0]}` / `${#A[@]}`,
single, double (over several lines) and `$'…'` quotes, backslash continuations, heredocs (their
body is data, never a command), `source`/`.` of another file (read through `read_source`, then
evaluated in the same environment) and the command substitutions `$(seq …)`, `$(dirname …)`,
`$(basename …)`, `$(cd DIR && pwd)`, `$(echo …)` and `$(realpath …)`. An `if` whose test cannot be
evaluated leaves the variables it assigns unknown.

Everything else is never guessed: a value that cannot be evaluated keeps its text and is listed as
`Unresolved(line, text, why)`; loops, functions and case statements are refused with their line
(`BashStaticError`), as are syntax errors. Nothing is executed.
"""
from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

MAX_SCRIPT_BYTES = 1_000_000  # a launch script is a few kB; larger input is refused before parsing
MAX_SOURCE_DEPTH = 4


class BashStaticError(ValueError):
    """A script this reader refuses: `key` + `params` name the catalogue text (import.*)."""

    def __init__(self, line: int, key: str, **params: Any) -> None:
        self.line = line
        self.key = key
        self.params = {"line": line, **params}
        super().__init__(f"line {line}: {key} {params}")


@dataclass
class Unresolved:
    line: int
    text: str
    why: str  # unset | command | condition | positional | operator


@dataclass
class Word:
    text: str
    line: int


@dataclass
class Command:
    line: int
    words: list[Word]


@dataclass
class Sourced:
    line: int
    path: str
    found: bool


@dataclass
class Evaluated:
    scalars: dict[str, str] = field(default_factory=dict)
    arrays: dict[str, list[Word]] = field(default_factory=dict)
    unknown: dict[str, Unresolved] = field(default_factory=dict)  # variable -> why its value is unknown
    commands: list[Command] = field(default_factory=list)
    sourced: list[Sourced] = field(default_factory=list)
    unresolved: list[Unresolved] = field(default_factory=list)


@lru_cache(maxsize=1)
def _parser() -> Any:
    import tree_sitter_bash
    from tree_sitter import Language, Parser

    return Parser(Language(tree_sitter_bash.language()))


_REFUSED = {"for_statement": "loop", "c_style_for_statement": "loop", "while_statement": "loop",
            "until_statement": "loop", "function_definition": "function", "case_statement": "case",
            "subshell": "subshell"}
_DQ_ESCAPES = {"\\": "\\", '"': '"', "$": "$", "`": "`", "\n": ""}


def _line(node: Any) -> int:
    return node.start_point[0] + 1


def _first_error(node: Any) -> Any | None:
    """The innermost ERROR or MISSING node, where bash would stop."""
    if not node.has_error:
        return None
    for child in node.children:
        found = _first_error(child)
        if found is not None:
            return found
    return node if node.type == "ERROR" or node.is_missing else None


def _unescape_dq(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text) and text[i + 1] in _DQ_ESCAPES:
            out.append(_DQ_ESCAPES[text[i + 1]])
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _unescape_word(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            if text[i + 1] != "\n":
                out.append(text[i + 1])
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _ansi_c(text: str) -> str:
    body = text[2:-1]
    return body.encode("latin-1", "backslashreplace").decode("unicode_escape", "replace")


class _Eval:
    def __init__(self, read_source: Callable[[str], str | None], script_path: str) -> None:
        self.read_source = read_source
        self.script_path = script_path
        self.out = Evaluated()
        self.depth = 0
        self.src = b""

    # --- expansions ---------------------------------------------------------------------------
    def _unresolved(self, node: Any, why: str) -> str:
        text = node.text.decode("utf-8", "replace")
        self.out.unresolved.append(Unresolved(_line(node), text, why))
        return text

    def _var(self, name: str, node: Any) -> str | None:
        if name in self.out.unknown:
            self.out.unresolved.append(Unresolved(_line(node), node.text.decode("utf-8", "replace"),
                                                  self.out.unknown[name].why))
            return node.text.decode("utf-8", "replace")
        if name in self.out.scalars:
            return self.out.scalars[name]
        if name in self.out.arrays:
            arr = self.out.arrays[name]
            return arr[0].text if arr else ""
        if name == "BASH_SOURCE" or name == "0":
            return self.script_path
        return None

    def _expansion(self, node: Any, quoted: bool) -> list[str]:
        """${...}: a list of fields when it is an array "[@]" expansion, else one string."""
        kids = [c for c in node.children if c.type not in ("${", "}")]
        if node.type == "simple_expansion":
            name_node = next((c for c in node.children if c.type in ("variable_name", "special_variable_name")), None)
            if name_node is None or name_node.type == "special_variable_name":
                return [self._unresolved(node, "positional")]
            var = self._var(name_node.text.decode(), node)
            return [var if var is not None else self._unresolved(node, "unset")]
        length = bool(kids and kids[0].type == "#")
        if length:
            kids = kids[1:]
        if not kids:
            return [self._unresolved(node, "operator")]
        target = kids[0]
        index = None
        if target.type == "subscript":
            name = target.child_by_field_name("name").text.decode()
            index = target.child_by_field_name("index").text.decode()
        elif target.type == "variable_name":
            name = target.text.decode()
        else:
            return [self._unresolved(node, "positional" if target.type == "special_variable_name" else "operator")]
        rest = kids[1:]
        if name in self.out.unknown:
            return [self._var(name, node) or ""]
        if index in ("@", "*"):
            if rest:
                return [self._unresolved(node, "operator")]
            arr = self.out.arrays.get(name)
            if arr is None:
                arr = [Word(self.out.scalars[name], _line(node))] if name in self.out.scalars else []
            if length:
                return [str(len(arr))]
            if index == "*" and quoted:
                return [" ".join(w.text for w in arr)]
            return [w.text for w in arr] if quoted else [f for w in arr for f in w.text.split()]
        if index is not None:
            if not index.isdigit() or rest:
                return [self._unresolved(node, "operator")]
            arr = self.out.arrays.get(name)
            if arr is not None:
                value: str | None = arr[int(index)].text if int(index) < len(arr) else ""
            elif name == "BASH_SOURCE" and index == "0":
                value = self.script_path
            else:
                value = self.out.scalars.get(name) if index == "0" else None
        else:
            value = self._var(name, node)
        if length:
            return [str(len(value))] if value is not None else [self._unresolved(node, "unset")]
        if not rest:
            return [value if value is not None else self._unresolved(node, "unset")]
        op = rest[0].text.decode()
        default = "".join(self._word_text(c) for c in rest[1:])
        if op in (":-", "-", ":=", "="):
            unset = value is None or (op.startswith(":") and value == "")
            if unset and op in (":=", "="):
                self.out.scalars[name] = default
            return [default if unset else value]  # type: ignore[list-item]
        if op in (":+", "+"):
            set_ = value is not None and (not op.startswith(":") or value != "")
            return [default if set_ else ""]
        return [self._unresolved(node, "operator")]

    def _command_subst(self, node: Any) -> str:
        inner = [c for c in node.children if c.type not in ("$(", ")", "`")]
        if len(inner) == 1 and inner[0].type == "list":  # `cd DIR && pwd`: DIR
            parts = [c for c in inner[0].children if c.type in ("command", "redirected_statement")]
            ops = [c.type for c in inner[0].children if c.type not in ("command", "redirected_statement")]
            if len(parts) == 2 and ops == ["&&"]:
                first = self._simple_words(parts[0])
                second = self._simple_words(parts[1])
                if first and first[0] == "cd" and second == ["pwd"]:
                    args = [w for w in first[1:] if w != "--"]
                    if len(args) == 1:
                        return posixpath.normpath(args[0])
            return self._unresolved(node, "command")
        if len(inner) != 1 or inner[0].type not in ("command", "redirected_statement"):
            return self._unresolved(node, "command")
        words = self._simple_words(inner[0])
        if not words:
            return self._unresolved(node, "command")
        name, args = words[0], [w for w in words[1:] if w != "--"]
        try:
            if name == "seq" and 1 <= len(args) <= 3:
                nums = [int(a) for a in args]
                start, step, end = (1, 1, nums[0]) if len(nums) == 1 else (nums[0], 1, nums[1]) if len(nums) == 2 \
                    else (nums[0], nums[1], nums[2])
                if step == 0 or abs((end - start) // step) > 100_000:
                    return self._unresolved(node, "command")
                return "\n".join(str(v) for v in range(start, end + (1 if step > 0 else -1), step))
        except ValueError:
            return self._unresolved(node, "command")
        if name == "dirname" and len(args) == 1:
            return posixpath.dirname(args[0]) or "."
        if name == "basename" and len(args) in (1, 2):
            base = posixpath.basename(args[0])
            return base[: -len(args[1])] if len(args) == 2 and base.endswith(args[1]) else base
        if name == "realpath" and len(args) == 1:
            return posixpath.normpath(args[0])
        if name == "echo":
            return " ".join(args)
        return self._unresolved(node, "command")

    def _simple_words(self, node: Any) -> list[str] | None:
        if node.type == "redirected_statement":
            body = node.child_by_field_name("body")
            if body is None:
                return None
            node = body
        if node.type != "command":
            return None
        out: list[str] = []
        for c in node.children:
            if c.type in ("command_name", "word", "string", "raw_string", "number", "concatenation",
                          "expansion", "simple_expansion", "command_substitution", "ansi_c_string"):
                out.extend(self._fields(c.children[0] if c.type == "command_name" else c))
            elif c.type in ("file_redirect",):
                continue
            else:
                return None
        return out

    def _word_text(self, node: Any) -> str:
        """One node as one string (no field splitting): defaults, assignment values."""
        return " ".join(self._parts(node, quoted=True))

    def _parts(self, node: Any, quoted: bool) -> list[str]:
        """A word node as fields before splitting of literal text: expansions may give several."""
        t = node.type
        if t in ("word", "number", "heredoc_start"):
            return [_unescape_word(node.text.decode("utf-8", "replace"))]
        if t == "raw_string":
            return [node.text.decode("utf-8", "replace")[1:-1]]
        if t == "ansi_c_string":
            return [_ansi_c(node.text.decode("utf-8", "replace"))]
        if t in ("expansion", "simple_expansion"):
            return self._expansion(node, quoted)
        if t == "command_substitution":
            value = self._command_subst(node)
            return [value] if quoted else value.split()
        if t == "arithmetic_expansion":
            return [self._unresolved(node, "command")]
        if t == "string":
            return self._string(node)
        if t == "concatenation":
            pieces = [""]
            for c in node.children:
                sub = self._parts(c, quoted)
                if not sub:
                    continue
                pieces[-1] += sub[0]
                pieces.extend(sub[1:])
            return pieces
        return [self._unresolved(node, "operator")]

    def _string(self, node: Any) -> list[str]:
        """A double-quoted string, every byte between its children kept (newlines, spaces); an
        array "[@]" expansion inside it gives several fields."""
        base = node.start_byte
        pieces = [""]
        pos = base + 1
        for c in node.children:
            if c.type == '"':
                continue
            if c.start_byte > pos:
                pieces[-1] += _unescape_dq(self.src[pos:c.start_byte].decode("utf-8", "replace"))
            if c.type == "string_content":
                pieces[-1] += _unescape_dq(c.text.decode("utf-8", "replace"))
            else:
                sub = self._parts(c, quoted=True)
                if sub:
                    pieces[-1] += sub[0]
                    pieces.extend(sub[1:])
                else:  # "${EMPTY[@]}" alone is no word at all
                    if len(node.children) == 3:
                        return []
            pos = c.end_byte
        end = node.end_byte - 1
        if end > pos:
            pieces[-1] += _unescape_dq(self.src[pos:end].decode("utf-8", "replace"))
        return pieces

    def _fields(self, node: Any) -> list[str]:
        """A word as bash passes it: unquoted expansions split on whitespace."""
        t = node.type
        if t in ("string", "raw_string", "ansi_c_string"):
            return self._parts(node, quoted=True)
        if t in ("expansion", "simple_expansion", "command_substitution"):
            return [f for p in self._parts(node, quoted=False) for f in (p.split() if p else [])]
        if t == "concatenation":
            unquoted = any(c.type in ("expansion", "simple_expansion", "command_substitution") for c in node.children)
            parts = self._parts(node, quoted=not unquoted)
            return [f for p in parts for f in p.split()] if unquoted else parts
        return self._parts(node, quoted=False)

    # --- statements ---------------------------------------------------------------------------
    def run(self, text: str, depth: int = 0) -> None:
        src = text.encode("utf-8", "replace")
        tree = _parser().parse(src)
        err = _first_error(tree.root_node)
        if err is not None and err.is_missing and err.parent is not None:  # an opened construct never closed
            opener = err.parent.children[0].text.decode("utf-8", "replace") if err.parent.children else ""
            if err.type in ('"', "'"):
                raise BashStaticError(_line(err.parent), "import.syntax.quote", text=opener)
            owner = err.parent.parent
            if err.parent.type == "array" and owner is not None and owner.child_by_field_name("name") is not None:
                raise BashStaticError(_line(err.parent), "import.array_open",
                                      name=owner.child_by_field_name("name").text.decode("utf-8", "replace"))
            raise BashStaticError(_line(err.parent), "import.syntax.unclosed", opener=opener, closer=err.type)
        if err is not None:
            snippet = err.text.decode("utf-8", "replace").strip()
            key = "import.syntax.quote" if snippet[:1] in ("'", '"') or "'" in snippet or '"' in snippet \
                else "import.syntax.error"
            raise BashStaticError(_line(err), key, text=snippet.splitlines()[0][:60] if snippet else "")
        saved, self.src = self.src, src
        try:
            for node in tree.root_node.children:
                self._statement(node, depth)
        finally:
            self.src = saved

    def _statement(self, node: Any, depth: int, condition: bool = False) -> None:
        t = node.type
        if t in ("comment", "\n", ";", "&", "&&", "||", "heredoc_body", "!"):
            return
        if t in _REFUSED:
            raise BashStaticError(_line(node), f"import.refused.{_REFUSED[t]}")
        if t in ("list", "pipeline", "negated_command"):
            for c in node.children:
                self._statement(c, depth)
            return
        if t == "if_statement":
            self._if(node, depth)
            return
        if t == "compound_statement":
            for c in node.children:
                self._statement(c, depth)
            return
        if t == "variable_assignment":
            self._assign(node)
            return
        if t == "variable_assignments":
            for c in node.children:
                self._statement(c, depth)
            return
        if t == "declaration_command":
            for c in node.children:
                if c.type == "variable_assignment":
                    self._assign(c)
            return
        if t == "unset_command":
            for c in node.children[1:]:
                name = c.text.decode()
                self.out.scalars.pop(name, None)
                self.out.arrays.pop(name, None)
            return
        if t == "redirected_statement":
            body = node.child_by_field_name("body")
            if body is not None:
                self._statement(body, depth)
            return
        if t == "command":
            self._command(node, depth)
            return
        if t in ("test_command", "[[", "]]"):
            return
        raise BashStaticError(_line(node), "import.refused.other", what=t)

    def _if(self, node: Any, depth: int) -> None:
        """Branches of an `if` this reader cannot decide: what they assign becomes unknown."""
        why = Unresolved(_line(node), node.text.decode("utf-8", "replace").splitlines()[0][:80], "condition")
        for c in node.children:
            for sub in _walk(c):
                if sub.type == "variable_assignment":
                    name = sub.child_by_field_name("name")
                    if name is not None:
                        n = name.text.decode()
                        self.out.unknown[n] = why
                        self.out.scalars.pop(n, None)
                        self.out.arrays.pop(n, None)
                elif sub.type in _REFUSED:
                    raise BashStaticError(_line(sub), f"import.refused.{_REFUSED[sub.type]}")

    def _assign(self, node: Any) -> None:
        name_node = node.child_by_field_name("name")
        value = node.child_by_field_name("value")
        if name_node is None or name_node.type != "variable_name":
            raise BashStaticError(_line(node), "import.refused.other", what="assignment")
        name = name_node.text.decode()
        append = any(c.type == "+=" for c in node.children)
        self.out.unknown.pop(name, None)
        if value is not None and value.type == "array":
            words: list[Word] = []
            for c in value.children:
                if c.type in ("(", ")", "comment"):
                    continue
                from_array = self._array_words(c)
                words += from_array if from_array is not None else [Word(f, _line(c)) for f in self._fields(c)]
            if append:
                self.out.arrays.setdefault(name, []).extend(words)
            else:
                self.out.arrays[name] = words
                self.out.scalars.pop(name, None)
            return
        text = "" if value is None else self._word_text(value)
        if append and name in self.out.arrays:
            self.out.arrays[name].append(Word(text, _line(node)))
            return
        self.out.scalars[name] = (self.out.scalars.get(name, "") + text) if append else text
        self.out.arrays.pop(name, None)

    def _array_words(self, node: Any) -> list[Word] | None:
        """`${A[@]}` / `"${A[@]}"` alone as a word: the array's words with the lines they were
        written on (so a flag from an array is named with its own line), else None."""
        quoted = node.type == "string"
        if quoted:
            inner = [c for c in node.children if c.type != '"']
            if len(inner) != 1 or node.end_byte - node.start_byte != inner[0].end_byte - inner[0].start_byte + 2:
                return None
            node = inner[0]
        if node.type != "expansion":
            return None
        kids = [c for c in node.children if c.type not in ("${", "}")]
        if len(kids) != 1 or kids[0].type != "subscript":
            return None
        name = kids[0].child_by_field_name("name").text.decode()
        index = kids[0].child_by_field_name("index").text.decode()
        if index != "@" or name not in self.out.arrays or name in self.out.unknown:
            return None
        words = self.out.arrays[name]
        return list(words) if quoted else [Word(f, w.line) for w in words for f in w.text.split()]

    def _command(self, node: Any, depth: int) -> None:
        words: list[Word] = []
        for c in node.children:
            if c.type == "variable_assignment":  # `X=1 cmd`: the environment of that command only
                continue
            if c.type in ("file_redirect", "herestring_redirect"):
                continue
            target = c.children[0] if c.type == "command_name" else c
            from_array = self._array_words(target)
            words.extend(from_array if from_array is not None else (Word(f, _line(c)) for f in self._fields(target)))
        if not words:
            return
        if words[0].text in ("source", ".") and len(words) >= 2:
            self._source(_line(node), words[1].text, depth)
            return
        self.out.commands.append(Command(_line(node), words))

    def _source(self, line: int, path: str, depth: int) -> None:
        if depth >= MAX_SOURCE_DEPTH:
            raise BashStaticError(line, "import.source_depth", path=path)
        text = self.read_source(path)
        self.out.sourced.append(Sourced(line, path, text is not None))
        if text is None:
            return
        saved = self.script_path
        self.script_path = path
        try:
            self.run(text, depth + 1)
        except BashStaticError as exc:
            raise BashStaticError(line, "import.source_error", path=path, error=str(exc)) from None
        finally:
            self.script_path = saved


def _walk(node: Any):
    yield node
    for c in node.children:
        yield from _walk(c)


def evaluate(text: str, read_source: Callable[[str], str | None], script_path: str = "script.sh") -> Evaluated:
    """Evaluate `text` statically. `read_source(path)` gives the text of a sourced file (None: not found)."""
    ev = _Eval(read_source, script_path)
    ev.run(text)
    return ev.out
