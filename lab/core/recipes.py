"""Load the recipes in `recipes/*.yaml`: one file per model, the only home of a recipe fact.

The lab, the docs and the renderers read recipes through this module; nothing else parses the
YAML. Model dimensions are NOT here: they live in the `scripts/models/*.sh` spec a recipe names,
and `lab/core/model_spec.py` reads them from there.
"""
from __future__ import annotations

from functools import cached_property, lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from lab.core.runtime_choices import reward_types

REPO_ROOT = Path(__file__).resolve().parents[2]
RECIPES_DIR = REPO_ROOT / "recipes"

Support = Literal["maintained", "beta", "experimental", "unsupported"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TrainingShape(_Strict):
    nodes: int = Field(description="Training nodes in the reference recipe.")
    gpus_per_node: int = Field(description="GPUs per node.")
    train_gpus: int | None = Field(
        None, description="GPUs of the training pool when a single node is split (disaggregated on one node).")
    rollout_gpus: int | None = Field(
        None, description="GPUs of the rollout pool when a single node is split.")


class Parallelism(_Strict):
    tp: int = Field(1, description="Tensor parallel size.")
    pp: int = Field(1, description="Pipeline parallel size.")
    cp: int = Field(1, description="Context parallel size.")
    ep: int = Field(1, description="Expert parallel size.")
    pp_first_stage_layers: int | None = Field(None, description="Layers on the first pipeline stage (uneven layout).")
    pp_last_stage_layers: int | None = Field(None, description="Layers on the last pipeline stage (uneven layout).")


class Eagle(_Strict):
    enabled: bool = Field(False, description="On by default? Recipes start from ordinary serving (the baseline to "
                                             "measure) and offer these draft settings as the next step.")
    head: Literal["mtp", "separate"] = Field("mtp", description="Draft head: the checkpoint's MTP layer or a separate EAGLE head.")
    steps: int = Field(3, description="Draft depth: speculative steps per verification.")
    topk: int = Field(1, description="Draft top-k.")
    draft_tokens: int = Field(4, description="Draft tokens per step.")
    draft_attention_backend: str | None = Field(None, description="Attention backend for the draft model (sparse-attention models).")


class Rollout(_Strict):
    engine_gpus: int = Field(description="GPUs per rollout engine (--rollout-num-gpus-per-engine).")
    dp_attention: int | None = Field(None, description="SGLang DP-attention size inside an engine.")
    ep: int | None = Field(None, description="SGLang expert-parallel size inside an engine.")
    server_groups: bool = Field(False, description="The recipe describes its engines as server groups in sglang.yaml.")
    eagle: Eagle | None = Field(None, description="Speculative decoding settings for the model (its draft head); on only with enabled.")
    tis: bool = Field(False, description="The recipe turns TIS on by default.")
    mem_fraction_static: float = Field(0.7, description="--sglang-mem-fraction-static of the recipe.")


class Conversion(_Strict):
    nodes: int = Field(1, description="Nodes of the HF → torch_dist conversion job.")
    gpus_per_node: int = Field(8, description="GPUs per node of the conversion job.")
    fp8_source: bool = Field(False, description="Weights are published in FP8 and are converted to BF16 first.")


class PrecisionSupport(_Strict):
    bf16: Support = "maintained"
    fp8_rollout: Support = "maintained"
    int4_rollout: Support = "beta"
    fp8_training: Support = "experimental"


class EvalDefaults(_Strict):
    name: str = Field(description="Eval data set name, logged as eval/<name>.")
    interval: int = Field(description="Rollouts between evaluations.")
    n_samples: int = Field(1, description="Samples per eval prompt.")


class Backends(_Strict):
    train: Literal["megatron", "embedded"] = "megatron"
    rollout: Literal["sglang", "embedded"] = "sglang"


class RecipeText(_Strict):
    """A recipe's user-facing texts in one more language (the English ones are `summary` and `notes`)."""

    summary: str = Field(description="The summary, translated.")
    notes: list[str] = Field(default_factory=list, description="The notes, translated, in the same order.")


class Recipe(_Strict):
    name: str = Field(description="The name every command takes (slime-lab render --model NAME).")
    display_name: str = Field(description="The model's name as users know it.")
    hf_repo: str | None = Field(description="Hugging Face repository id; none for the tiny local recipe.")
    family: str = Field(description="Architecture family (glm4, glm4_moe, glm5_dsa, qwen3_5, deepseek_v3, qwen2).")
    model_spec: str = Field(description="The scripts/models/*.sh spec the recipe sources (MODEL_ARGS).")
    summary: str = Field("", description="One line a user reads in the model picker.")
    training: TrainingShape
    placement: Literal["colocated", "disaggregated"]
    parallel: Parallelism
    rollout: Rollout
    cpu_adam: bool = False
    recompute: Literal["none", "selective", "full"] = "full"
    max_tokens_per_gpu: int
    rollout_batch_size: int
    n_samples_per_prompt: int = 8
    max_response_len: int
    rm_type: Literal[reward_types()] | None = Field(  # type: ignore[valid-type]
        None, description="Built-in reward the recipe needs (copied into task.rm_type); null keeps the experiment's choice.")
    conversion: Conversion
    extra_dependencies: list[str] = Field(default_factory=list)
    precision: PrecisionSupport = PrecisionSupport()
    backends: Backends = Backends()
    num_rollout: int = Field(3, description="Rollouts of the generated run: 3 is a correctness run, not a capability claim.")
    save_interval: int = Field(20, description="Rollouts between checkpoints.")
    evaluation: EvalDefaults | None = Field(
        None, description="Held-out evaluation the recipe turns on by default (its data set comes with prepare).")
    default_paths: dict[str, str] = Field(
        default_factory=dict,
        description="Default values of private path fields (field path -> value); relative paths are relative to "
                    "the slime checkout. A path the user has edited is never replaced.")
    train_args: list[str] = Field(
        default_factory=list, description="Extra runtime flags this recipe always passes (the tiny CPU recipe's tuned flags).")
    notes: list[str] = Field(default_factory=list, description="What the user should know (architecture reuse, validation scope).")
    translations: dict[Literal["zh"], RecipeText] = Field(
        default_factory=dict, description="summary and notes in other languages, by language code.")

    def texts(self, lang: str) -> tuple[str, list[str]]:
        """(summary, notes) in `lang`, English where no translation exists."""
        t = self.translations.get(lang)  # type: ignore[call-overload]
        return (t.summary, list(t.notes)) if t else (self.summary, list(self.notes))

    @property
    def path(self) -> Path:
        return RECIPES_DIR / f"{self.name}.yaml"

    @cached_property
    def kind(self) -> Literal["dense", "moe", "hybrid"]:
        """Dense, mixture-of-experts or hybrid linear/full attention: what the model spec says."""
        from slime.model_spec import load_model_spec

        return load_model_spec(self.model_spec).kind


class RecipeError(ValueError):
    """A recipe file is missing or malformed; the message names the file and the field."""


def load_recipe_file(path: Path) -> Recipe:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise RecipeError(f"recipe file not found: {path}") from exc
    except yaml.YAMLError as exc:
        raise RecipeError(f"{path}: not valid YAML: {exc}") from exc
    try:
        recipe = Recipe.model_validate(data)
    except Exception as exc:  # pydantic's message already names the field
        raise RecipeError(f"{path}: {exc}") from exc
    from lab.core.experiment import PRIVATE_FIELDS  # late: experiment.py must not depend on recipes

    not_private = sorted(set(recipe.default_paths) - PRIVATE_FIELDS)
    if not_private:
        raise RecipeError(f"{path}: default_paths may only name private path fields, not {not_private}")
    if recipe.name != path.stem:
        raise RecipeError(f"{path}: name {recipe.name!r} must equal the file name {path.stem!r}")
    return recipe


@lru_cache(maxsize=1)
def all_recipes() -> dict[str, Recipe]:
    """Every recipe, keyed by name, in a stable order (the order of `recipes/ORDER`)."""
    order_file = RECIPES_DIR / "ORDER"
    names = [n.strip() for n in order_file.read_text().splitlines() if n.strip() and not n.startswith("#")]
    found = {p.stem for p in RECIPES_DIR.glob("*.yaml")}
    missing = [n for n in names if n not in found]
    if missing:
        raise RecipeError(f"recipes/ORDER names recipes without a file: {missing}")
    unlisted = sorted(found - set(names))
    return {n: load_recipe_file(RECIPES_DIR / f"{n}.yaml") for n in names + unlisted}


def get_recipe(name: str) -> Recipe:
    recipes = all_recipes()
    if name not in recipes:
        raise RecipeError(f"unknown model {name!r}; known models: {', '.join(recipes)}")
    return recipes[name]
