"""The experiment: every choice the Quick Start names, as one pydantic model.

The pydantic field path (`placement.ownership`, `serving.pd.rdma_devices`, ...) is the one id of
a choice everywhere: the form control, the share link, the undo history, both translations and
the A/B diff. Private fields (machine paths, engine addresses, RDMA device names, hook paths) are
marked here and only here, with `private()`; the JSON schema shows them as `"x-private": true`
and `lab/core/share.py` strips them by reading this marking.

Values a recipe sets (parallelism, engine size, node counts, batch sizes) are copied into the
experiment when a model is chosen (`lab/rules/dependents.py` does that as one change), so that a user can
edit them and the edit is visible in history and in A/B.
"""
from __future__ import annotations

from typing import Any, ClassVar, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from lab.core.runtime_choices import advantage_estimators, reward_types
from lab.core.text_rule import TextRuleError, check_text
from slime.limits import MAX_GPUS, MAX_GPUS_PER_ENGINE, MAX_GPUS_PER_NODE, MAX_NODES  # the runtime's own limits

SCHEMA_VERSION = 2  # schema 1 is the earlier flat layout; lab/migrate.py upgrades it.

_PRIVATE_KEY = "x-private"
# The runtime flag(s) a field becomes, declared here and only here. "x-flag" (one flag) marks a
# simple field: `lab.core.train_flags.declared_line` writes `--flag value` (a bool is a switch, None
# is left out). "x-flags" (several) names the flags a structural field shapes through hand-written
# render logic (pools, PD, sglang.yaml). A field that becomes no flag says why in "x-lab-only".
_FLAG_KEY = "x-flag"
_FLAGS_KEY = "x-flags"
_LAB_ONLY_KEY = "x-lab-only"


def _extra(flag: str | None, flags: tuple[str, ...], lab_only: str | None, private: bool) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if private:
        extra[_PRIVATE_KEY] = True
    if flag:
        extra[_FLAG_KEY] = flag
    if flags:
        extra[_FLAGS_KEY] = list(flags)
    if lab_only:
        extra[_LAB_ONLY_KEY] = lab_only
    return extra


def field(default: Any = None, *, description: str, flag: str | None = None, flags: tuple[str, ...] = (),
          lab_only: str | None = None, **kwargs: Any) -> Any:
    """A field with its runtime flag (or its reason for having none) declared beside it."""
    extra = _extra(flag, flags, lab_only, False)
    if "default_factory" in kwargs:
        return Field(description=description, json_schema_extra=extra, **kwargs)
    return Field(default, description=description, json_schema_extra=extra, **kwargs)


def private(default: Any = None, *, description: str, flag: str | None = None, flags: tuple[str, ...] = (),
            lab_only: str | None = None, **kwargs: Any) -> Any:
    """A field that never leaves the user's machine in a share link."""
    extra = _extra(flag, flags, lab_only, True)
    if "default_factory" in kwargs:
        return Field(description=description, json_schema_extra=extra, **kwargs)
    return Field(default, description=description, json_schema_extra=extra, **kwargs)


class _Section(BaseModel):
    # Unknown keys are an error, not silently dropped: a typo in a loaded file must be named.
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # Fields whose value is itself runtime flags: the leading-`-` part of the rule does not apply.
    _FLAG_WORDS: ClassVar[frozenset[str]] = frozenset()

    @field_validator("*", mode="after")
    @classmethod
    def _text_rule(cls, v: Any, info: ValidationInfo) -> Any:
        # One rule for characters (lab/core/text_rule.py), so no entry point can skip it.
        try:
            return check_text(v, allow_dash=info.field_name in cls._FLAG_WORDS)
        except TextRuleError as exc:
            raise PydanticCustomError("text_rule", str(exc).replace("{", "{{").replace("}", "}}"),
                                     {"key": exc.key, "params": exc.params}) from None


# --- 1. Task and model -------------------------------------------------------------------------

class Task(_Section):
    kind: Literal["math", "custom"] = field(
        "math", description="Verifiable math (JSONL prompt/label, deepscaler reward) or my own agent / reward hooks.", lab_only="chooses the defaults of the task; the hook fields carry the flags")
    input_key: str = field("prompt", description="JSONL key of the prompt (--input-key).", flag="--input-key")
    label_key: str = field("label", description="JSONL key of the reference answer (--label-key).", flag="--label-key")
    apply_chat_template: bool = field(True, description="Wrap each prompt in the tokenizer's chat template.", flag="--apply-chat-template")
    rm_type: Literal[reward_types()] = field(  # type: ignore[valid-type]
        "deepscaler", description="Built-in reward (--rm-type); deepscaler grades the text after </think>.", flags=("--rm-type",))
    n_samples_per_prompt: int = field(8, ge=1, le=256, description="Responses sampled per prompt (GRPO group size).", flag="--n-samples-per-prompt")
    advantage_estimator: Literal[advantage_estimators()] = field(  # type: ignore[valid-type]
        "grpo", description="Advantage estimator (--advantage-estimator).", flag="--advantage-estimator")
    num_rollout: int = field(3, ge=1, le=1_000_000, description="Rollout rounds to run (--num-rollout); 3 is a correctness run.", flag="--num-rollout")
    rollout_batch_size: int = field(32, ge=1, le=65536, description="Prompts per rollout (--rollout-batch-size).", flag="--rollout-batch-size")
    num_steps_per_rollout: int = field(1, ge=1, le=1024, description="Optimizer steps per rollout (--num-steps-per-rollout).", flag="--num-steps-per-rollout")
    custom_generate_path: str | None = private(
        description="Importable generate function for my agent (--custom-generate-function-path), e.g. my_pkg.agent.generate.", flags=("--custom-generate-function-path",))
    custom_reward_path: str | None = private(
        description="Importable reward function (--custom-rm-path), e.g. my_pkg.reward.score.", flags=("--custom-rm-path",))


class ModelChoice(_Section):
    _FLAG_WORDS: ClassVar[frozenset[str]] = frozenset({"spec_args"})

    recipe: str = field("glm4-9b", description="Recipe name in recipes/ (the model).", flags=("--train-backend", "--rollout-backend"))
    spec_args: str = field(
        "", description="A custom model's architecture (MODEL_ARGS as shell words), carried by an imported launch script "
                        "whose model spec matches none the lab ships; empty: the recipe's spec.",
        lab_only="the model's MODEL_ARGS, written into the run's model spec file; the recipe's spec when empty")


class Install(_Section):
    image: str = field("slimerl/slime:0.1.0-cu130-hopper", description="Installation image from docker/images.yaml.", lab_only="the container image the cluster runs; no runtime flag")


# --- 2. GPU ownership and scheduling ------------------------------------------------------------

class Placement(_Section):
    ownership: Literal["colocated", "disaggregated", "external"] = field(
        "disaggregated", description="Who owns the rollout GPUs: shared with training, a separate pool, or engines of another deployment.", flags=("--colocate", "--rollout-num-gpus", "--rollout-external-engine-addrs"))
    scheduling: Literal["sync", "async"] = field(
        "sync", description="Synchronous (rollout, train, sync) or fully async (generation in flight across updates).", lab_only="chooses the entry point (train.py or train_async.py), not a flag")
    nodes: int = field(1, ge=1, le=MAX_NODES, description="Training nodes (--actor-num-nodes).", flags=("--actor-num-nodes",))
    gpus_per_node: int = field(8, ge=0, le=MAX_GPUS_PER_NODE, description="GPUs per node (--actor-num-gpus-per-node, --num-gpus-per-node).", flags=("--actor-num-gpus-per-node", "--num-gpus-per-node"))
    train_gpus: int = field(4, ge=0, le=MAX_GPUS, description="GPUs of the training pool (N_actor).", flags=("--actor-num-nodes", "--actor-num-gpus-per-node"))
    rollout_gpus: int = field(4, ge=0, le=MAX_GPUS, description="GPUs of the rollout pool (--rollout-num-gpus).", flags=("--rollout-num-gpus",))
    engine_gpus: int = field(2, ge=0, le=MAX_GPUS_PER_ENGINE, description="GPUs per rollout engine (--rollout-num-gpus-per-engine).", flags=("--rollout-num-gpus-per-engine",))
    external_engine_addrs: list[str] = private(
        default_factory=list, description="host:port of each external SGLang engine (--rollout-external-engine-addrs).", flags=("--rollout-external-engine-addrs",))


class Rollout(_Section):
    partial_rollout: bool = field(False, description="Keep unfinished generations and continue them later (--partial-rollout).", flag="--partial-rollout")
    over_sampling_batch_size: int | None = field(
        None, ge=1, description="Prompts submitted per rollout when over-sampling (--over-sampling-batch-size).", flag="--over-sampling-batch-size")
    queue: bool = field(False, description="straw: the persistent rollout queue (payloads and state stored durably).", flags=("--rollout-queue-dir", "--rollout-queue-run-id"))
    queue_run_id: str = field("run-001", pattern=r"^[A-Za-z0-9._-]{1,64}$", description="straw run id; a new experiment takes a fresh one.", flags=("--rollout-queue-run-id",))
    queue_state_dir: str | None = private(description="Directory where straw keeps queue state and payloads.", flags=("--rollout-queue-dir",))
    producers: int | None = field(None, ge=1, le=1024, description="straw with fully async: producer actors that write each rollout's groups into the queue (--num-rollout-producers); empty: one beside each engine group.", flag="--num-rollout-producers")
    temperature: float = field(1.0, gt=0, le=10, description="Sampling temperature (--rollout-temperature), > 0.", flag="--rollout-temperature")
    max_response_len: int = field(8192, ge=1, le=1_048_576, description="Response-token limit (--rollout-max-response-len).", flag="--rollout-max-response-len")


# --- 3. Numerical behaviour ---------------------------------------------------------------------

class Precision(_Section):
    training: Literal["bf16", "fp8"] = field("bf16", description="Training precision; FP8 training is experimental.", flags=("--fp8-format", "--fp8-recipe"))
    rollout: Literal["bf16", "fp8", "int4"] = field("bf16", description="Rollout weights; FP8 maintained for large MoE, INT4 beta.", flags=("--hf-checkpoint",))
    kv_cache_dtype: Literal["auto", "bf16", "fp8_e4m3"] = field("auto", description="Attention KV-cache dtype (--sglang-kv-cache-dtype).", flags=("--sglang-kv-cache-dtype",))
    recurrent_state_dtype: Literal["float32", "bfloat16"] | None = field(
        None, description="Recurrent (Mamba/GDN SSM) state dtype of hybrid models (--sglang-mamba-ssm-dtype).", flags=("--sglang-mamba-ssm-dtype",))
    state_kv_ratio: float | None = field(
        None, gt=0, le=1, description="Share of cache memory for recurrent state vs attention KV in hybrid models.", flags=("--sglang-mamba-full-memory-ratio",))


class Corrections(_Section):
    tis: bool = field(False, description="Truncated importance sampling: clip the train/rollout ratio (--use-tis).", flag="--use-tis")
    tis_clip: float = field(2.0, gt=0, le=100, description="Upper clip of the TIS weight, and SC's sequence-ratio truncation (--tis-clip).", flags=("--tis-clip",))
    icepop: bool = field(False, description="IcePop: mask tokens whose ratio is outside [low, high].", flag="--use-icepop")
    icepop_low: float = field(0.5, gt=0, le=1, description="IcePop lower ratio bound.", flags=("--icepop-low",))
    icepop_high: float = field(2.0, ge=1, le=100, description="IcePop upper ratio bound.", flags=("--icepop-high",))
    r3: bool = field(False, description="R3: replay the rollout's MoE routes in training (--use-rollout-routing-replay).", flags=("--use-rollout-routing-replay", "--sglang-enable-return-routed-experts"))
    sc: bool = field(False, description="SC: advantage = ratio-weighted reward minus its group mean, plain REINFORCE loss (--use-sc).", flag="--use-sc")
    deterministic: bool = field(False, description="Deterministic execution on each engine (not cross-engine equality).", flags=("--sglang-enable-deterministic-inference",))


# --- 4. Serving ---------------------------------------------------------------------------------

class PD(_Section):
    enabled: bool = field(False, description="Prefill/decode disaggregation with Mooncake KV transfer.", flags=("--sglang-config", "--use-sglang-router"))
    prefill_engines: int = field(1, ge=0, le=MAX_GPUS, description="Engines in the prefill group.", flags=("--sglang-config",))
    decode_engines: int = field(1, ge=0, le=MAX_GPUS, description="Engines in the decode group.", flags=("--sglang-config",))
    rdma_devices: list[str] = private(
        default_factory=list, description="RDMA (InfiniBand) device names for Mooncake, e.g. mlx5_0; from your environment.", flags=("--sglang-disaggregation-ib-device",))


class HiCache(_Section):
    enabled: bool = field(False, description="Hierarchical KV cache spilling reusable prefixes to host memory.", flags=("--sglang-enable-hierarchical-cache", "--sglang-config"))
    host_memory_gb: int = field(64, ge=1, le=8192, description="Host-memory budget per engine for HiCache, GB.", flags=("--sglang-hicache-size", "--sglang-config"))


class EagleChoice(_Section):
    enabled: bool = field(False, description="Speculative decoding with EAGLE.", flags=("--sglang-speculative-algorithm", "--sglang-config"))
    head: Literal["mtp", "separate"] = field("mtp", description="The checkpoint's MTP head, or a separate EAGLE head.", flags=("--sglang-speculative-draft-model-path",))
    draft_head_path: str | None = private(description="Path of the separate EAGLE draft head checkpoint.", flags=("--sglang-speculative-draft-model-path",))
    steps: int = field(3, ge=1, le=16, description="Draft depth: speculative steps per verification.", flags=("--sglang-speculative-num-steps", "--sglang-config"))
    topk: int = field(1, ge=1, le=16, description="Draft top-k.", flags=("--sglang-speculative-eagle-topk", "--sglang-config"))
    draft_tokens: int = field(4, ge=1, le=64, description="Draft tokens per step.", flags=("--sglang-speculative-num-draft-tokens", "--sglang-config"))


class Serving(_Section):
    pd: PD = Field(default_factory=PD, description="Prefill/decode disaggregation.")
    hicache: HiCache = Field(default_factory=HiCache, description="HiCache.")
    eagle: EagleChoice = Field(default_factory=EagleChoice, description="EAGLE speculative decoding.")
    concurrency: int = field(512, ge=1, le=65536, description="Concurrent requests per engine (--sglang-server-concurrency).", flags=("--sglang-server-concurrency",))
    mem_fraction_static: float = field(0.8, gt=0, lt=1, description="--sglang-mem-fraction-static.", flags=("--sglang-mem-fraction-static",))


# --- Resources, paths, evaluation ---------------------------------------------------------------

class Resources(_Section):
    tp: int = field(2, ge=1, le=1024, description="Tensor parallel size.", flags=("--tensor-model-parallel-size", "--sequence-parallel"))
    pp: int = field(1, ge=1, le=1024, description="Pipeline parallel size.", flags=("--pipeline-model-parallel-size",))
    cp: int = field(2, ge=1, le=1024, description="Context parallel size.", flags=("--context-parallel-size",))
    ep: int = field(1, ge=1, le=4096, description="Expert parallel size.", flags=("--expert-model-parallel-size",))
    pp_first_stage_layers: int | None = field(None, ge=1, description="Layers on the first pipeline stage.", flags=("--decoder-first-pipeline-num-layers",))
    pp_last_stage_layers: int | None = field(None, ge=1, description="Layers on the last pipeline stage.", flags=("--decoder-last-pipeline-num-layers",))
    cpu_adam: bool = field(False, description="Optimizer states and step on the CPU (--optimizer-cpu-offload).", flags=("--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d", "--use-precision-aware-optimizer"))
    recompute: Literal["none", "selective", "full"] = field("full", description="Activation recomputation.", flags=("--recompute-granularity", "--recompute-method", "--recompute-num-layers"))
    max_tokens_per_gpu: int = field(4608, ge=128, le=1_048_576, description="Token budget per GPU for dynamic batching.", flag="--max-tokens-per-gpu")


class Paths(_Section):
    hf_checkpoint: str = private("/data/models/model", description="Hugging Face checkpoint directory (BF16).", flags=("--hf-checkpoint",))
    fp8_source: str | None = private(None, description="Directory for FP8-published source weights before BF16 conversion.", lab_only="input of the BF16 conversion in prepare; the run reads --hf-checkpoint")
    serving_checkpoint: str | None = private(None, description="Quantized HF checkpoint the engines serve (FP8/INT4 rollout).", flags=("--hf-checkpoint",))
    ref_load: str = private("/data/ckpt/model_torch_dist", description="Reshardable training checkpoint (--ref-load).", flags=("--ref-load",))
    prompt_data: str = private("/data/dapo-math-17k/dapo-math-17k.jsonl", description="Training prompts, JSONL or parquet.", flags=("--prompt-data",))
    save: str = private("/data/ckpt/run-001", description="Checkpoint directory (--save).", flags=("--save",))
    load: str | None = private(None, description="Checkpoint to resume from (--load); set it to resume.", flags=("--load",))
    output_dir: str = private("/data/runs/run-001", description="Run outputs: metrics.jsonl, logs.", flags=("--output-dir",))
    save_interval: int = field(20, ge=1, le=1_000_000, description="Rollouts between checkpoints (--save-interval).", flag="--save-interval")


class Evaluation(_Section):
    enabled: bool = field(False, description="Held-out evaluation during training.", flags=("--eval-interval", "--eval-prompt-data", "--n-samples-per-eval-prompt"))
    name: str = field("aime", pattern=r"^[A-Za-z0-9_-]{1,32}$", description="Eval data set name; logged as eval/<name>.", flags=("--eval-prompt-data",))
    data_path: str = private("/data/aime-2024/aime-2024.jsonl", description="Held-out data set path.", flags=("--eval-prompt-data",))
    interval: int = field(20, ge=1, le=1_000_000, description="Rollouts between evaluations (--eval-interval).", flags=("--eval-interval",))
    n_samples: int = field(8, ge=1, le=256, description="Samples per eval prompt (--n-samples-per-eval-prompt).", flags=("--n-samples-per-eval-prompt",))


class Advanced(_Section):
    _FLAG_WORDS: ClassVar[frozenset[str]] = frozenset({"extra_flags", "unset_flags"})

    unset_flags: list[str] = field(
        default_factory=list, lab_only="flags left out of the command, so the runtime's default applies",
        description="Flags the lab's command leaves out so the runtime's default applies: set by an imported launch "
                    "script that does not pass them.")

    extra_flags: str = private(
        "", flags=("--*",),
        description="Flags no control covers, as shell words (e.g. --eps-clip 0.3). The runtime's parser checks "
                    "them as you type: an unknown flag gets the closest real one, a flag a control owns points to "
                    "that control. Private: never in share links.")


EXTRA_FLAGS_PATH = "advanced.extra_flags"


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
    advanced: Advanced = Field(default_factory=Advanced, description="Additional runtime flags.")

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


def _schema_extra(info: Any) -> dict[str, Any]:
    extra = info.json_schema_extra
    return extra if isinstance(extra, dict) else {}


# path -> the one flag a simple field renders as (generic: `--flag value`, a bool a switch).
SIMPLE_FLAG: dict[str, str] = {p: _schema_extra(i)[_FLAG_KEY] for p, i in iter_field_paths() if _FLAG_KEY in _schema_extra(i)}
# path -> every runtime flag the field shapes (the simple flag, or a structural field's flags).
FIELD_FLAGS: dict[str, tuple[str, ...]] = {
    p: tuple(([_schema_extra(i)[_FLAG_KEY]] if _FLAG_KEY in _schema_extra(i) else []) + _schema_extra(i).get(_FLAGS_KEY, []))
    for p, i in iter_field_paths()}
# path -> why the field becomes no runtime flag.
LAB_ONLY: dict[str, str] = {p: _schema_extra(i)[_LAB_ONLY_KEY] for p, i in iter_field_paths() if _LAB_ONLY_KEY in _schema_extra(i)}


_FIELDS_OF_FLAG: dict[str, list[str]] = {}
for _path, _flags in FIELD_FLAGS.items():
    for _flag in _flags:
        _FIELDS_OF_FLAG.setdefault(_flag, []).append(_path)


def fields_of_flag(flag: str) -> list[str]:
    """The fields that shape `flag`, in field order (empty when no control owns it)."""
    return list(_FIELDS_OF_FLAG.get(flag, ()))
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
