"""The lab's view of a `scripts/models/*.sh` model spec.

The spec files are the one home of model dimensions, and `slime.model_spec` (torch-free) is the one
reader: it parses `MODEL_ARGS` without running bash into a typed `ModelSpec`, counts parameters
(DSA indexers only on the layers that compute the index, Gated DeltaNet layers from their own
dimensions; the MTP draft layer excluded) and compares a spec with a checkpoint's config.json field
by field. The lab re-exports those names and adds only the recipe lookup.
"""
from __future__ import annotations

from typing import Any

from slime.model_spec import (  # noqa: F401
    MODELS_DIR,
    REPO_ROOT,
    Mismatch,
    ModelSpec,
    ModelSpecError,
    compare_lines,
    compare_with_config,
    load_model_spec,
    spec_from_text,
)


def spec_for_recipe(recipe_name: str) -> ModelSpec:
    from lab.recipes import get_recipe

    return load_model_spec(get_recipe(recipe_name).model_spec)


def compare_with_hf_config(spec: ModelSpec, config_json: dict[str, Any]) -> list[str]:
    """Fields where a checkpoint's config.json and the model spec disagree, one sentence each."""
    return compare_lines(spec, config_json)
