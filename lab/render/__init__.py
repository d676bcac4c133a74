"""Render an experiment into the files a user downloads: experiment.sh, experiment.json and, for
external engines, serving-reference.sh.

`render_all(exp)` is pure and deterministic (no timestamps; same experiment and same sources →
same bytes), so the page's download, `POST /api/render` and `slime-lab render` are byte-identical.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lab import rules
from lab.experiment import SCHEMA_VERSION, Experiment
from lab.provenance import commit_label, provenance
from lab.recipes import get_recipe
from lab.render import context as ctx
from lab.render.env import template

EXPERIMENT_SH = "experiment.sh"
EXPERIMENT_JSON = "experiment.json"
SERVING_REFERENCE_SH = "serving-reference.sh"
EXECUTABLE = frozenset({EXPERIMENT_SH, SERVING_REFERENCE_SH})


def experiment_id(exp: Experiment) -> str:
    """Names the config directory .slime-lab.<id>/ next to the script (safe characters only)."""
    return f"{exp.model.recipe}.{exp.rollout.queue_run_id}"


def build_context(exp: Experiment, findings: list[Any], derived: Any, prov: dict[str, Any]) -> dict[str, Any]:
    recipe = get_recipe(exp.model.recipe)
    n_actor = getattr(derived, "n_actor", 0) or exp.placement.train_gpus
    with_yaml = ctx.needs_sglang_yaml(exp, recipe)
    groups = ctx.train_flag_groups(exp, recipe, n_actor)
    yaml_groups = ctx.sglang_groups(exp, recipe, n_actor) if with_yaml else []
    sglang_yaml = template("sglang.yaml.j2").render(
        groups=yaml_groups, yaml_value=ctx.yaml_value, recipe=recipe, commit=commit_label(prov)) if with_yaml else ""
    p = exp.paths
    fp8_dir = p.fp8_source or (f"{p.hf_checkpoint.rstrip('/')}-fp8-source" if recipe.conversion.fp8_source else "")
    serving_dir = p.serving_checkpoint or (
        f"{p.hf_checkpoint.rstrip('/')}-{exp.precision.rollout}" if exp.precision.rollout in ("fp8", "int4") else "")
    scalars = [
        ("HF_REPO", recipe.hf_repo or "", "Hugging Face repository of the weights"),
        ("HF_CHECKPOINT", p.hf_checkpoint, "BF16 Hugging Face checkpoint (tokenizer, config.json, weights)"),
        ("FP8_SOURCE", fp8_dir, "FP8-published source weights before BF16 conversion"),
        ("SERVING_CHECKPOINT", serving_dir, "quantized checkpoint the engines serve (FP8/INT4 rollout)"),
        ("REF_LOAD", p.ref_load, "reshardable torch_dist checkpoint (--ref-load), written by convert"),
        ("PROMPT_DATA", p.prompt_data, "training prompts (JSONL or parquet)"),
        ("EVAL_DATA", exp.evaluation.data_path, "held-out data set"),
        ("SAVE_DIR", p.save, "checkpoint directory (--save)"),
        ("LOAD_DIR", p.load or "", "checkpoint to resume from (--load); empty: a fresh run"),
        ("OUTPUT_DIR", p.output_dir, "run outputs: metrics.jsonl, logs"),
        ("CUSTOM_GENERATE_PATH", exp.task.custom_generate_path or "", "generate hook (module.function)"),
        ("CUSTOM_RM_PATH", exp.task.custom_reward_path or "", "reward hook (module.function)"),
        ("DRAFT_HEAD_PATH", exp.serving.eagle.draft_head_path or "", "separate EAGLE draft head"),
        ("QUEUE_STATE_DIR", exp.rollout.queue_state_dir or "", "straw queue state directory"),
    ]
    arrays = [
        ("EXTERNAL_ENGINE_ADDRS", list(exp.placement.external_engine_addrs), "external SGLang engines, host:port"),
        ("RDMA_DEVICES", list(exp.serving.pd.rdma_devices), "RDMA (InfiniBand) devices for Mooncake"),
    ]
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
        "sglang_dp_ep": ctx.sglang_parallel(recipe, exp.placement.engine_gpus),
        "eagle": ctx.eagle_settings(exp, recipe),
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


def render_all(exp: Experiment) -> dict[str, str]:
    """Every file of this experiment, name -> content."""
    recipe = get_recipe(exp.model.recipe)
    findings = rules.validate(exp)
    derived = rules.derive(exp)
    prov = provenance(recipe, exp.install.image)
    c = build_context(exp, findings, derived, prov)
    files = {
        EXPERIMENT_SH: template("experiment.sh.j2").render(**c),
        EXPERIMENT_JSON: experiment_json(exp, findings, derived, prov),
    }
    if c["external"]:
        files[SERVING_REFERENCE_SH] = template("serving-reference.sh.j2").render(**c)
    return files


def write_files(files: dict[str, str], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write rendered files into out_dir (created); shell scripts are made executable."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in sorted(files):
        path = out / name
        path.write_text(files[name], encoding="utf-8", newline="\n")
        if name in EXECUTABLE:
            path.chmod(0o755)
        written.append(path)
    return written
