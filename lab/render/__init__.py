"""Render an experiment into the files a user downloads: experiment.sh, experiment.json, rayjob.yaml
(the same run as a KubeRay RayJob) and, for external engines, serving-reference.sh.

`render_all(exp, findings, derived)` is pure and deterministic (no timestamps; same experiment and same sources →
same bytes), so the page's download, `POST /api/render` and `slime-lab render` are byte-identical.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lab.core import train_flags as flags
from lab.core.experiment import SCHEMA_VERSION, Experiment
from lab.core.provenance import commit_label, provenance
from lab.core.recipes import get_recipe
from lab.render import context as ctx
from lab.render.env import template
from lab.render.rayjob import rayjob_yaml

EXPERIMENT_SH = "experiment.sh"
EXPERIMENT_JSON = "experiment.json"
SERVING_REFERENCE_SH = "serving-reference.sh"
RAYJOB_YAML = "rayjob.yaml"
EXECUTABLE = frozenset({EXPERIMENT_SH, SERVING_REFERENCE_SH})


def experiment_id(exp: Experiment) -> str:
    """Names the config directory .slime-lab.<id>/ next to the script (safe characters only)."""
    return f"{exp.model.recipe}.{exp.rollout.queue_run_id}"


def build_context(exp: Experiment, findings: list[Any], derived: Any, prov: dict[str, Any]) -> dict[str, Any]:
    recipe = get_recipe(exp.model.recipe)
    n_actor = getattr(derived, "n_actor", 0) or exp.placement.train_gpus
    with_yaml = flags.needs_sglang_yaml(exp, recipe)
    groups = flags.train_flag_groups(exp, recipe, n_actor)
    yaml_groups = flags.sglang_groups(exp, recipe, n_actor) if with_yaml else []
    sglang_yaml = template("sglang.yaml.j2").render(
        groups=yaml_groups, yaml_value=ctx.yaml_value, recipe=recipe, commit=commit_label(prov)) if with_yaml else ""
    scalars, arrays = flags.shell_variables(exp, recipe)
    fp8_source = recipe.conversion.fp8_source
    serving_format = exp.precision.rollout if exp.precision.rollout in ("fp8", "int4") else None
    errors = [f for f in findings if f.level == "error"]
    conv_nodes = recipe.conversion.nodes
    conv_gpus = recipe.conversion.gpus_per_node
    return {
        "exp": exp,
        "recipe": recipe,
        "derived": derived,
        "findings": findings,
        "errors": errors,
        "prov": prov,
        "commit": commit_label(prov),
        "experiment_id": experiment_id(exp),
        "scalars": scalars,
        "arrays": arrays,
        "groups": groups,
        "entry": "train_async.py" if exp.placement.scheduling == "async" else "train.py",
        "runtime_env_fixed": ctx.runtime_env_fixed(exp, recipe),
        "sglang_yaml": sglang_yaml,
        "with_yaml": with_yaml,
        "tiny": recipe.backends.train == "embedded",
        "local_model": recipe.hf_repo is None,  # built by tools/tiny/prepare.py, no download
        # a local model of a seeded family is its tiny twin (prepare.py --family); qwen2 is prepare.py's own model
        "twin_family": recipe.family if recipe.hf_repo is None and recipe.family != "qwen2" else None,
        "megatron": recipe.backends.train == "megatron",
        "fp8_source": fp8_source,
        "serving_format": serving_format,
        "known_datasets": ctx.KNOWN_DATASETS,
        "conv_nodes": conv_nodes,
        "conv_gpus": conv_gpus,
        "external": exp.placement.ownership == "external",
        "default_dashboard": ctx.DEFAULT_DASHBOARD,
        "ray_gpus": getattr(derived, "ray_gpus_per_node", exp.placement.gpus_per_node),
        "ray_nodes": max(getattr(derived, "ray_nodes", exp.placement.nodes), 1),
        "sglang_dp_ep": flags.sglang_parallel(recipe, exp.placement.engine_gpus),
        "eagle": flags.eagle_settings(exp, recipe),
        "custom_model_lines": ctx.custom_model_lines(exp),
    }


_encode_str = json.encoder.encode_basestring  # the C implementation when available


def pretty_json(obj: Any, level: int = 0) -> str:
    """Exactly json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False), several times faster
    (json's C encoder is only used without indent; this walks the small document directly)."""
    if isinstance(obj, str):
        return _encode_str(obj)
    if obj is None:
        return "null"
    if obj is True:
        return "true"
    if obj is False:
        return "false"
    if isinstance(obj, int):
        return int.__repr__(obj)
    if isinstance(obj, float):
        return json.dumps(obj)
    pad = "\n" + "  " * (level + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{_encode_str(k)}: {pretty_json(obj[k], level + 1)}" for k in sorted(obj)]
        return "{" + pad + ("," + pad).join(items) + "\n" + "  " * level + "}"
    if isinstance(obj, (list, tuple)):
        if not obj:
            return "[]"
        return "[" + pad + ("," + pad).join(pretty_json(v, level + 1) for v in obj) + "\n" + "  " * level + "]"
    raise TypeError(f"not JSON-serializable: {type(obj).__name__}")


def experiment_json(exp: Experiment, findings: list[Any], derived: Any, prov: dict[str, Any]) -> str:
    doc = {
        "schema": SCHEMA_VERSION,
        "experiment": exp.model_dump(mode="json"),
        "findings": [f.model_dump(mode="json") for f in findings],
        "derived": derived.model_dump(mode="json") if hasattr(derived, "model_dump") else dict(derived),
        "provenance": prov,
    }
    return pretty_json(doc) + "\n"


def render_all(exp: Experiment, findings: list[Any], derived: Any,
               prov: dict[str, Any] | None = None) -> dict[str, str]:
    """Every file of this experiment, name -> content. `findings` and `derived` are
    `lab.rules.validate(exp)` and `lab.rules.derive(exp)`: rendering never validates,
    it prints what the rules found. `prov`, when given, is the provenance record of exp's recipe and
    image (a caller that has it already passes it, so it is not computed twice)."""
    recipe = get_recipe(exp.model.recipe)
    prov = provenance(recipe, exp.install.image) if prov is None else prov
    c = build_context(exp, findings, derived, prov)
    files = {
        EXPERIMENT_SH: template("experiment.sh.j2").render(**c),
        EXPERIMENT_JSON: experiment_json(exp, findings, derived, prov),
        RAYJOB_YAML: rayjob_yaml(c),
    }
    if c["external"]:
        files[SERVING_REFERENCE_SH] = template("serving-reference.sh.j2").render(**c)
    return files


def write_files(files: dict[str, str], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write rendered files into out_dir (created); shell scripts are made executable.

    All or nothing: every file is first written to a temporary file beside its target, and only
    when all of them are complete are they renamed into place (a rename is atomic), so a failure
    half-way never leaves a partial or 0-byte file, nor a mix of old and new files."""
    import tempfile

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    staged: list[tuple[Path, Path]] = []
    try:
        for name in sorted(files):
            data = files[name].encode("utf-8")  # fails before any file is touched on unencodable text
            fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=out)
            staged.append((Path(tmp_name), out / name))
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp_name, 0o755 if name in EXECUTABLE else 0o644)
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, path in staged:
        os.replace(tmp, path)
    return [path for _, path in staged]
