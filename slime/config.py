"""Sub-configs: each part of the runtime receives only the one it uses (never the whole args bag).

Built from the parsed flags by slime.args.build_config; checked by slime.args.validate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slime.flags import default_of


@dataclass
class ClusterConfig:
    actor_num_nodes: int = 1
    actor_num_gpus_per_node: int = 8
    rollout_num_gpus: int | None = None
    rollout_num_gpus_per_engine: int = 1
    num_gpus_per_node: int = 8
    colocate: bool = False
    offload_train: bool = False
    offload_rollout: bool = False
    cpus_per_bundle: float = 0.5  # CPU-only machines: fractional CPU bundles so pools fit 2 cores
    train_backend: str = "embedded"
    rollout_backend: str = "embedded"
    use_gpu: bool = False  # decided at start-up from the Ray cluster's resources
    external_engine_addrs: list[str] | None = None  # engines another deployment owns: no rollout pool
    sglang_config: str | None = None  # sglang.yaml: server groups (regular / prefill / decode)
    prefill_num_servers: int | None = None
    router_policy: str = "least_load"
    use_sglang_router: bool = False  # sglang-router in front of the engines (launched by the runtime)

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
    prompt_data: str | None = None
    input_key: str = "input"
    label_key: str | None = None
    metadata_key: str = "metadata"
    apply_chat_template: bool = False
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    rollout_shuffle: bool = False
    rollout_seed: int = 42
    rollout_max_prompt_len: int | None = None
    tool_key: str | None = "tools"  # a record's tools, given to the chat template


@dataclass
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_response_len: int = 1024
    stop_token_ids: list[int] | None = None


@dataclass
class RolloutConfig:
    rollout_batch_size: int = 0
    n_samples_per_prompt: int = 1
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    rm_type: str | None = None
    custom_rm_path: str | None = None
    group_rm: bool = False
    reward_key: str | None = None
    custom_generate_function_path: str | None = None
    seed: int = 42
    server_concurrency: int = 512
    # Over-sampling / dynamic sampling / partial rollout (docs/en/rollout-queue.md).
    over_sampling_batch_size: int | None = None  # groups submitted per round (>= rollout_batch_size)
    dynamic_sampling_filter_path: str | None = None  # (args, samples) -> bool: keep this group?
    partial_rollout: bool = False  # aborted generations go to a buffer and are continued later
    mask_offpolicy_in_partial_rollout: bool = False  # tokens of older weight versions leave the loss
    # straw, the persistent rollout queue.
    queue_dir: str | None = None
    queue_run_id: str | None = None
    # --rm-type remote_rm: a reward model served over HTTP (slime/rewards/remote.py).
    rm_url: str | None = None
    rm_timeout: float = 60.0
    rm_max_retries: int = 3
    # train_async.py: samples generated more than this many weight versions ago are dropped (whole
    # groups) and counted in rollout/stale_dropped_samples; None: no limit.
    max_weight_staleness: int | None = None
    # straw + train_async.py: producer actors that generate a rollout's groups into the queue
    # (slime/rollout/producers.py); None: one per engine group under straw + fully async, else 1.
    num_producers: int | None = None

    @property
    def dynamic(self) -> bool:
        """Per-group generation with abort at the end (over-sampling, a filter or partial rollout)."""
        return bool(self.over_sampling_batch_size or self.dynamic_sampling_filter_path or self.partial_rollout)


@dataclass
class RunConfig:
    num_rollout: int | None = None
    num_epoch: int | None = None
    seed: int = 1234


@dataclass
class ModelConfig:
    hf_checkpoint: str | None = None
    ref_load: str | None = None
    load: str | None = None
    save: str | None = None
    save_interval: int | None = None


@dataclass
class OptimConfig:
    lr: float = 1e-6
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    # LR schedule (Megatron's flag names and meanings; slime/training/lr_schedule.py).
    lr_decay_style: str = "constant"
    min_lr: float = 0.0
    lr_warmup_iters: int = 0
    lr_warmup_fraction: float | None = None
    lr_decay_iters: int | None = None  # None: every optimizer step of the run
    total_steps: int | None = None  # optimizer steps of the whole run (num_rollout x steps per rollout)


@dataclass
class LossConfig:
    advantage_estimator: str = "grpo"
    normalize_rewards: bool = True
    std_normalization: bool = True
    eps_clip: float = 0.2
    eps_clip_high: float | None = None
    eps_clip_c: float | None = None
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0
    kl_loss_type: str = default_of("--kl-loss-type")
    entropy_coef: float = 0.0
    use_tis: bool = False
    tis_clip: float = 2.0
    tis_clip_low: float = 0.0
    use_icepop: bool = False
    icepop_low: float = 0.5
    icepop_high: float = 2.0
    use_rollout_logprobs: bool = False
    temperature: float = 1.0  # the sampling temperature: trainer log-probs use the same one
    use_routing_replay: bool = False  # MoE: replay the first forward's routes in training
    use_rollout_routing_replay: bool = False  # MoE R3: replay the rollout engine's routes
    calculate_per_token_loss: bool = False  # token_mean aggregation instead of sample_mean
    normalize_advantages: bool = False  # whiten token advantages over the rollout
    kl_coef: float = 0.0  # KL in the reward (reinforce_plus_plus*, ppo): -kl_coef * KL_t per token
    max_response_len: int = 1024  # Dr. GRPO's constant normalizer (--rollout-max-response-len)
    use_sc: bool = False  # SC: centred importance-weighted scores, plain REINFORCE (--use-sc)
    # --advantage-estimator ppo: GAE's discount and lambda, the critic's value-loss clip.
    gamma: float = 1.0
    lambd: float = 1.0
    value_clip: float = 0.2

    @property
    def needs_ref(self) -> bool:
        """A frozen reference model is loaded for the KL loss or the KL in the reward."""
        return self.use_kl_loss or self.kl_coef != 0.0


@dataclass
class CriticConfig:
    """The critic (value model) of --advantage-estimator ppo: a copy of the policy's architecture
    with a scalar head, trained beside the policy (slime/backends/embedded/critic.py)."""

    lr: float | None = None  # --critic-lr; None: --lr
    load: str | None = None  # --critic-load; None: <--load>_critic when resuming, else a fresh critic
    save: str | None = None  # --critic-save; None: <--save>_critic


@dataclass
class BatchConfig:
    global_batch_size: int | None = None
    num_steps_per_rollout: int | None = None
    micro_batch_size: int = 1
    use_dynamic_batch_size: bool = False
    max_tokens_per_gpu: int | None = None
    balance_data: bool = False  # --balance-data: DP shards of a step with equal counts and near-equal tokens


@dataclass
class SyncConfig:
    update_weight_mode: str = "full"
    transport: str | None = None  # None: tensor when colocated, disk otherwise (CPU has no nccl)
    disk_dir: str | None = None
    buffer_size: int = 512 * 1024**2
    interval: int = 1  # --update-weights-interval: sync every N rollouts (and after the last)
    check_tol: float | None = 1e-4  # post-sync engine-vs-trainer log-prob check; None: off
    mooncake_protocol: str = "tcp"  # transport mooncake: tcp anywhere, rdma on InfiniBand/RoCE
    mooncake_device: str = ""  # rdma: device names (mlx5_0,...); "" lets Mooncake pick


@dataclass
class FaultConfig:
    use_fault_tolerance: bool = False
    health_check_interval: float = 30.0
    health_check_timeout: float = 30.0
    health_check_first_wait: float = 0.0


@dataclass
class EvalConfig:
    interval: int | None = None
    datasets: list[tuple[str, str]] = field(default_factory=list)
    n_samples_per_prompt: int = 1
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    skip_eval_before_train: bool = False


@dataclass
class LogConfig:
    output_dir: str | None = None
    use_tensorboard: bool = False
    use_wandb: bool = False
    save_debug_rollout_data: str | None = None  # path template with {rollout_id}


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
