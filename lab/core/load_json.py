"""Load JSON: turn a user's file into a choices dict, or say exactly what is wrong with it.

Accepted forms (detected, never guessed silently):
- our export, `{"schema": 2, "experiment": {...}, ...}` (provenance and findings are ignored:
  they are regenerated for the current page);
- an earlier export, `{"schema": 1, "choices": {...flat keys...}}`, migrated by `SCHEMA1_KEYS`;
- a bare choices object: nested sections (`{"placement": {"ownership": "colocated"}}`) or dotted
  keys (`{"placement.ownership": "colocated"}`), possibly partial.

The result is a nested choices dict for `lab.rules.edit.apply_choices`, which applies it as one
undoable step and validates every value; here we only check form, size and field names, so that a
bad file never touches the user's experiment or history.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Literal

from lab.core import safe_json
from lab.core.experiment import LEAF_FIELDS, SCHEMA_VERSION, set_path

MAX_BYTES = 256 * 1024  # an export is a few KiB; a larger file is not an experiment

# Schema 1: the flat layout of the first exports. One row per key: flat key -> field path.
SCHEMA1_KEYS: dict[str, str] = {
    "model": "model.recipe",
    "task": "task.kind",
    "image": "install.image",
    "reward": "task.rm_type",
    "samples_per_prompt": "task.n_samples_per_prompt",
    "num_rollout": "task.num_rollout",
    "rollout_batch_size": "task.rollout_batch_size",
    "generate_hook": "task.custom_generate_path",
    "reward_hook": "task.custom_reward_path",
    "ownership": "placement.ownership",
    "scheduling": "placement.scheduling",
    "nodes": "placement.nodes",
    "gpus_per_node": "placement.gpus_per_node",
    "train_gpus": "placement.train_gpus",
    "rollout_gpus": "placement.rollout_gpus",
    "engine_gpus": "placement.engine_gpus",
    "engine_addrs": "placement.external_engine_addrs",
    "partial_rollout": "rollout.partial_rollout",
    "max_response_len": "rollout.max_response_len",
    "training_precision": "precision.training",
    "rollout_precision": "precision.rollout",
    "kv_cache_dtype": "precision.kv_cache_dtype",
    "recurrent_state_dtype": "precision.recurrent_state_dtype",
    "tis": "corrections.tis",
    "icepop": "corrections.icepop",
    "r3": "corrections.r3",
    "sc": "corrections.sc",
    "deterministic": "corrections.deterministic",
    "pd": "serving.pd.enabled",
    "prefill_engines": "serving.pd.prefill_engines",
    "decode_engines": "serving.pd.decode_engines",
    "rdma_devices": "serving.pd.rdma_devices",
    "hicache": "serving.hicache.enabled",
    "hicache_gb": "serving.hicache.host_memory_gb",
    "eagle": "serving.eagle.enabled",
    "eagle_head": "serving.eagle.head",
    "eagle_steps": "serving.eagle.steps",
    "eagle_topk": "serving.eagle.topk",
    "eagle_draft_tokens": "serving.eagle.draft_tokens",
    "concurrency": "serving.concurrency",
    "tp": "resources.tp",
    "pp": "resources.pp",
    "cp": "resources.cp",
    "ep": "resources.ep",
    "cpu_adam": "resources.cpu_adam",
    "recompute": "resources.recompute",
    "max_tokens_per_gpu": "resources.max_tokens_per_gpu",
    "hf_checkpoint": "paths.hf_checkpoint",
    "ref_load": "paths.ref_load",
    "prompt_data": "paths.prompt_data",
    "save": "paths.save",
    "output_dir": "paths.output_dir",
}
# Schema 1 kept evaluation as one nested object or null.
SCHEMA1_EVAL_KEYS: dict[str, str] = {
    "name": "evaluation.name",
    "path": "evaluation.data_path",
    "interval": "evaluation.interval",
    "n_samples": "evaluation.n_samples",
}

Form = Literal["export", "schema1", "choices"]


class LoadError(ValueError):
    """A file that cannot be loaded; `field` names the offending key when there is one."""

    def __init__(self, message: str | None = None, field: str | None = None, key: str | None = None,
                 params: dict[str, Any] | None = None) -> None:
        if message is None:
            from lab.core.messages import render

            message = render(key or "", params)
        super().__init__(message)
        self.field = field
        self.key = key
        self.params = dict(params or {})


@dataclass(frozen=True)
class LoadedChoices:
    form: Form
    choices: dict[str, Any]  # nested, field paths from lab.core.experiment


def _unknown(path: str, where: str) -> LoadError:
    where_ref = {"key": f"term.load.{where}"}  # the form's name, worded in the page's language
    close = difflib.get_close_matches(path, sorted(LEAF_FIELDS), n=1)
    if close:
        return LoadError(field=path, key="error.load.unknown_field_hint", params={"where": where_ref, "path": repr(path), "close": repr(close[0])})
    return LoadError(field=path, key="error.load.unknown_field", params={"where": where_ref, "path": repr(path)})


def _flatten(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in obj.items():
        if not isinstance(key, str):
            raise LoadError(key="error.load.key_not_text", params={"key": repr(key)})
        path = f"{prefix}{key}"
        if isinstance(value, dict) and path not in LEAF_FIELDS:
            flat.update(_flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


def _nest(flat: dict[str, Any], where: str) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for path, value in flat.items():
        if path not in LEAF_FIELDS:
            raise _unknown(path, where)
        set_path(nested, path, value)
    return nested


def _migrate_schema1(doc: dict[str, Any]) -> dict[str, Any]:
    choices = doc.get("choices")
    if not isinstance(choices, dict):
        raise LoadError(field="choices", key="error.load.s1_choices")
    flat: dict[str, Any] = {}
    for key, value in choices.items():
        if key == "eval":
            if value is None:
                flat["evaluation.enabled"] = False
                continue
            if not isinstance(value, dict):
                raise LoadError(field="choices.eval", key="error.load.s1_eval")
            flat["evaluation.enabled"] = True
            for ekey, evalue in value.items():
                if ekey not in SCHEMA1_EVAL_KEYS:
                    raise LoadError(field=f"choices.eval.{ekey}", key="error.load.s1_eval_key",
                                    params={"key": repr(ekey), "known": ", ".join(SCHEMA1_EVAL_KEYS)})
                flat[SCHEMA1_EVAL_KEYS[ekey]] = evalue
            continue
        if key not in SCHEMA1_KEYS:
            close = difflib.get_close_matches(key, list(SCHEMA1_KEYS), n=1)
            if close:
                raise LoadError(field=f"choices.{key}", key="error.load.s1_key_hint", params={"key": repr(key), "close": repr(close[0])})
            raise LoadError(field=f"choices.{key}", key="error.load.s1_key", params={"key": repr(key)})
        flat[SCHEMA1_KEYS[key]] = value
    return _nest(flat, "schema1")


def parse_document(text: str | bytes) -> LoadedChoices:
    """Parse a Load JSON file. Raises LoadError naming what is wrong; never partial results."""
    size = len(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text)
    if size > MAX_BYTES:
        raise LoadError(key="error.load.too_large", params={"size": size, "max": MAX_BYTES})
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise LoadError(key="error.load.not_utf8", params={"byte": exc.start}) from exc
    try:
        doc = safe_json.loads(text)
    except safe_json.JSONInputError as exc:
        raise LoadError(str(exc), field=".".join(str(x) for x in exc.loc) or None, key=exc.key,
                        params=exc.params) from exc
    if not isinstance(doc, dict):
        raise LoadError(key="error.load.not_object", params={"type": type(doc).__name__})

    if "schema" in doc:
        schema = doc["schema"]
        if schema == 1:
            return LoadedChoices("schema1", _migrate_schema1(doc))
        if schema == SCHEMA_VERSION:
            exp = doc.get("experiment")
            if not isinstance(exp, dict):
                raise LoadError(field="experiment", key="error.load.experiment")
            return LoadedChoices("export", _nest(_flatten(exp), "export"))
        raise LoadError(field="schema", key="error.load.unknown_schema", params={"schema": repr(schema), "current": SCHEMA_VERSION})
    return LoadedChoices("choices", _nest(_flatten(doc), "choices"))
