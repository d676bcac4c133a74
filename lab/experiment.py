"""The experiment: every choice the Quick Start names, as one pydantic model.

The pydantic field path (`placement.ownership`, `serving.pd.rdma_devices`, ...) is the one id of
a choice everywhere: the form control, the share link, the undo history, both translations and
the A/B diff. Private fields (machine paths, engine addresses, RDMA device names, hook paths) are
marked here and only here, with `private()`; the JSON schema shows them as `"x-private": true`
and `lab/share.py` strips them by reading this marking.

Values a recipe sets (parallelism, engine size, node counts, batch sizes) are copied into the
experiment when a model is chosen (`lab/rules.py` does that as one change), so that a user can
edit them and the edit is visible in history and in A/B.
"""
from __future__ import annotations

from typing import Any, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from lab.text_rule import TextRuleError, check_text
from slime.limits import MAX_GPUS, MAX_GPUS_PER_ENGINE, MAX_GPUS_PER_NODE, MAX_NODES  # the runtime's own limits

SCHEMA_VERSION = 2  # schema 1 is the earlier flat layout; lab/migrate.py upgrades it.

_PRIVATE_KEY = "x-private"


def private(default: Any = None, *, description: str, **kwargs: Any) -> Any:
    """A field that never leaves the user's machine in a share link."""
    extra = {_PRIVATE_KEY: True}
    if "default_factory" in kwargs:
        return Field(description=description, json_schema_extra=extra, **kwargs)
    return Field(default, description=description, json_schema_extra=extra, **kwargs)


class _Section(BaseModel):
    # Unknown keys are an error, not silently dropped: a typo in a loaded file must be named.
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="after")
    @classmethod
    def _text_rule(cls, v: Any) -> Any:
        # One rule for characters (lab/text_rule.py), so no entry point can skip it.
        try:
            return check_text(v)
        except TextRuleError as exc:
            raise PydanticCustomError("text_rule", str(exc).replace("{", "{{").replace("}", "}}"),
                                     {"key": exc.key, "params": exc.params}) from None


# --- 1. Task and model -------------------------------------------------------------------------

class Task(_Section):
    kind: Literal["math", "custom"] = Field(
        "math", description="Verifiable math (JSONL prompt/label, deepscaler reward) or my own agent / reward hooks.")
    input_key: str = Field("prompt", description="JSONL key of the prompt (--input-key).")
    label_key: str = Field("label", description="JSONL key of the reference answer (--label-key).")
    apply_chat_template: bool = Field(True, description="Wrap each prompt in the tokenizer's chat template.")
    rm_type: Literal["deepscaler", "math", "dapo", "f1"] = Field(
        "deepscaler", description="Built-in reward (--rm-type); deepscaler grades the text after </think>.")
    n_samples_per_prompt: int = Field(8, ge=1, le=256, description="Responses sampled per prompt (GRPO group size).")
    advantage_estimator: Literal["grpo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"] = Field(
        "grpo", description="Advantage estimator (--advantage-estimator).")
    num_rollout: int = Field(3, ge=1, le=1_000_000, description="Rollout rounds to run (--num-rollout); 3 is a correctness run.")
    rollout_batch_size: int = Field(32, ge=1, le=65536, description="Prompts per rollout (--rollout-batch-size).")
    num_steps_per_rollout: int = Field(1, ge=1, le=1024, description="Optimizer steps per rollout (--num-steps-per-rollout).")
    custom_generate_path: str | None = private(
        description="Importable generate function for my agent (--custom-generate-function-path), e.g. my_pkg.agent.generate.")
    custom_reward_path: str | None = private(
        description="Importable reward function (--custom-rm-path), e.g. my_pkg.reward.score.")


class ModelChoice(_Section):
    recipe: str = Field("glm4-9b", description="Recipe name in recipes/ (the model).")


class Install(_Section):
    image: str = Field("slimerl/slime:v0.5.15-cu129-hopper", description="Installation image from docker/images.yaml.")


# --- 2. GPU ownership and scheduling ------------------------------------------------------------

class Placement(_Section):
    ownership: Literal["colocated", "disaggregated", "external"] = Field(
        "disaggregated", description="Who owns the rollout GPUs: shared with training, a separate pool, or engines of another deployment.")
    scheduling: Literal["sync", "async"] = Field(
        "sync", description="Synchronous (rollout, train, sync) or fully async (generation in flight across updates).")
    nodes: int = Field(1, ge=1, le=MAX_NODES, description="Training nodes (--actor-num-nodes).")
    gpus_per_node: int = Field(8, ge=0, le=MAX_GPUS_PER_NODE, description="GPUs per node (--actor-num-gpus-per-node, --num-gpus-per-node).")
    train_gpus: int = Field(4, ge=0, le=MAX_GPUS, description="GPUs of the training pool (N_actor).")
    rollout_gpus: int = Field(4, ge=0, le=MAX_GPUS, description="GPUs of the rollout pool (--rollout-num-gpus).")
    engine_gpus: int = Field(2, ge=0, le=MAX_GPUS_PER_ENGINE, description="GPUs per rollout engine (--rollout-num-gpus-per-engine).")
    external_engine_addrs: list[str] = private(
        default_factory=list, description="host:port of each external SGLang engine (--rollout-external-engine-addrs).")


class Rollout(_Section):
    partial_rollout: bool = Field(False, description="Keep unfinished generations and continue them later (--partial-rollout).")
    over_sampling_batch_size: int | None = Field(
        None, ge=1, description="Prompts submitted per rollout when over-sampling (--over-sampling-batch-size).")
    queue: bool = Field(False, description="straw: the persistent rollout queue (payloads and state stored durably).")
    queue_run_id: str = Field("run-001", pattern=r"^[A-Za-z0-9._-]{1,64}$", description="straw run id; a new experiment takes a fresh one.")
    queue_state_dir: str | None = private(description="Directory where straw keeps queue state and payloads.")
    temperature: float = Field(1.0, gt=0, le=10, description="Sampling temperature (--rollout-temperature), > 0.")
    max_response_len: int = Field(8192, ge=1, le=1_048_576, description="Response-token limit (--rollout-max-response-len).")


# --- 3. Numerical behaviour ---------------------------------------------------------------------

class Precision(_Section):
    training: Literal["bf16", "fp8"] = Field("bf16", description="Training precision; FP8 training is experimental.")
    rollout: Literal["bf16", "fp8", "int4"] = Field("bf16", description="Rollout weights; FP8 maintained for large MoE, INT4 beta.")
    kv_cache_dtype: Literal["auto", "bf16", "fp8_e4m3"] = Field("auto", description="Attention KV-cache dtype (--sglang-kv-cache-dtype).")
    recurrent_state_dtype: Literal["float32", "bfloat16"] | None = Field(
        None, description="Recurrent (Mamba/GDN SSM) state dtype of hybrid models (--sglang-mamba-ssm-dtype).")
    state_kv_ratio: float | None = Field(
        None, gt=0, le=1, description="Share of cache memory for recurrent state vs attention KV in hybrid models.")


class Corrections(_Section):
    tis: bool = Field(False, description="Truncated importance sampling: clip the train/rollout ratio (--use-tis).")
    tis_clip: float = Field(2.0, gt=0, le=100, description="Upper clip of the TIS weight (--tis-clip).")
    icepop: bool = Field(False, description="IcePop: mask tokens whose ratio is outside [low, high].")
    icepop_low: float = Field(0.5, gt=0, le=1, description="IcePop lower ratio bound.")
    icepop_high: float = Field(2.0, ge=1, le=100, description="IcePop upper ratio bound.")
    r3: bool = Field(False, description="R3: replay the rollout's MoE routes in training (--use-rollout-routing-replay).")
    sc: bool = Field(False, description="SC: score centering with REINFORCE.")
    deterministic: bool = Field(False, description="Deterministic execution on each engine (not cross-engine equality).")


# --- 4. Serving ---------------------------------------------------------------------------------

class PD(_Section):
    enabled: bool = Field(False, description="Prefill/decode disaggregation with Mooncake KV transfer.")
    prefill_engines: int = Field(1, ge=0, le=MAX_GPUS, description="Engines in the prefill group.")
    decode_engines: int = Field(1, ge=0, le=MAX_GPUS, description="Engines in the decode group.")
    rdma_devices: list[str] = private(
        default_factory=list, description="RDMA (InfiniBand) device names for Mooncake, e.g. mlx5_0; from your environment.")


class HiCache(_Section):
    enabled: bool = Field(False, description="Hierarchical KV cache spilling reusable prefixes to host memory.")
    host_memory_gb: int = Field(64, ge=1, le=8192, description="Host-memory budget per engine for HiCache, GB.")


class EagleChoice(_Section):
    enabled: bool = Field(False, description="Speculative decoding with EAGLE.")
    head: Literal["mtp", "separate"] = Field("mtp", description="The checkpoint's MTP head, or a separate EAGLE head.")
    draft_head_path: str | None = private(description="Path of the separate EAGLE draft head checkpoint.")
    steps: int = Field(3, ge=1, le=16, description="Draft depth: speculative steps per verification.")
    topk: int = Field(1, ge=1, le=16, description="Draft top-k.")
    draft_tokens: int = Field(4, ge=1, le=64, description="Draft tokens per step.")


class Serving(_Section):
    pd: PD = Field(default_factory=PD, description="Prefill/decode disaggregation.")
    hicache: HiCache = Field(default_factory=HiCache, description="HiCache.")
    eagle: EagleChoice = Field(default_factory=EagleChoice, description="EAGLE speculative decoding.")
    concurrency: int = Field(512, ge=1, le=65536, description="Concurrent requests per engine (--sglang-server-concurrency).")
    mem_fraction_static: float = Field(0.8, gt=0, lt=1, description="--sglang-mem-fraction-static.")


# --- Resources, paths, evaluation ---------------------------------------------------------------

class Resources(_Section):
    tp: int = Field(2, ge=1, le=1024, description="Tensor parallel size.")
    pp: int = Field(1, ge=1, le=1024, description="Pipeline parallel size.")
    cp: int = Field(2, ge=1, le=1024, description="Context parallel size.")
    ep: int = Field(1, ge=1, le=4096, description="Expert parallel size.")
    pp_first_stage_layers: int | None = Field(None, ge=1, description="Layers on the first pipeline stage.")
    pp_last_stage_layers: int | None = Field(None, ge=1, description="Layers on the last pipeline stage.")
    cpu_adam: bool = Field(False, description="Optimizer states and step on the CPU (--optimizer-cpu-offload).")
    recompute: Literal["none", "selective", "full"] = Field("full", description="Activation recomputation.")
    max_tokens_per_gpu: int = Field(4608, ge=128, le=1_048_576, description="Token budget per GPU for dynamic batching.")


class Paths(_Section):
    hf_checkpoint: str = private("/data/models/model", description="Hugging Face checkpoint directory (BF16).")
    fp8_source: str | None = private(None, description="Directory for FP8-published source weights before BF16 conversion.")
    serving_checkpoint: str | None = private(None, description="Quantized HF checkpoint the engines serve (FP8/INT4 rollout).")
    ref_load: str = private("/data/ckpt/model_torch_dist", description="Reshardable training checkpoint (--ref-load).")
    prompt_data: str = private("/data/dapo-math-17k/dapo-math-17k.jsonl", description="Training prompts, JSONL or parquet.")
    save: str = private("/data/ckpt/run-001", description="Checkpoint directory (--save).")
    load: str | None = private(None, description="Checkpoint to resume from (--load); set it to resume.")
    output_dir: str = private("/data/runs/run-001", description="Run outputs: metrics.jsonl, logs.")
    save_interval: int = Field(20, ge=1, le=1_000_000, description="Rollouts between checkpoints (--save-interval).")


class Evaluation(_Section):
    enabled: bool = Field(False, description="Held-out evaluation during training.")
    name: str = Field("aime", pattern=r"^[A-Za-z0-9_-]{1,32}$", description="Eval data set name; logged as eval/<name>.")
    data_path: str = private("/data/aime-2024/aime-2024.jsonl", description="Held-out data set path.")
    interval: int = Field(20, ge=1, le=1_000_000, description="Rollouts between evaluations (--eval-interval).")
    n_samples: int = Field(8, ge=1, le=256, description="Samples per eval prompt (--n-samples-per-eval-prompt).")


class Experiment(_Section):
    """The complete configuration behind experiment.sh, experiment.json and serving-reference.sh."""

    task: Task = Field(default_factory=Task, description="Step 1: the task.")
    model: ModelChoice = Field(default_factory=ModelChoice, description="Step 1: the model.")
    install: Install = Field(default_factory=Install, description="Installation image.")
    placement: Placement = Field(default_factory=Placement, description="Step 2: GPU ownership and scheduling.")
    rollout: Rollout = Field(default_factory=Rollout, description="Rollout behaviour.")
    precision: Precision = Field(default_factory=Precision, description="Step 3: numerics.")
    corrections: Corrections = Field(default_factory=Corrections, description="Step 3: mismatch corrections.")
    serving: Serving = Field(default_factory=Serving, description="Step 4: serving.")
    resources: Resources = Field(default_factory=Resources, description="Parallelism and memory switches.")
    paths: Paths = Field(default_factory=Paths, description="Paths on the cluster.")
    evaluation: Evaluation = Field(default_factory=Evaluation, description="Held-out evaluation.")

    @field_validator("*", mode="before")
    @classmethod
    def _none_is_default(cls, v: Any) -> Any:
        # A section given as null in a hand-written file means "defaults", not an error.
        return {} if v is None else v


# --- Field paths: the one id of a choice --------------------------------------------------------

def iter_field_paths(model: type[BaseModel] = Experiment, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Yield (dotted path, FieldInfo) for every leaf field of the experiment."""
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from iter_field_paths(ann, path + ".")
        else:
            yield path, info


def is_private(info: Any) -> bool:
    extra = info.json_schema_extra
    return isinstance(extra, dict) and bool(extra.get(_PRIVATE_KEY))


PRIVATE_FIELDS: frozenset[str] = frozenset(p for p, info in iter_field_paths() if is_private(info))
LEAF_FIELDS: frozenset[str] = frozenset(p for p, _ in iter_field_paths())


def get_path(data: dict[str, Any], path: str) -> Any:
    cur: Any = data
    for part in path.split("."):
        cur = cur[part]
    return cur


def set_path(data: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    cur = data
    for part in parts[:-1]:
        cur = cur.setdefault(part, {})
    cur[parts[-1]] = value


def experiment_schema() -> dict[str, Any]:
    schema = Experiment.model_json_schema()
    schema["x-schema-version"] = SCHEMA_VERSION
    return schema
