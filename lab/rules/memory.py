"""A rough per-GPU memory estimate for the training phase and the rollout phase.

Not a memory-fit calculator: it shows where memory goes, from the model spec's parameter counts,
the layout and the image's GPU memory, and says what it leaves out. Colocated runs alternate the two
phases on the same GPUs (each side offloads while the other runs), so each phase has its own peak;
disaggregated runs put the phases on different GPUs.

Training (Megatron, per GPU of the worst pipeline stage): lab/rules/memory_model.py's `training_parts`
(weights, fp32 main gradients, Adam sharded by the distributed optimizer, activations per token and
layer, the log-prob path's logits, the cuBLAS workspace), with dense weights sharded over TP·PP and
expert weights over EP·PP. The lab does not know the prompt lengths, so every token of a
micro-batch counts as a logit row. bench/compare_memory.py checks it against measured H200 peaks.
Rollout follows the engine that runs:
- SGLang (per GPU of an engine): weights at the rollout precision over the engine's GPUs; the
KV cache is what `mem_fraction_static` × GPU memory leaves after the weights. Hybrid models split that
cache budget B into two pools at the state : KV ratio ρ (`precision.state_kv_ratio`, else SGLang's
default): recurrent state B·ρ/(1+ρ), attention KV B/(1+ρ) (docs/en/hybrid-cache.md). The GDN layer
pattern lives in config.json, which the lab does not read, so KV tokens count every layer as attention.
- the embedded engine (the tiny recipes): it reserves no fraction but allocates what it serves:
lab/rules/memory_model.py's `embedded_engine_parts` for the requests one engine holds at once (the
rollout's samples over the engines, at most `serving.concurrency`), each of `ASSUMED_PROMPT_TOKENS`
plus `rollout.max_response_len` tokens.

Item names and exclusions are catalogue keys (`memory.item.*`, `memory.exclusion.*`) with parameters;
`items_gib` and `exclusions` are their English renderings, and the API renders the keys in the page's
language (lab/core/messages.py).
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator

from lab.core.experiment import Experiment
from lab.core.images import get_image
from lab.core.messages import render
from lab.rules.derive import ETP, recipe_and_spec
from lab.rules.memory_model import GIB, TrainLayout, embedded_engine_parts, optimizer_bytes, training_parts
from slime.parallel_sizes import expert_parallel_size

# The lab does not know the dataset's prompt lengths; a math prompt with its chat template is
# about this long. Only the embedded engine's KV slots depend on it.
ASSUMED_PROMPT_TOKENS = 1024
EXCLUSION_IDS = [f"memory.exclusion.{k}" for k in (
    "cuda_context", "nccl", "fragmentation", "draft", "recurrent", "reference", "sglang", "moe")]
EXCLUSIONS = [render(k) for k in EXCLUSION_IDS]


class MemoryItem(BaseModel):
    key: str = Field(description="Catalogue key of the item's name (memory.item.*).")
    params: dict[str, Any] = Field(default_factory=dict, description="str.format parameters of the name.")
    gib: float


def _item(key: str, gib: float, **params: Any) -> MemoryItem:
    return MemoryItem(key=f"memory.item.{key}", params=params, gib=gib)


class Phase(BaseModel):
    items: list[MemoryItem] = Field(description="What the phase holds per GPU: keyed names and GiB.")
    items_gib: dict[str, float] = Field(default_factory=dict, description="The same items by English name, GiB.")
    total_gib: float
    fits: bool | None = Field(None, description="total ≤ GPU memory; null when the image has no GPU.")

    @model_validator(mode="after")
    def _english_names(self) -> Phase:
        if not self.items_gib:
            self.items_gib = {render(i.key, i.params): i.gib for i in self.items}
        return self


class MemoryEstimate(BaseModel):
    gpu_memory_gib: float = Field(description="GPU memory of the image's target GPU.")
    colocated: bool = Field(description="Both phases run on the same GPUs, one after the other (separate peaks).")
    training: Phase
    rollout: Phase
    peak_gib: float = Field(description="Colocated: the larger phase; otherwise the training GPUs' total.")
    host_optimizer_gib_per_gpu: float = Field(0.0, description="CPU Adam: optimizer state in host memory per training GPU.")
    kv_tokens_per_engine: int = Field(0, description="KV-cache capacity of one engine, tokens (0 when none fits).")
    kv_pool_gib: float = Field(0.0, description="Attention KV pool per rollout GPU, GiB.")
    state_pool_gib: float = Field(0.0, description="Hybrid models: recurrent-state pool per rollout GPU, GiB (0 otherwise).")
    state_kv_ratio: float | None = Field(None, description="Hybrid models: the state : KV ratio the pools were split at.")
    total_params_b: float
    active_params_b: float
    exclusion_ids: list[str] = Field(default_factory=lambda: list(EXCLUSION_IDS), description="Not counted: catalogue keys.")
    exclusions: list[str] = Field(default_factory=lambda: list(EXCLUSIONS), description="Not counted, in English.")


def _g(x: float) -> float:
    return round(x / GIB, 2)


def estimate_memory(exp: Experiment) -> MemoryEstimate:
    recipe, spec = recipe_and_spec(exp)
    if spec is None:
        raise ValueError(f"no model spec for {exp.model.recipe!r}")
    image = get_image(exp.install.image)
    gpu_gib = image.gpu_memory_gib if image else 80.0
    r, p = exp.resources, exp.placement
    n = max(p.train_gpus, 1)

    # The distributed optimizer shards over the data-parallel group WITH context parallelism
    # (megatron-core's intra_dp_cp group): CP ranks hold whole copies of the weights, so they share
    # the optimizer state like DP ranks do.
    dp = max(n // (r.tp * r.pp), 1)
    edp = max(n // expert_parallel_size(ETP, r.ep, r.pp), 1)
    layout = TrainLayout(tokens=r.max_tokens_per_gpu, tp=r.tp, pp=r.pp, ep=ETP * r.ep, dp=dp, edp=edp,
                         recompute=r.recompute, cpu_adam=r.cpu_adam)
    parts = training_parts(spec, layout)
    train_items = [_item(k, _g(v)) for k, v in parts.items()]
    train_total = round(sum(i.gib for i in train_items), 2)
    optimizer = optimizer_bytes(spec, layout)

    e = max(p.engine_gpus, 1)
    ratio = None
    state = kv = 0.0
    kv_tokens = 0
    if recipe is not None and recipe.backends.rollout == "embedded":
        engines = max(p.rollout_gpus // e, 1)
        rows = min(exp.serving.concurrency, -(-exp.task.rollout_batch_size * exp.task.n_samples_per_prompt // engines))
        context = ASSUMED_PROMPT_TOKENS + exp.rollout.max_response_len
        eparts = embedded_engine_parts(spec, rows, context)
        kv = eparts["kv_cache"]
        kv_tokens = rows * context
        roll_items = [_item("rollout_weights", _g(eparts["weights"]), precision="BF16", gpus=1),
                      _item("kv_slots", _g(kv), rows=rows, context=context),
                      _item("engine_prefill", _g(eparts["prefill"])),
                      _item("engine_logits", _g(eparts["logits"])),
                      _item("workspace", _g(eparts["workspace"]))]
        roll_total = round(sum(i.gib for i in roll_items), 2)
        roll_fits = roll_total <= gpu_gib
    else:
        bytes_per_param = {"bf16": 2.0, "fp8": 1.0, "int4": 0.5}[exp.precision.rollout]
        w_roll = spec.total_params * bytes_per_param / e
        claimed = exp.serving.mem_fraction_static * gpu_gib * GIB
        budget = max(claimed - w_roll, 0.0)
        if spec.hybrid:
            from slime.rollout.engines.sglang_flags import DEFAULTS

            ratio = exp.precision.state_kv_ratio or DEFAULTS["mamba_full_memory_ratio"]
        state = budget * ratio / (1 + ratio) if ratio else 0.0
        kv = budget - state
        kv_elem = 1 if exp.precision.kv_cache_dtype == "fp8_e4m3" else 2
        if spec.mla:
            per_token: float = spec.layers * (spec.kv_lora_rank + spec.qk_pos_emb_head_dim) * kv_elem  # replicated per GPU
            kv_tokens = int(kv // per_token) if per_token else 0
        else:
            shards = min(e, spec.kv_groups)
            per_token = spec.layers * 2 * spec.kv_groups * spec.kv_channels * kv_elem / shards
            kv_tokens = int(kv // per_token) if per_token else 0
        roll_items = [_item("rollout_weights", _g(w_roll), precision=exp.precision.rollout.upper(), gpus=e)]
        if ratio:
            state_dtype = exp.precision.recurrent_state_dtype or "float32"
            roll_items.append(_item("kv_pool", _g(kv), ratio=f"{ratio:g}"))
            roll_items.append(_item("state_pool", _g(state), dtype=state_dtype, ratio=f"{ratio:g}"))
        else:
            roll_items.append(_item("kv_cache", _g(kv)))
        roll_total = round(max(_g(claimed), _g(w_roll)), 2)
        roll_fits = w_roll <= claimed

    has_gpu = gpu_gib > 0
    colocated = p.ownership == "colocated"
    return MemoryEstimate(
        gpu_memory_gib=gpu_gib,
        colocated=colocated,
        training=Phase(items=train_items, total_gib=train_total, fits=(train_total <= gpu_gib) if has_gpu else None),
        rollout=Phase(items=roll_items, total_gib=roll_total, fits=roll_fits if has_gpu else None),
        peak_gib=max(train_total, roll_total) if colocated else train_total,
        host_optimizer_gib_per_gpu=_g(optimizer) if r.cpu_adam else 0.0,
        kv_tokens_per_engine=kv_tokens,
        kv_pool_gib=_g(kv),
        state_pool_gib=_g(state),
        state_kv_ratio=ratio,
        total_params_b=round(spec.total_params / 1e9, 2),
        active_params_b=round(spec.active_params / 1e9, 2),
    )
