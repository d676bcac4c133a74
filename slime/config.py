"""Sub-configs: each part of the runtime receives only the one it uses (never the whole args bag).

Built from the parsed flags by slime.args.build_config; checked by slime.args.validate.
A field's default is its flag's, read from the flag table (slime/flags.py): a Config built without
flags holds what the command line holds without them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slime.flags import default_of


@dataclass
class ClusterConfig:
    actor_num_nodes: int = default_of("--actor-num-nodes")
    actor_num_gpus_per_node: int = default_of("--actor-num-gpus-per-node")
    rollout_num_gpus: int | None = default_of("--rollout-num-gpus")
    rollout_num_gpus_per_engine: int = default_of("--rollout-num-gpus-per-engine")
    num_gpus_per_node: int = default_of("--num-gpus-per-node")
    colocate: bool = default_of("--colocate")
    offload_train: bool = False
    offload_rollout: bool = False
    cpus_per_bundle: float = default_of("--cpus-per-bundle")  # CPU-only machines: fractional CPU bundles so pools fit 2 cores
    train_backend: str = default_of("--train-backend")
    rollout_backend: str = default_of("--rollout-backend")
    use_gpu: bool = False  # decided at start-up from the Ray cluster's resources
    external_engine_addrs: list[str] | None = default_of("--rollout-external-engine-addrs")  # engines another deployment owns: no rollout pool
    sglang_config: str | None = default_of("--sglang-config")  # sglang.yaml: server groups (regular / prefill / decode)
    prefill_num_servers: int | None = default_of("--prefill-num-servers")
    router_policy: str = "least_load"
    use_sglang_router: bool = default_of("--use-sglang-router")  # sglang-router in front of the engines (launched by the runtime)

    @property
    def external(self) -> bool:
        return bool(self.external_engine_addrs)

    @property
    def num_trainer_ranks(self) -> int:
        return self.actor_num_nodes * self.actor_num_gpus_per_node

    @property
    def num_rollout_units(self) -> int:
        return self.rollout_num_gpus if self.rollout_num_gpus is not None else self.num_trainer_ranks

    @property
    def num_engines(self) -> int:
        if self.external_engine_addrs:
            return len(self.external_engine_addrs)
        return max(1, self.num_rollout_units // self.rollout_num_gpus_per_engine)


@dataclass
class DataConfig:
    prompt_data: str | None = default_of("--prompt-data")
    input_key: str = default_of("--input-key")
    label_key: str | None = default_of("--label-key")
    metadata_key: str = default_of("--metadata-key")
    apply_chat_template: bool = default_of("--apply-chat-template")
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    rollout_shuffle: bool = default_of("--rollout-shuffle")
    rollout_seed: int = default_of("--rollout-seed")
    rollout_max_prompt_len: int | None = default_of("--rollout-max-prompt-len")
    tool_key: str | None = default_of("--tool-key")  # a record's tools, given to the chat template


@dataclass
class SamplingConfig:
    temperature: float = default_of("--rollout-temperature")
    top_p: float = default_of("--rollout-top-p")
    top_k: int = default_of("--rollout-top-k")
    max_response_len: int = default_of("--rollout-max-response-len")
    stop_token_ids: list[int] | None = default_of("--rollout-stop-token-ids")


@dataclass
class RolloutConfig:
    rollout_batch_size: int = 0
    n_samples_per_prompt: int = default_of("--n-samples-per-prompt")
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    rm_type: str | None = default_of("--rm-type")
    custom_rm_path: str | None = default_of("--custom-rm-path")
    group_rm: bool = default_of("--group-rm")
    reward_key: str | None = default_of("--reward-key")
    custom_generate_function_path: str | None = default_of("--custom-generate-function-path")
    seed: int = default_of("--rollout-seed")
    server_concurrency: int = default_of("--sglang-server-concurrency")
    # Over-sampling / dynamic sampling / partial rollout (docs/en/rollout-queue.md).
    over_sampling_batch_size: int | None = default_of("--over-sampling-batch-size")  # groups submitted per round (>= rollout_batch_size)
    dynamic_sampling_filter_path: str | None = default_of("--dynamic-sampling-filter-path")  # (args, samples) -> bool: keep this group?
    partial_rollout: bool = default_of("--partial-rollout")  # aborted generations go to a buffer and are continued later
    mask_offpolicy_in_partial_rollout: bool = default_of("--mask-offpolicy-in-partial-rollout")  # tokens of older weight versions leave the loss
    # straw, the persistent rollout queue.
    queue_dir: str | None = default_of("--rollout-queue-dir")
    queue_run_id: str | None = default_of("--rollout-queue-run-id")
    # --rm-type remote_rm: a reward model served over HTTP (slime/rewards/remote.py).
    rm_url: str | None = default_of("--rm-url")
    rm_timeout: float = default_of("--rm-timeout")
    rm_max_retries: int = default_of("--rm-max-retries")
    # train_async.py: samples generated more than this many weight versions ago are dropped (whole
    # groups) and counted in rollout/stale_dropped_samples; None: no limit.
    max_weight_staleness: int | None = default_of("--max-weight-staleness")
    # straw + train_async.py: producer actors that generate a rollout's groups into the queue
    # (slime/rollout/producers.py); None: one per engine group under straw + fully async, else 1.
    num_producers: int | None = default_of("--num-rollout-producers")

    @property
    def dynamic(self) -> bool:
        """Per-group generation with abort at the end (over-sampling, a filter or partial rollout)."""
        return bool(self.over_sampling_batch_size or self.dynamic_sampling_filter_path or self.partial_rollout)


@dataclass
class RunConfig:
    num_rollout: int | None = default_of("--num-rollout")
    num_epoch: int | None = default_of("--num-epoch")
    seed: int = default_of("--seed")


@dataclass
class ModelConfig:
    hf_checkpoint: str | None = default_of("--hf-checkpoint")
    ref_load: str | None = default_of("--ref-load")
    load: str | None = default_of("--load")
    save: str | None = default_of("--save")
    save_interval: int | None = default_of("--save-interval")


@dataclass
class OptimConfig:
    lr: float = default_of("--lr")
    weight_decay: float = default_of("--weight-decay")
    adam_beta1: float = default_of("--adam-beta1")
    adam_beta2: float = default_of("--adam-beta2")
    adam_eps: float = default_of("--adam-eps")
    clip_grad: float = default_of("--clip-grad")
    # LR schedule (Megatron's flag names and meanings; slime/training/lr_schedule.py).
    lr_decay_style: str = "constant"
    min_lr: float = 0.0
    lr_warmup_iters: int = 0
    lr_warmup_fraction: float | None = None
    lr_decay_iters: int | None = None  # None: every optimizer step of the run
    total_steps: int | None = None  # optimizer steps of the whole run (num_rollout x steps per rollout)


@dataclass
class LossConfig:
    advantage_estimator: str = default_of("--advantage-estimator")
    normalize_rewards: bool = True
    std_normalization: bool = True
    eps_clip: float = default_of("--eps-clip")
    eps_clip_high: float | None = default_of("--eps-clip-high")
    eps_clip_c: float | None = default_of("--eps-clip-c")
    use_kl_loss: bool = default_of("--use-kl-loss")
    kl_loss_coef: float = default_of("--kl-loss-coef")
    kl_loss_type: str = default_of("--kl-loss-type")
    entropy_coef: float = default_of("--entropy-coef")
    use_tis: bool = default_of("--use-tis")
    tis_clip: float = default_of("--tis-clip")
    tis_clip_low: float = default_of("--tis-clip-low")
    use_icepop: bool = default_of("--use-icepop")
    icepop_low: float = default_of("--icepop-low")
    icepop_high: float = default_of("--icepop-high")
    use_rollout_logprobs: bool = default_of("--use-rollout-logprobs")
    temperature: float = default_of("--rollout-temperature")  # the sampling temperature: trainer log-probs use the same one
    use_routing_replay: bool = default_of("--use-routing-replay")  # MoE: replay the first forward's routes in training
    use_rollout_routing_replay: bool = default_of("--use-rollout-routing-replay")  # MoE R3: replay the rollout engine's routes
    calculate_per_token_loss: bool = default_of("--calculate-per-token-loss")  # token_mean aggregation instead of sample_mean
    normalize_advantages: bool = default_of("--normalize-advantages")  # whiten token advantages over the rollout
    kl_coef: float = default_of("--kl-coef")  # KL in the reward (reinforce_plus_plus*, ppo): -kl_coef * KL_t per token
    max_response_len: int = default_of("--rollout-max-response-len")  # Dr. GRPO's constant normalizer (--rollout-max-response-len)
    use_sc: bool = default_of("--use-sc")  # SC: centred importance-weighted scores, plain REINFORCE (--use-sc)
    # --advantage-estimator ppo: GAE's discount and lambda, the critic's value-loss clip.
    gamma: float = default_of("--gamma")
    lambd: float = default_of("--lambd")
    value_clip: float = default_of("--value-clip")

    @property
    def needs_ref(self) -> bool:
        """A frozen reference model is loaded for the KL loss or the KL in the reward."""
        return self.use_kl_loss or self.kl_coef != 0.0


@dataclass
class CriticConfig:
    """The critic (value model) of --advantage-estimator ppo: a copy of the policy's architecture
    with a scalar head, trained beside the policy (slime/backends/embedded/critic.py)."""

    lr: float | None = default_of("--critic-lr")  # --critic-lr; None: --lr
    load: str | None = default_of("--critic-load")  # --critic-load; None: <--load>_critic when resuming, else a fresh critic
    save: str | None = default_of("--critic-save")  # --critic-save; None: <--save>_critic


@dataclass
class BatchConfig:
    global_batch_size: int | None = default_of("--global-batch-size")
    num_steps_per_rollout: int | None = default_of("--num-steps-per-rollout")
    micro_batch_size: int = default_of("--micro-batch-size")
    use_dynamic_batch_size: bool = default_of("--use-dynamic-batch-size")
    max_tokens_per_gpu: int | None = default_of("--max-tokens-per-gpu")
    balance_data: bool = default_of("--balance-data")  # --balance-data: DP shards of a step with equal counts and near-equal tokens


@dataclass
class SyncConfig:
    update_weight_mode: str = default_of("--update-weight-mode")
    transport: str | None = default_of("--update-weight-transport")  # None: tensor when colocated, disk otherwise (CPU has no nccl)
    disk_dir: str | None = default_of("--update-weight-disk-dir")
    buffer_size: int = default_of("--update-weight-buffer-size")
    interval: int = default_of("--update-weights-interval")  # --update-weights-interval: sync every N rollouts (and after the last)
    check_tol: float | None = 1e-4  # post-sync engine-vs-trainer log-prob check; None: off
    mooncake_protocol: str = default_of("--mooncake-protocol")  # transport mooncake: tcp anywhere, rdma on InfiniBand/RoCE
    mooncake_device: str = default_of("--mooncake-device")  # rdma: device names (mlx5_0,...); "" lets Mooncake pick


@dataclass
class FaultConfig:
    use_fault_tolerance: bool = default_of("--use-fault-tolerance")
    health_check_interval: float = default_of("--rollout-health-check-interval")
    health_check_timeout: float = default_of("--rollout-health-check-timeout")
    health_check_first_wait: float = default_of("--rollout-health-check-first-wait")


@dataclass
class EvalConfig:
    interval: int | None = default_of("--eval-interval")
    datasets: list[tuple[str, str]] = field(default_factory=list)
    n_samples_per_prompt: int = default_of("--n-samples-per-eval-prompt")
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    skip_eval_before_train: bool = default_of("--skip-eval-before-train")


@dataclass
class LogConfig:
    output_dir: str | None = default_of("--output-dir")
    use_tensorboard: bool = default_of("--use-tensorboard")
    use_wandb: bool = default_of("--use-wandb")
    save_debug_rollout_data: str | None = default_of("--save-debug-rollout-data")  # path template with {rollout_id}


@dataclass
class Config:
    cluster: ClusterConfig
    data: DataConfig
    rollout: RolloutConfig
    run: RunConfig
    model: ModelConfig
    optim: OptimConfig
    loss: LossConfig
    batch: BatchConfig
    sync: SyncConfig
    eval: EvalConfig
    log: LogConfig
    fault: FaultConfig = field(default_factory=FaultConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    megatron: dict[str, Any] = field(default_factory=dict)  # pass-through, for slime/backends/megatron
    sglang: dict[str, Any] = field(default_factory=dict)  # pass-through, for the sglang launcher
    async_mode: bool = False
