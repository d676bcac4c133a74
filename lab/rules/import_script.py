"""Import a hand-written launch script (the style of slime's `scripts/run-*.sh`) into an experiment.

The script is read, never run: `lab.core.bash_static` parses it with tree-sitter's bash grammar and
evaluates assignments, arrays, `${X:-d}`, multi-line quotes, `source` of a model spec and
`$(seq …)` statically; what it cannot evaluate is named with its line.

The architecture comes from the script: the MODEL_ARGS it ends with (its sourced spec, plus its own
overrides of those flags) is matched by content against the shipped specs (scripts/models/); a
match opens that spec's recipe, anything else becomes a custom model carried in `model.spec_args`.
The script wins: its values fill the fields, flags no control covers go to `advanced.extra_flags`,
and a flag the recipe's command would add but the script does not pass goes to
`advanced.unset_flags` (the runtime's default applies). Every remaining difference between the
script's train command and the rendered one is listed in the import report (`Imported.report`).

The result opens as B against the nearest recipe as A.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from lab.core.argv import experiment_model_args, runtime_argv
from lab.core.bash_static import MAX_SCRIPT_BYTES, BashStaticError, Evaluated, Word, evaluate
from lab.core.change import ChangeError
from lab.core.experiment import (
    EXTRA_FLAGS_PATH,
    FIELD_FLAGS,
    PRIVATE_FIELDS,
    SIMPLE_FLAG,
    Experiment,
    fields_of_flag,
    get_path,
    iter_field_paths,
)
from lab.core.messages import ref
from lab.core.recipes import REPO_ROOT, all_recipes, get_recipe
from lab.core.train_flags import FIELD_OF_FLAG
from lab.rules.dependents import apply_change, new_experiment

_ENTRY = re.compile(r"(?:^|/)(train|train_async)\.py$")
SHIPPED_MODELS = REPO_ROOT / "scripts" / "models"


class ScriptImportError(ValueError):
    """A script this importer cannot read, naming its line. `key` + `params` are the catalogue text
    (lab/locales/messages.*.json, `import.*`; `line` is one of the params): the API words it in the
    page's language; `str()` is its English."""

    def __init__(self, line: int, key: str, **params: Any) -> None:
        from lab.core.messages import render

        self.line = line
        self.key = key
        self.params = {"line": line, **params}
        super().__init__(render(key, self.params, "en"))


@dataclass
class LaunchScript:
    argv: list[str]
    entry: str  # train.py | train_async.py
    model_spec: str | None  # the spec file it sources (as written after evaluation)
    model_args: list[str] = field(default_factory=list)  # MODEL_ARGS as the train command sees it
    argv_lines: list[int] = field(default_factory=list)  # the script line of each argv word
    entry_line: int = 1
    evaluated: Evaluated | None = None


@dataclass
class ReportItem:
    """One difference between the script's train command and the rendered one, or one value the
    importer could not evaluate. kind: normalised | differs | unresolved. `text` is the catalogue
    reference of the reason (import.report.*, worded in the page's language); `why` its English."""

    kind: str
    flag: str
    line: int
    script: list[str] | None
    rendered: list[str] | None
    text: dict[str, Any]

    @property
    def why(self) -> str:
        from lab.core.messages import render

        return render(self.text["key"], self.text["params"], "en")

    def as_dict(self, lang: str = "en") -> dict[str, Any]:
        from lab.core.messages import localize_text

        return {"kind": self.kind, "flag": self.flag, "line": self.line, "script": self.script,
                "rendered": self.rendered, "why": localize_text(self.text["key"], self.text["params"], lang)}


@dataclass
class Imported:
    a: Experiment
    b: Experiment
    entry: str
    unknown: list[str]  # flags placed in advanced.extra_flags
    script: LaunchScript
    lines: dict[str, int] = field(default_factory=dict)  # each unknown flag -> the script line naming it
    model: str = ""  # "scripts/models/<spec>.sh" when a shipped spec matches; "custom" otherwise
    report: list[ReportItem] = field(default_factory=list)


# --- reading -------------------------------------------------------------------------------------

def _reader(script_path: Path | None, sources: dict[str, str] | None = None):
    """read_source for the evaluator: relative to the script's directory (CLI); on the page, a file
    uploaded with the script under the same name, else a shipped spec by its name (an upload names no
    directory the server may read)."""

    def read(path: str) -> str | None:
        name = Path(path).name
        if sources and name in sources:
            return sources[name]
        candidates: list[Path] = []
        if script_path is not None:
            p = Path(path)
            candidates.append(p if p.is_absolute() else script_path.parent / p)
            candidates += [script_path.parent / "models" / name, script_path.parent / name]  # a copied spec
        if path.endswith(".sh"):
            candidates.append(SHIPPED_MODELS / Path(path).name)
        for c in candidates:
            try:
                if c.is_file() and c.stat().st_size <= MAX_SCRIPT_BYTES:
                    return c.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
        return None

    return read


def _guard(text: str) -> None:
    if len(text.encode("utf-8", "replace")) > MAX_SCRIPT_BYTES:
        raise ScriptImportError(1, "import.too_large", limit=MAX_SCRIPT_BYTES // 1000)
    bad = next((i for i, c in enumerate(text) if c == "\x00" or (ord(c) < 32 and c not in "\t\n\r\f")), None)
    if bad is not None:
        raise ScriptImportError(text.count("\n", 0, bad) + 1, "import.binary")


def script_text(path: Path) -> str:
    """A launch script file's text; a binary or oversized file is refused naming its line."""
    if path.stat().st_size > MAX_SCRIPT_BYTES:
        raise ScriptImportError(1, "import.too_large", limit=MAX_SCRIPT_BYTES // 1000)
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScriptImportError(data.count(b"\n", 0, exc.start) + 1, "import.binary") from None
    _guard(text)
    return text


def read_script(text: str, path: Path | None = None, sources: dict[str, str] | None = None) -> LaunchScript:
    _guard(text)
    for source in (sources or {}).values():
        _guard(source)
    script_path = str(path.resolve()) if path is not None else "scripts/run.sh"
    try:
        ev = evaluate(text, _reader(path, sources), script_path)
    except BashStaticError as exc:
        raise ScriptImportError(exc.line, exc.key, **{k: v for k, v in exc.params.items() if k != "line"}) from None
    for s in ev.sourced:
        if not s.found:
            raise ScriptImportError(s.line, "import.source_missing", path=s.path)
    entry_cmd = None
    for cmd in ev.commands:
        k = next((i for i, w in enumerate(cmd.words) if _ENTRY.search(w.text)), None)
        if k is not None:
            entry_cmd = (cmd, k)
    if entry_cmd is None:
        raise ScriptImportError(len(text.splitlines()) or 1, "import.no_entry")
    cmd, k = entry_cmd
    argv_words: list[Word] = cmd.words[k + 1:]
    entry = "train_async.py" if "train_async" in cmd.words[k].text else "train.py"
    spec = next((s.path for s in ev.sourced if "MODEL_ARGS" in ev.arrays), None)
    model_args = [w.text for w in ev.arrays.get("MODEL_ARGS", [])]
    return LaunchScript([w.text for w in argv_words], entry, spec, model_args, [w.line for w in argv_words],
                        cmd.line, ev)


def _split(argv: list[str]) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    for tok in argv:
        if tok.startswith("--"):
            if "=" in tok:
                k, v = tok.split("=", 1)
                out.append((k, [v]))
            else:
                out.append((tok, []))
        elif out:
            out[-1][1].append(tok)
    return out


def flag_values(argv: list[str]) -> dict[str, list[str]]:
    """flag -> its values, the last occurrence winning (as the runtime's parser reads it)."""
    return dict(_split(argv))


_TYPES = {p: info.annotation for p, info in iter_field_paths()}


def _convert(path: str, values: list[str]) -> Any:
    ann = str(_TYPES[path])
    if "bool" in ann:
        return True
    v = values[0] if values else ""
    if "list" in ann:
        return list(values)
    if "int" in ann and "float" not in ann:
        return int(v)
    if "float" in ann:
        return float(v)
    return v


# Flags the lab always writes although a script may leave them out: the runtime's own default
# differs from upstream slime's (embedded backends here, Megatron + SGLang there). Each one added
# is a listed normalisation in the import report.
ALWAYS_WRITTEN = {  # flag -> the catalogue text that says why (import.report.*)
    "--train-backend": "import.report.backend",
    "--rollout-backend": "import.report.backend",
    "--sglang-config": "import.report.sglang_config",
}
# Script flags the lab writes in another form (each listed as a normalisation).
REWRITTEN = {
    "--prefill-num-servers": "import.report.prefill",
}


# --- the architecture ----------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _shipped_specs() -> tuple[tuple[str, tuple[tuple[str, tuple[str, ...]], ...]], ...]:
    out = []
    for p in sorted(SHIPPED_MODELS.glob("*.sh")):
        ev = evaluate(p.read_text(encoding="utf-8"), lambda _: None, str(p))
        flags = flag_values([w.text for w in ev.arrays.get("MODEL_ARGS", [])])
        out.append((f"scripts/models/{p.name}", tuple(sorted((k, tuple(v)) for k, v in flags.items()))))
    return tuple(out)


def _same(a: list[str] | None, b: list[str] | None) -> bool:
    """Same values, numbers compared as numbers (0.00 is the 0 the lab writes)."""
    if a is None or b is None or len(a) != len(b):
        return False
    for x, y in zip(a, b):
        try:
            if float(x) != float(y):
                return False
        except ValueError:
            if x != y:
                return False
    return True


def _same_flags(x: dict[str, list[str]], y: dict[str, list[str]]) -> bool:
    return x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x)


def effective_model_args(script: LaunchScript) -> list[str]:
    """MODEL_ARGS with the script's later values of the same flags applied (the parser's last wins)."""
    argv = flag_values(script.argv)
    out: list[str] = []
    for flag, values in _split(script.model_args):
        out += [flag, *argv.get(flag, values)]
    return out


def match_shipped(model_args: list[str]) -> str | None:
    """The shipped spec (scripts/models/*.sh) with exactly these flags and values, if any."""
    flags = flag_values(model_args)
    for path, shipped in _shipped_specs():
        if _same_flags(flags, {k: list(v) for k, v in shipped}):
            return path
    return None


def nearest_recipe(model_args: list[str], shipped: str | None) -> str:
    """The recipe of a shipped spec; for a custom model the recipe of the same kind (dense, MoE,
    hybrid; MLA or not) whose total parameter count is closest."""
    recipes = all_recipes()
    if shipped:
        return next(n for n, r in recipes.items() if r.model_spec == shipped)
    from slime.model_spec import flags_from_argv, load_model_spec, spec_from_flags

    spec = spec_from_flags(flags_from_argv(model_args), name="custom")
    mla = "--multi-latent-attention" in model_args
    best: tuple[float, str] | None = None
    for name, r in recipes.items():
        if r.backends.train != "megatron" or r.backends.rollout != "sglang" or r.hf_repo is None:
            continue  # the tiny test recipes are no architecture to compare with
        other = load_model_spec(r.model_spec)
        score = abs(other.total_params - spec.total_params) / max(spec.total_params, 1)
        score += (other.kind != spec.kind) * 10 + (("multi-latent-attention" in other.args) != mla) * 5
        if best is None or score < best[0]:
            best = (score, name)
    return best[1] if best else "glm4-9b"


# --- import --------------------------------------------------------------------------------------

def _line(script: LaunchScript, flag: str) -> int:
    """The script line of the last occurrence of `flag` in the train command."""
    for i in range(len(script.argv) - 1, -1, -1):
        if script.argv[i].split("=", 1)[0] == flag:
            return script.argv_lines[i]
    return script.entry_line


def _refuse_unsupported(script: LaunchScript, given: dict[str, list[str]]) -> None:
    loss = given.get("--loss-type")
    if loss and loss[0] == "sft_loss":
        raise ScriptImportError(_line(script, "--loss-type"), "import.sft")
    # A value of the train command that needs the machine to evaluate is named, never written as text.
    for u in script.evaluated.unresolved if script.evaluated else []:
        for i, word in enumerate(script.argv):
            if u.text in word and script.argv_lines[i] == u.line:
                flag = next((script.argv[j] for j in range(i, -1, -1) if script.argv[j].startswith("--")), word)
                raise ScriptImportError(u.line, "import.unresolved", flag=flag.split("=", 1)[0], text=u.text,
                                        why=ref(f"import.why.{u.why}"))


def _int(script: LaunchScript, flag: str, values: list[str], path: str) -> int:
    try:
        return int(values[0])
    except (ValueError, IndexError):
        raise ScriptImportError(_line(script, flag), "import.bad_value", flag=flag, values=" ".join(values),
                                path=path) from None


def _field_changes(script: LaunchScript, given: dict[str, list[str]]) -> list[tuple[str, Any, str]]:
    """(field, value, the flag it comes from) for every field the script's flags set, and the
    switches and optional values a recipe sets that the script leaves out (reset)."""
    changes: list[tuple[str, Any, str]] = []  # (path, value, flag)
    if script.entry == "train_async.py":
        changes.append(("placement.scheduling", "async", ""))
    if "--colocate" in given:
        changes.append(("placement.ownership", "colocated", "--colocate"))
    elif "--rollout-external-engine-addrs" in given:
        changes += [("placement.external_engine_addrs", given["--rollout-external-engine-addrs"],
                     "--rollout-external-engine-addrs"),
                    ("placement.ownership", "external", "--rollout-external-engine-addrs")]
    elif "--rollout-num-gpus" in given:
        changes += [("placement.ownership", "disaggregated", "--rollout-num-gpus"),
                    ("placement.rollout_gpus", _int(script, "--rollout-num-gpus", given["--rollout-num-gpus"],
                                                    "placement.rollout_gpus"), "--rollout-num-gpus")]
    nodes = _int(script, "--actor-num-nodes", given.get("--actor-num-nodes", ["1"]), "placement.nodes")
    per = _int(script, "--actor-num-gpus-per-node", given.get("--actor-num-gpus-per-node", ["8"]),
               "placement.gpus_per_node")
    changes.append(("placement.train_gpus", nodes * per, "--actor-num-gpus-per-node"))
    if "--prefill-num-servers" in given:
        changes.append(("serving.pd.enabled", True, "--prefill-num-servers"))
    for flag, values in given.items():
        path = FIELD_OF_FLAG.get(flag)  # the renderer's own table, read backwards
        if not path or path == EXTRA_FLAGS_PATH:
            continue
        if not values and "bool" not in str(_TYPES[path]):
            raise ScriptImportError(_line(script, flag), "import.no_value", flag=flag, path=path)
        try:
            changes.append((path, _convert(path, values), flag))
        except ValueError:
            raise ScriptImportError(_line(script, flag), "import.bad_value", flag=flag, values=" ".join(values),
                                    path=path) from None
    if "--eval-prompt-data" in given and len(given["--eval-prompt-data"]) >= 2:
        ev = given["--eval-prompt-data"]
        changes += [("evaluation.enabled", True, "--eval-prompt-data"), ("evaluation.name", ev[0], "--eval-prompt-data"),
                    ("evaluation.data_path", ev[1], "--eval-prompt-data")]
    if "--sglang-disaggregation-ib-device" in given:
        changes.append(("serving.pd.rdma_devices", ",".join(given["--sglang-disaggregation-ib-device"]).split(","),
                        "--sglang-disaggregation-ib-device"))
    # Switches a recipe turns on that the script does not pass: off, so the command says what the
    # script said (the runtime's default).
    for p, flag in SIMPLE_FLAG.items():
        if "bool" in str(_TYPES[p]) and flag not in given:
            changes.append((p, False, flag))
    if "--use-rollout-routing-replay" not in given:
        changes.append(("corrections.r3", False, "--use-rollout-routing-replay"))
    if given.get("--fp8-format") == ["e4m3"] and given.get("--fp8-recipe") == ["blockwise"]:
        changes.append(("precision.training", "fp8", "--fp8-format"))
    if "--optimizer-cpu-offload" not in given:
        changes.append(("resources.cpu_adam", False, "--optimizer-cpu-offload"))
    granularity = given.get("--recompute-granularity", ["none"])
    if granularity and granularity[0] in ("none", "full", "selective"):
        changes.append(("resources.recompute", granularity[0], "--recompute-granularity"))
    if "--eval-prompt-data" not in given:
        changes.append(("evaluation.enabled", False, "--eval-prompt-data"))
    # Optional values a recipe sets (an uneven pipeline split, over-sampling) that the script does not
    # pass: empty, the runtime's default.
    for p, info in iter_field_paths():
        flags = FIELD_FLAGS.get(p, ())
        if len(flags) == 1 and info.default is None and flags[0] not in given and p not in PRIVATE_FIELDS:
            changes.append((p, None, flags[0]))
    return changes


def _cluster_nodes(b: Experiment) -> int:
    """Ray nodes that hold the pools the script asks for (placement.nodes is the cluster, not
    --actor-num-nodes: the lab derives that from the training pool)."""
    p = b.placement
    total = p.train_gpus + p.rollout_gpus if p.ownership == "disaggregated" else max(p.train_gpus, p.rollout_gpus)
    return max(1, -(-total // max(p.gpus_per_node, 1)))


def import_script(text: str, path: Path | None = None, sources: dict[str, str] | None = None) -> Imported:
    """`path`: where the script lies (CLI; sourced files are read relative to it). `sources`: files
    chosen with it on the page, by name."""
    script = read_script(text, path, sources)
    given = flag_values(script.argv)
    _refuse_unsupported(script, given)
    changes = _field_changes(script, given)  # a value of the wrong type is named first
    if not script.model_args:
        raise ScriptImportError(script.entry_line, "import.no_model")
    model_args = effective_model_args(script)
    shipped = match_shipped(model_args)
    try:
        recipe = nearest_recipe(model_args, shipped)
    except Exception as exc:  # the runtime's spec reader refuses the dimensions: name the source line
        line = next((s.line for s in script.evaluated.sourced), script.entry_line) if script.evaluated else 1
        raise ScriptImportError(line, "import.bad_spec", error=str(exc)) from None
    a = new_experiment(recipe)
    b = a
    report: list[ReportItem] = []
    reasons: dict[str, dict[str, Any]] = {}  # flag -> why the rendered command cannot repeat it
    if not shipped:
        b, _ = apply_change(b, "model.spec_args", shlex.join(model_args))
    # A change may rewrite fields set before it (a new PP re-derives the pipeline split): the
    # script's own values are applied again until they hold, so the script wins over dependents.
    for round_ in range(3):
        for p, value, flag in changes if round_ == 0 else [c for c in changes if c[2] in given]:
            if round_ and get_path(b.model_dump(), p) == value:
                continue
            try:
                b, _ = apply_change(b, p, value)
            except ChangeError as exc:
                if flag:
                    reasons[flag] = ref("import.report.field", field=p,
                                        reason=ref(exc.key, **exc.params) if exc.key else exc.message)
    if b.placement.ownership == "colocated" and b.placement.rollout_gpus != b.placement.train_gpus:
        b, _ = apply_change(b, "placement.rollout_gpus", b.placement.train_gpus)  # --colocate: one pool
    if b.placement.nodes != _cluster_nodes(b):
        b, _ = apply_change(b, "placement.nodes", _cluster_nodes(b))
    if "--prefill-num-servers" in given and b.serving.pd.enabled:
        pre = _int(script, "--prefill-num-servers", given["--prefill-num-servers"], "serving.pd.prefill_engines")
        engines = max(b.placement.rollout_gpus // max(b.placement.engine_gpus, 1), 2)
        for p, value in (("serving.pd.prefill_engines", pre), ("serving.pd.decode_engines", max(engines - pre, 1))):
            b, _ = apply_change(b, p, value)
    b = _script_wins(b, script, given, reasons)
    unknown = list(flag_values(shlex.split(b.advanced.extra_flags)))
    report += round_trip_report(b, script, reasons)
    command_lines = set(script.argv_lines) | {script.entry_line}
    for u in script.evaluated.unresolved if script.evaluated else []:
        if u.line in command_lines:  # a value that reaches the command; the rest never runs here
            report.append(ReportItem("unresolved", "", u.line, [u.text], None,
                                     ref("import.report.unresolved", text=u.text, why=ref(f"import.why.{u.why}"))))
    return Imported(a, b, script.entry, unknown, script, {f: _line(script, f) for f in unknown},
                    shipped or "custom", report)


def _script_wins(b: Experiment, script: LaunchScript, given: dict[str, list[str]],
                 reasons: dict[str, dict[str, Any]]) -> Experiment:
    """Flags no field holds go to extra_flags; flags the lab would add that the script does not pass
    go to unset_flags (the runtime's default applies)."""
    model = flag_values(model_args_of(b))
    rendered = {f: v for f, v in flag_values(runtime_argv(b)).items() if f not in model or f in given}
    unset = [f for f in rendered if f not in given and f not in model and f not in ALWAYS_WRITTEN]
    extra: list[str] = []
    for flag, values in given.items():
        if flag in REWRITTEN or (flag in model and _same(model[flag], values)) or _same(rendered.get(flag), values):
            continue
        owners = [p for p in fields_of_flag(flag) if p != EXTRA_FLAGS_PATH]
        if owners:  # a control owns it and could not take the script's value: listed, not doubled
            reasons.setdefault(flag, ref("import.report.held", field=owners[0]))
            continue
        if flag in rendered:
            unset.append(flag)  # the recipe's fixed value gives way to the script's
        extra += [flag, *values]
    if unset:
        b, _ = apply_change(b, "advanced.unset_flags", unset)
    if extra:
        b, _ = apply_change(b, EXTRA_FLAGS_PATH, shlex.join(extra))
    return b


def model_args_of(exp: Experiment) -> list[str]:
    return experiment_model_args(exp, get_recipe(exp.model.recipe))


def round_trip_report(b: Experiment, script: LaunchScript,
                      reasons: dict[str, dict[str, Any]] | None = None) -> list[ReportItem]:
    """Every flag/value pair of the script's train command the rendered command does not repeat,
    and every flag the rendered one adds, each with its reason."""
    ours = flag_values(script.argv)
    theirs = flag_values(runtime_argv(b))
    out: list[ReportItem] = []
    for flag, values in ours.items():
        if _same(theirs.get(flag), values):
            continue
        key = REWRITTEN.get(flag)
        why = ref(key, flag=flag) if key else (reasons or {}).get(flag, ref("import.report.other"))
        out.append(ReportItem("normalised" if key else "differs", flag, _line(script, flag), values,
                              theirs.get(flag), why))
    for flag, values in theirs.items():
        if flag not in ours:
            key = ALWAYS_WRITTEN.get(flag)
            why = ref(key, flag=flag, value=" ".join(values)) if key else ref("import.report.added")
            out.append(ReportItem("normalised" if key else "differs", flag, script.entry_line, None, values, why))
    return out


def pair_counts(script_argv: list[str], rendered_argv: list[str]) -> tuple[int, int]:
    """(pairs of the script's command, pairs the rendered command repeats exactly)."""
    ours = flag_values(script_argv)
    theirs = flag_values(rendered_argv)
    return len(ours), sum(1 for f, v in ours.items() if _same(theirs.get(f), v))
