"""Import a hand-written launch script: read (never run) bash in the style of slime's
`scripts/run-*.sh` and turn it into an experiment.

Understood: `NAME=( ... )` arrays over several lines (comments allowed), `NAME=value` and
`export NAME=value` scalars, `${NAME}` / `"${NAME[@]}"` expansion of those, `source
scripts/models/<spec>.sh` (MODEL_ARGS read by the runtime's own reader), and the command line that
runs `train.py` / `train_async.py` (after `ray job submit ... --` or directly). Everything else
(`ray start`, `pkill`, `$(...)`) is skipped; nothing is executed.

The result opens as B against the closest recipe as A: recognised flags fill fields through
`lab.rules.apply_change`, every other flag lands in `advanced.extra_flags`, listed. A script that
cannot be read raises ScriptImportError naming its line; nothing is changed.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.experiment import EXTRA_FLAGS_PATH, SIMPLE_FLAG, Experiment, iter_field_paths
from lab.recipes import REPO_ROOT, all_recipes
from lab.rules import ChangeError, apply_change, new_experiment

_ASSIGN = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(\[@\])?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_ENTRY = re.compile(r"(?:^|/)(train|train_async)\.py$")


class ScriptImportError(ValueError):
    """A script this importer cannot read, naming its line. `key` + `params` are the catalogue text
    (lab/locales/messages.*.json, `import.*`; `line` is one of the params): the API words it in the
    page's language; `str()` is its English."""

    def __init__(self, line: int, key: str, **params: Any) -> None:
        from lab.messages import render

        self.line = line
        self.key = key
        self.params = {"line": line, **params}
        super().__init__(render(key, self.params, "en"))


@dataclass
class LaunchScript:
    argv: list[str]
    entry: str  # train.py | train_async.py
    model_spec: str | None  # scripts/models/<name>.sh it sources
    model_args: list[str] = field(default_factory=list)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    buf, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        if not buf:
            start = n
        if raw.rstrip().endswith("\\"):
            buf += raw.rstrip()[:-1] + " "
            continue
        buf += raw
        out.append((start, buf))
        buf = ""
    if buf:
        out.append((start, buf))
    return out


def _words(line: int, text: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError:  # shlex's other refusal, a trailing backslash, cannot come: _logical_lines joins it
        raise ScriptImportError(line, "import.syntax.quote") from None


def _expand(words: list[str], scalars: dict[str, str], arrays: dict[str, list[str]]) -> list[str]:
    out: list[str] = []
    for w in words:
        m = re.fullmatch(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\[@\]\}", w)
        if m:
            out.extend(arrays.get(m.group(1), []))
            continue

        def sub(mm: re.Match) -> str:
            name = mm.group(1) or mm.group(3)
            if name in arrays and not mm.group(2):
                return arrays[name][0] if arrays[name] else ""
            return scalars.get(name, mm.group(0))

        out.append(_REF.sub(sub, w))
    return out


def read_script(text: str) -> LaunchScript:
    scalars: dict[str, str] = {}
    arrays: dict[str, list[str]] = {}
    spec: str | None = None
    model_args: list[str] = []
    lines = _logical_lines(text)
    i = 0
    entry_argv: list[str] | None = None
    entry = "train.py"
    while i < len(lines):
        n, line = lines[i]
        stripped = line.strip()
        i += 1
        if not stripped or stripped.startswith("#"):
            continue
        m = _ASSIGN.match(stripped)
        if m and m.group(2).startswith("("):
            name, body, start = m.group(1), m.group(2)[1:], n
            while not re.search(r"\)\s*(#.*)?$", body):
                if i >= len(lines):
                    raise ScriptImportError(start, "import.array_open", name=name)
                body += "\n" + lines[i][1]
                i += 1
            body = re.sub(r"\)\s*(#.*)?$", "", body.rstrip())
            arrays[name] = _expand(_words(start, body), scalars, arrays)
            continue
        if m:
            value = _words(n, m.group(2))
            scalars[m.group(1)] = " ".join(_expand(value, scalars, arrays))
            continue
        words = _words(n, stripped)
        if words and words[0] in ("source", "."):
            path = _expand(words[1:2], scalars, arrays)[0] if len(words) > 1 else ""
            mm = re.search(r"models/([^/]+\.sh)$", path)
            if mm:
                spec = f"scripts/models/{mm.group(1)}"
                from slime.backends.megatron.model_args import read_model_args

                if (REPO_ROOT / spec).exists():
                    model_args = read_model_args(REPO_ROOT / spec)
                    arrays["MODEL_ARGS"] = list(model_args)
            continue
        for k, w in enumerate(words):
            if _ENTRY.search(w):
                entry = "train_async.py" if "train_async" in w else "train.py"
                entry_argv = _expand(words[k + 1:], scalars, arrays)
                break
    if entry_argv is None:
        raise ScriptImportError(len(text.splitlines()) or 1, "import.no_entry")
    return LaunchScript(entry_argv, entry, spec, model_args)


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


_TYPES = {p: info.annotation for p, info in iter_field_paths()}


def _convert(path: str, values: list[str]) -> Any:
    ann = str(_TYPES[path])
    if "bool" in ann:
        return True
    v = values[0] if values else ""
    if "int" in ann and "float" not in ann:
        return int(v)
    if "float" in ann:
        return float(v)
    return v


# Structural flags: flag -> field it fills (values converted by the field's type).
_STRUCTURAL = {
    "--num-gpus-per-node": "placement.gpus_per_node", "--rollout-num-gpus-per-engine": "placement.engine_gpus",
    "--rm-type": "task.rm_type", "--custom-rm-path": "task.custom_reward_path",
    "--custom-generate-function-path": "task.custom_generate_path",
    "--hf-checkpoint": "paths.hf_checkpoint", "--ref-load": "paths.ref_load", "--prompt-data": "paths.prompt_data",
    "--save": "paths.save", "--load": "paths.load", "--output-dir": "paths.output_dir",
    "--tis-clip": "corrections.tis_clip", "--icepop-low": "corrections.icepop_low", "--icepop-high": "corrections.icepop_high",
    "--use-rollout-routing-replay": "corrections.r3", "--sglang-mem-fraction-static": "serving.mem_fraction_static",
    "--sglang-server-concurrency": "serving.concurrency", "--tensor-model-parallel-size": "resources.tp",
    "--pipeline-model-parallel-size": "resources.pp", "--context-parallel-size": "resources.cp",
    "--expert-model-parallel-size": "resources.ep", "--optimizer-cpu-offload": "resources.cpu_adam",
    "--eval-interval": "evaluation.interval", "--n-samples-per-eval-prompt": "evaluation.n_samples",
    "--rollout-queue-dir": "rollout.queue_state_dir", "--rollout-queue-run-id": "rollout.queue_run_id",
    "--sglang-kv-cache-dtype": "precision.kv_cache_dtype",
}


def closest_recipe(script: LaunchScript) -> str:
    for name, recipe in all_recipes().items():
        if script.model_spec and Path(recipe.model_spec).name == Path(script.model_spec).name:
            return name
    return "glm4-9b"


@dataclass
class Imported:
    a: Experiment
    b: Experiment
    entry: str
    unknown: list[str]  # flags placed in advanced.extra_flags
    script: LaunchScript
    lines: dict[str, int] = field(default_factory=dict)  # each unknown flag -> the script line naming it


def line_of(text: str, flag: str) -> int:
    """The first script line that names `flag` (for messages); 1 when none does."""
    pat = re.compile(rf"(?<![\w-]){re.escape(flag)}(?![\w-])")
    for n, line in enumerate(text.splitlines(), 1):
        if pat.search(line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""):
            return n
    return 1


def _same(a: list[str] | None, b: list[str]) -> bool:
    """Same values, numbers compared as numbers (0.00 is the 0 the lab writes)."""
    if a is None or len(a) != len(b):
        return False
    for x, y in zip(a, b):
        try:
            if float(x) != float(y):
                return False
        except ValueError:
            if x != y:
                return False
    return True


def import_script(text: str) -> Imported:
    script = read_script(text)
    recipe = closest_recipe(script)
    a = new_experiment(recipe)
    b = a
    flags = _split(script.argv)
    given = dict(flags)
    changes: list[tuple[str, Any]] = []
    if script.entry == "train_async.py":
        changes.append(("placement.scheduling", "async"))
    if "--colocate" in given:
        changes.append(("placement.ownership", "colocated"))
    elif "--rollout-external-engine-addrs" in given:
        changes += [("placement.external_engine_addrs", given["--rollout-external-engine-addrs"]),
                    ("placement.ownership", "external")]
    elif "--rollout-num-gpus" in given:
        changes += [("placement.ownership", "disaggregated"), ("placement.rollout_gpus", int(given["--rollout-num-gpus"][0]))]
    if "--actor-num-nodes" in given or "--actor-num-gpus-per-node" in given:
        nodes = int(given.get("--actor-num-nodes", ["1"])[0])
        per = int(given.get("--actor-num-gpus-per-node", ["8"])[0])
        changes.append(("placement.train_gpus", nodes * per))
    if "--prefill-num-servers" in given:
        changes.append(("serving.pd.enabled", True))
    consumed = {"--colocate", "--rollout-external-engine-addrs", "--rollout-num-gpus", "--actor-num-nodes",
                "--actor-num-gpus-per-node", "--prefill-num-servers"}
    reverse = {flag: path for path, flag in SIMPLE_FLAG.items()}
    for flag, values in flags:
        path = reverse.get(flag) or _STRUCTURAL.get(flag)
        if path and path != EXTRA_FLAGS_PATH:
            if not values and "bool" not in str(_TYPES[path]):
                raise ScriptImportError(line_of(text, flag), "import.no_value", flag=flag, path=path)
            try:
                changes.append((path, _convert(path, values)))
            except ValueError:
                raise ScriptImportError(line_of(text, flag), "import.bad_value", flag=flag, values=" ".join(values),
                                        path=path) from None
            consumed.add(flag)
    if "--eval-prompt-data" in given and len(given["--eval-prompt-data"]) >= 2:
        changes += [("evaluation.enabled", True), ("evaluation.name", given["--eval-prompt-data"][0]),
                    ("evaluation.data_path", given["--eval-prompt-data"][1])]
        consumed.add("--eval-prompt-data")
    if "--sglang-disaggregation-ib-device" in given:
        changes.append(("serving.pd.rdma_devices", ",".join(given["--sglang-disaggregation-ib-device"]).split(",")))
        consumed.add("--sglang-disaggregation-ib-device")
    if "--use-tis" in given:
        changes.append(("corrections.icepop", False))
    for path, value in changes:
        try:
            b, _ = apply_change(b, path, value)
        except ChangeError:
            consumed.discard(next((f for f, p in _STRUCTURAL.items() if p == path), ""))
    if "--prefill-num-servers" in given and b.serving.pd.enabled:
        pre = int(given["--prefill-num-servers"][0])
        engines = max(b.placement.rollout_gpus // max(b.placement.engine_gpus, 1), 2)
        for path, value in (("serving.pd.prefill_engines", pre), ("serving.pd.decode_engines", max(engines - pre, 1))):
            b, _ = apply_change(b, path, value)
    # What the lab renders anyway with the same values is not "unknown"; the rest goes to extra flags.
    from lab.runtime_verdict import runtime_argv

    rendered = dict(_split(runtime_argv(b)))
    model_flags = {f for f, _ in _split(script.model_args)}
    extra: list[str] = []
    unknown: list[str] = []
    for flag, values in flags:
        if flag in consumed or flag in model_flags or _same(rendered.get(flag), values):
            continue
        unknown.append(flag)
        extra += [flag, *values]
    if extra:
        b, _ = apply_change(b, EXTRA_FLAGS_PATH, shlex.join(extra))
    return Imported(a, b, script.entry, unknown, script, {f: line_of(text, f) for f in unknown})
