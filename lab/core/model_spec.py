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


def custom_spec(spec_args: str) -> ModelSpec:
    """A custom model's spec from its MODEL_ARGS words (model.spec_args), read by the runtime's reader."""
    import shlex

    from slime.model_spec import flags_from_argv, spec_from_flags

    try:
        words = shlex.split(spec_args)
    except ValueError as exc:
        raise ModelSpecError(f"model.spec_args: {exc}") from None
    return spec_from_flags(flags_from_argv(words), name="custom")


def spec_of(exp: Any) -> ModelSpec:
    """The experiment's model: its custom spec (an imported script's) or its recipe's."""
    if exp.model.spec_args:
        return custom_spec(exp.model.spec_args)
    return spec_for_recipe(exp.model.recipe)


def kind_of(data: Any, recipe: Any) -> str:
    """dense / moe / hybrid of an experiment (model dump or Experiment) on `recipe`."""
    spec_args = data["model"].get("spec_args") if isinstance(data, dict) else data.model.spec_args
    if spec_args:
        try:
            return custom_spec(spec_args).kind
        except ModelSpecError:
            return recipe.kind
    return recipe.kind


def spec_for_recipe(recipe_name: str) -> ModelSpec:
    from lab.core.recipes import get_recipe

    return load_model_spec(get_recipe(recipe_name).model_spec)


def compare_with_hf_config(spec: ModelSpec, config_json: dict[str, Any]) -> list[str]:
    """Fields where a checkpoint's config.json and the model spec disagree, one sentence each."""
    return compare_lines(spec, config_json)
