"""The import graphs of slime/ and lab/: cycles, imports of another module's private names,
forbidden arrows.

    python tools/import_graph.py            # prints the three lists of both; exit 1 when any is non-empty
    python tools/import_graph.py --edges    # also prints every arrow (module -> module)

Every import counts, at module level or inside a function: a lazy import still makes the two
modules know each other, and hiding a cycle inside a function is how cycles grow unnoticed.
The rules (FORBIDDEN for slime/, LAB_FORBIDDEN for lab/) say which way the layers point;
tests/runtime/test_import_graph.py and tests/lab/test_import_layers.py fail on any cycle,
private-name import or forbidden arrow.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "slime"


@dataclass(frozen=True)
class Rule:
    source: str  # a module or package prefix ("slime.rollout" covers slime.rollout.*)
    target: str
    why: str
    allowed: tuple[str, ...] = ()  # targets under `target` that remain allowed


# Arrows that point the wrong way. The parser names backends through the registry (torch-free,
# resolved by string); rollout engines and the inference engine never reach into a trainer backend;
# the inference engine and the HF model loading are libraries below everything that runs them.
FORBIDDEN: tuple[Rule, ...] = (
    *(Rule(parser, "slime.backends", "the parser names a backend through slime.backends.registry",
           allowed=("slime.backends.registry",))
      for parser in ("slime.args", "slime.flags", "slime.config", "slime.megatron_flags", "slime.refusals",
                     "slime.limits", "slime.estimators")),
    Rule("slime.rollout", "slime.backends", "rollout engines use slime.inference / slime.hf, not a trainer backend"),
    Rule("slime.sync", "slime.backends", "weight transports use slime.hf, not a trainer backend"),
    *(Rule(lib, upper, f"{lib} is a library below {upper}")
      for lib in ("slime.inference", "slime.hf")
      for upper in ("slime.backends", "slime.rollout", "slime.ray", "slime.sync", "slime.args", "slime.loop")),
    Rule("slime.hf", "slime.inference", "loading a model knows nothing of serving it"),
    *(Rule(lower, "slime.ray", "only the loop drives Ray actors")
      for lower in ("slime.backends", "slime.rollout", "slime.inference", "slime.hf", "slime.training",
                    "slime.data", "slime.sync", "slime.rewards")),
)


# The lab's layers, highest first: web → render → rules → core. A layer imports only the layers
# after it (docs/en/code-architecture.md), so the rules are every arrow to an earlier one.
LAB_LAYERS = ("lab.web", "lab.render", "lab.rules", "lab.core")
LAB_FORBIDDEN: tuple[Rule, ...] = tuple(
    Rule(lower, upper, f"{lower} is a layer below {upper} (web → render → rules → core)")
    for i, upper in enumerate(LAB_LAYERS) for lower in LAB_LAYERS[i + 1:])
RULES = {"slime": FORBIDDEN, "lab": LAB_FORBIDDEN}


def module_of(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    return {module_of(p, root): p for p in sorted((root / package).rglob("*.py"))}


@dataclass(frozen=True)
class Import:
    source: str
    target: str  # a module of the package
    line: int
    names: tuple[str, ...]  # names taken from target (from-imports and module-attribute uses)


def _base(source: str, is_package: bool, level: int, module: str | None) -> str:
    """The absolute module of a (possibly relative) from-import."""
    if level == 0:
        return module or ""
    parts = source.split(".")
    if not is_package:
        parts = parts[:-1]
    parts = parts[: len(parts) - (level - 1)]
    return ".".join([*parts, module] if module else parts)


def imports_of(source: str, path: Path, known: set[str]) -> list[Import]:
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found: list[Import] = []
    aliases: dict[str, str] = {}  # local name -> module bound by `import a.b as m` / `from a import b`
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known:
                    found.append(Import(source, a.name, node.lineno, ()))
                    if a.asname:
                        aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom):
            base = _base(source, is_package, node.level, node.module)
            if base not in known:
                continue
            names: list[str] = []
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in known:  # `from pkg import module`: an arrow to the module itself
                    found.append(Import(source, sub, node.lineno, ()))
                    aliases[a.asname or a.name] = sub
                else:
                    names.append(a.name)
            if names:
                found.append(Import(source, base, node.lineno, tuple(names)))
    for node in ast.walk(tree):  # `module._private` through an imported module's name
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            found.append(Import(source, aliases[node.value.id], node.lineno, (node.attr,)))
    return found


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@dataclass(frozen=True)
class Graph:
    imports: tuple[Import, ...]

    @property
    def edges(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for i in self.imports:
            if i.target != i.source:
                out.setdefault(i.source, set()).add(i.target)
        return out

    def cycles(self) -> list[list[str]]:
        """Strongly connected components of more than one module (Tarjan), each sorted."""
        edges = self.edges
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on: set[str] = set()
        out: list[list[str]] = []

        def visit(v: str) -> None:
            index[v] = low[v] = len(index)
            stack.append(v)
            on.add(v)
            for w in sorted(edges.get(v, ())):
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))

        for v in sorted(edges):
            if v not in index:
                visit(v)
        return sorted(out)

    def private_imports(self) -> list[str]:
        return sorted({f"{i.source}:{i.line} takes {n} from {i.target}"
                       for i in self.imports for n in i.names if is_private(n) and i.target != i.source})

    def forbidden(self, rules: tuple[Rule, ...] = FORBIDDEN) -> list[str]:
        def under(module: str, prefix: str) -> bool:
            return module == prefix or module.startswith(prefix + ".")

        out = set()
        for i in self.imports:
            why = next((r.why for r in rules if under(i.source, r.source) and under(i.target, r.target)
                        and not any(under(i.target, a) for a in r.allowed)), None)  # the first rule that says no
            if why is not None:
                out.add(f"{i.source}:{i.line} -> {i.target} ({why})")
        return sorted(out)


def build(root: Path = ROOT, package: str = PACKAGE) -> Graph:
    mods = modules(root, package)
    known = set(mods)
    return Graph(tuple(i for name, path in mods.items() for i in imports_of(name, path, known)))


def main(argv: list[str]) -> int:
    failed = False
    for package, rules in RULES.items():
        failed |= report(build(package=package), package, rules, "--edges" in argv)
    return 1 if failed else 0


def report(g: Graph, package: str, rules: tuple[Rule, ...], edges: bool) -> bool:
    """Print the package's three lists (and its arrows with `edges`); True when any is non-empty."""
    print(f"== {package}/")
    if edges:
        for src, targets in sorted(g.edges.items()):
            for t in sorted(targets):
                print(f"{src} -> {t}")
    cycles, private, forbidden = g.cycles(), g.private_imports(), g.forbidden(rules)
    print(f"cycles: {len(cycles)}")
    for c in cycles:
        print("  " + " <-> ".join(c))
    print(f"private-name imports: {len(private)}")
    for p in private:
        print("  " + p)
    print(f"forbidden arrows: {len(forbidden)}")
    for f in forbidden:
        print("  " + f)
    return bool(cycles or private or forbidden)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
