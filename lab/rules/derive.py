"""Derived numbers of an experiment: what the page and the shell show (docs/en/lab.md#findings-and-rule-ids).

Pure and fast: reads the experiment, its recipe and its ModelSpec (both cached). Conventions:
- N_actor = `placement.train_gpus` (the training pool); DP = N_actor / (TP·PP·CP);
  expert-DP = N_actor / (ETP·EP·PP) with ETP = 1 (the lab always passes
  --expert-tensor-parallel-size 1, as the reference MoE recipes do).
- The declared cluster is `placement.nodes` × `placement.gpus_per_node`: the Ray nodes you start
  (head + workers), each with `ray start --num-gpus gpus_per_node`.
- Total GPUs requested: colocated max(train, rollout); disaggregated train + rollout; external
  engines N_actor only (their GPUs are outside the trainer's Ray capacity).
"""
from __future__ import annotations

import math

from pydantic import BaseModel, Field

from lab.core.experiment import Experiment
from lab.core.model_spec import ModelSpec, ModelSpecError, kind_of, spec_of
from lab.core.recipes import Recipe, RecipeError, get_recipe
from slime.parallel_sizes import data_parallel_size, expert_data_parallel_size

ETP = 1


class Derived(BaseModel):
    n_actor: int = Field(0, description="Training GPUs (N_actor).")
    dp: int = Field(0, description="Data-parallel size N_actor / (TP·PP·CP); 0 when it does not divide.")
    expert_dp: int | None = Field(
        None, description="Expert data-parallel size N_actor / (EP·PP) (ETP 1); 0 when it does not divide; null for models without experts.")
    engines: int = Field(0, description="Rollout engines (external: one per address).")
    idle_rollout_gpus: int = Field(0, description="Rollout GPUs left over by whole engines.")
    prefill_gpus: int = Field(0, description="GPUs of the PD prefill group (0 without PD).")
    decode_gpus: int = Field(0, description="GPUs of the PD decode group (0 without PD).")
    total_gpus: int = Field(0, description="GPUs the job requests from Ray.")
    declared_gpus: int = Field(0, description="nodes × gpus_per_node: the capacity you declare.")
    ray_gpus_per_node: int = Field(0, description="The value for `ray start --num-gpus` on every node.")
    ray_nodes: int = Field(1, description="Ray nodes to start: one head + (ray_nodes − 1) workers.")
    nodes_needed: int = Field(1, description="Nodes the requested GPUs need at gpus_per_node each.")
    samples_per_rollout: int = Field(0, description="S = rollout_batch_size × n_samples_per_prompt.")
    steps_per_rollout: int = Field(1, description="Optimizer steps per rollout.")
    global_batch_size: int = Field(0, description="Samples per optimizer step, ⌊S / steps⌋.")
    samples_dropped: int = Field(0, description="Samples dropped per rollout when steps do not divide S.")
    expected_staleness: float = Field(0.0, description="Weight versions between generation and training: 1 under train_async.py (one-step lookahead), 0 when synchronous.")
    conversion_nodes: int = Field(1, description="Nodes of the HF → torch_dist conversion job.")
    conversion_gpus_per_node: int = Field(8, description="GPUs per node of the conversion job.")
    fp8_source: bool = Field(False, description="The published weights are FP8 and are converted to BF16 first.")
    model_kind: str = Field("", description="dense, moe or hybrid.")
    architecture: str = Field("", description="One line from the model spec: layers, attention, experts, params.")
    total_params_b: float = Field(0.0, description="Total parameters from the model spec, billions.")
    active_params_b: float = Field(0.0, description="Active (non-embedding) parameters per token, billions.")


def recipe_and_spec(exp: Experiment) -> tuple[Recipe | None, ModelSpec | None]:
    try:
        recipe = get_recipe(exp.model.recipe)
    except RecipeError:
        return None, None
    try:
        return recipe, spec_of(exp)
    except ModelSpecError:
        return recipe, None


def total_requested(exp: Experiment) -> int:
    p = exp.placement
    if p.ownership == "colocated":
        return max(p.train_gpus, p.rollout_gpus)
    if p.ownership == "external":
        return p.train_gpus
    return p.train_gpus + p.rollout_gpus


def derive(exp: Experiment) -> Derived:
    p, r, t = exp.placement, exp.resources, exp.task
    recipe, spec = recipe_and_spec(exp)
    n = p.train_gpus
    dp = data_parallel_size(n, r.tp, r.pp, r.cp)
    expert_dp: int | None = expert_data_parallel_size(n, ETP, r.ep, r.pp)
    if recipe is not None and kind_of(exp, recipe) != "moe":
        expert_dp = None  # no experts: the number would only confuse

    prefill = decode = 0
    if p.ownership == "external":
        engines, idle = len(p.external_engine_addrs), 0
    elif p.engine_gpus > 0:
        engines, idle = divmod(p.rollout_gpus, p.engine_gpus)
        if exp.serving.pd.enabled:
            prefill = exp.serving.pd.prefill_engines * p.engine_gpus
            decode = exp.serving.pd.decode_engines * p.engine_gpus
    else:
        engines, idle = 0, 0

    total = total_requested(exp)
    declared = p.nodes * p.gpus_per_node
    s = t.rollout_batch_size * t.n_samples_per_prompt
    steps = t.num_steps_per_rollout
    # train_async.py is a one-step lookahead: rollout N+1 is generated while rollout N trains, by
    # the weights from before step N's update, so every trained sample is exactly one version old.
    staleness = 1.0 if exp.placement.scheduling == "async" else 0.0

    d = Derived(
        n_actor=n,
        dp=dp,
        expert_dp=expert_dp,
        engines=engines,
        idle_rollout_gpus=idle,
        prefill_gpus=prefill,
        decode_gpus=decode,
        total_gpus=total,
        declared_gpus=declared,
        ray_gpus_per_node=p.gpus_per_node,
        ray_nodes=p.nodes,
        nodes_needed=max(1, math.ceil(total / p.gpus_per_node)) if p.gpus_per_node else 1,
        samples_per_rollout=s,
        steps_per_rollout=steps,
        global_batch_size=s // steps,
        samples_dropped=s % steps,
        expected_staleness=staleness,
    )
    if recipe is not None:
        d.conversion_nodes = recipe.conversion.nodes
        d.conversion_gpus_per_node = recipe.conversion.gpus_per_node
        d.fp8_source = recipe.conversion.fp8_source
        d.model_kind = kind_of(exp, recipe)
    if spec is not None:
        d.architecture = spec.summary()
        d.total_params_b = round(spec.total_params / 1e9, 2)
        d.active_params_b = round(spec.active_params / 1e9, 2)
    return d
