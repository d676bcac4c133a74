"""The runtime's flag table: each flag of train.py / train_async.py declared once.

A Flag holds its name, type, default, choices, help and the Config fields it fills
("section.field", e.g. "loss.kl_loss_type"). From this table come:
  - the argparse parser (slime.args.build_parser),
  - the Config, built by keyword from the fields each flag fills (slime.args.build_config),
  - describe(): plain records of every flag, which the lab and the tests read (argparse's
    private `_actions` is nobody's interface),
  - default_of(flag): the default that every other place reads (e.g. LossConfig's KL type).

Megatron's and SGLang's pass-through flags are not declared here: slime/megatron_flags.py and
slime/rollout/engines/sglang_flags.py are their pinned lists. Torch-free: the lab imports this.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Callable, Sequence

from slime.backends.registry import backend_names

Choices = Sequence[str] | Callable[[], Sequence[str]]


@dataclass(frozen=True)
class Flag:
    """One runtime flag. `fills`: the Config fields ("section.field") its value goes into, as parsed
    or through a rule of slime.args (DERIVED) that also reads other flags; empty for a flag the entry
    points read before parsing (--dry-run). `choices` may be a function: a registry read when the
    parser is built (the trainer backends, the advantage estimators)."""

    name: str
    group: str = ""
    fills: tuple[str, ...] = ()
    type: Callable[[str], Any] | None = None
    default: Any = None
    choices: Choices | None = None
    nargs: str | None = None
    metavar: str | None = None
    help: str | None = None
    switch: bool = False  # store_true: present -> True

    @property
    def dest(self) -> str:
        return self.name[2:].replace("-", "_")

    def choice_list(self) -> tuple[str, ...] | None:
        if self.choices is None:
            return None
        return tuple(self.choices() if callable(self.choices) else self.choices)


@dataclass(frozen=True)
class FlagInfo:
    """A flag as the lab and the docs read it: plain values only."""

    name: str
    group: str
    kind: str  # "switch" (no value), "value" (one) or "list" (one or more)
    type: str  # "bool" (a switch), "int", "float", "json" or "str"
    default: Any
    choices: tuple[str, ...] | None
    help: str | None
    fills: tuple[str, ...]


def _value(name: str, fills: tuple[str, ...] = (), **kw: Any) -> Flag:
    return Flag(name=name, fills=fills, **kw)


def _switch(name: str, help: str, fills: tuple[str, ...] = ()) -> Flag:
    return Flag(name=name, fills=fills, help=help, switch=True, default=False)


def advantage_estimator_choices() -> list[str]:
    """The estimators' records (slime/estimators.py, torch-free)."""
    from slime import estimators

    return list(estimators.names())


# --kl-loss-type values: the KL estimators of slime/training/loss.py and advantages.py.
KL_TYPES = ("k1", "k2", "k3", "low_var_kl")

# --router-policy values: which router serves each (ours: slime/rollout/router.py).
ROUTER_POLICIES = {"least_load": ("slime",), "round_robin": ("slime", "sglang-router"),
                   "cache_aware": ("sglang-router",), "power_of_two": ("sglang-router",),
                   "random": ("sglang-router",)}


def _table(*groups: tuple[str, tuple[Flag, ...]]) -> tuple[Flag, ...]:
    return tuple(replace(f, group=title) for title, flags in groups for f in flags)


FLAGS: tuple[Flag, ...] = _table(
    ("cluster", (
        _value("--actor-num-nodes", type=int, default=1, fills=("cluster.actor_num_nodes",)),
        _value("--actor-num-gpus-per-node", type=int, default=8,
               help="trainer ranks per node (GPUs; CPU bundles on a machine without GPUs)", fills=("cluster.actor_num_gpus_per_node",)),
        _value("--rollout-num-gpus", type=int, default=None, fills=("cluster.rollout_num_gpus",)),
        _value("--rollout-num-gpus-per-engine", type=int, default=1, fills=("cluster.rollout_num_gpus_per_engine",)),
        _value("--num-gpus-per-node", type=int, default=8, fills=("cluster.num_gpus_per_node",)),
        _switch("--colocate", "training and rollout alternate on one pool", fills=("cluster.colocate", "cluster.offload_train", "cluster.offload_rollout")),
        _switch("--offload", "offload both sides between phases", fills=("cluster.offload_train", "cluster.offload_rollout")),
        _switch("--offload-train", "offload the trainer during rollout", fills=("cluster.offload_train",)),
        _switch("--offload-rollout", "release engine memory during training", fills=("cluster.offload_rollout",)),
        _value("--cpus-per-bundle", type=float, default=0.5,
               help="CPUs per placement bundle when Ray has no GPUs (fractions let pools share 2 cores)", fills=("cluster.cpus_per_bundle",)),
        _value("--train-backend", choices=backend_names, default="embedded",
               help="trainer backend (slime/backends/registry.py)", fills=("cluster.train_backend",)),
        _value("--rollout-backend", choices=("embedded", "sglang"), default="embedded", fills=("cluster.rollout_backend",)),
        _value("--rollout-external-engine-addrs", nargs="+", default=None,
               help="host:port of engines another deployment owns (checked before start; no GPUs reserved)", fills=("cluster.external_engine_addrs",)),
        _value("--sglang-config", default=None, help="sglang.yaml: server groups regular/prefill/decode", fills=("cluster.sglang_config",)),
        _value("--prefill-num-servers", type=int, default=None, help="PD: engines of the prefill group", fills=("cluster.prefill_num_servers",)),
        _value("--router-policy", choices=tuple(ROUTER_POLICIES), default=None,
               help="least_load (default) or round_robin with our router; cache_aware (default), round_robin, "
                    "power_of_two or random with --use-sglang-router. Requests with an X-SMG-Routing-Key "
                    "header always use consistent hashing (our router)", fills=("cluster.router_policy",)),
        _switch("--use-sglang-router", "put sglang-router (pip install sglang-router) in front of the engines "
                                       "instead of slime's router; the runtime launches and stops it", fills=("cluster.use_sglang_router", "cluster.router_policy")),
        _switch("--dry-run", "pre-flight only: validate, check data / hooks / checkpoints, print the Ray placement plan; "
                             "loads no model and reserves nothing (slime/dry_run.py)"),
        _switch("--use-fault-tolerance", "health-check engines; restart, re-sync and re-register dead ones", fills=("fault.use_fault_tolerance",)),
        _value("--rollout-health-check-interval", type=float, default=30.0, fills=("fault.health_check_interval",)),
        _value("--rollout-health-check-timeout", type=float, default=30.0, fills=("fault.health_check_timeout",)),
        _value("--rollout-health-check-first-wait", type=float, default=0.0, fills=("fault.health_check_first_wait",)),
    )),
    ("model and checkpoints", (
        _value("--hf-checkpoint", default=None, fills=("model.hf_checkpoint",)),
        _value("--ref-load", default=None, fills=("model.ref_load",)),
        _value("--load", default=None, fills=("model.load",)),
        _value("--save", default=None, fills=("model.save",)),
        _value("--save-interval", type=int, default=None, fills=("model.save_interval",)),
    )),
    ("data", (
        _value("--prompt-data", default=None, fills=("data.prompt_data",)),
        _value("--input-key", default="input", fills=("data.input_key",)),
        _value("--label-key", default=None, fills=("data.label_key",)),
        _value("--metadata-key", default="metadata", fills=("data.metadata_key",)),
        _value("--tool-key", default="tools", fills=("data.tool_key",)),
        _switch("--apply-chat-template", "wrap prompts as a user message with the chat template", fills=("data.apply_chat_template",)),
        _value("--apply-chat-template-kwargs", type=json.loads, default=None, fills=("data.apply_chat_template_kwargs",)),
        _switch("--rollout-shuffle", "shuffle each epoch with --rollout-seed + epoch", fills=("data.rollout_shuffle",)),
        _value("--rollout-seed", type=int, default=42, fills=("data.rollout_seed", "rollout.seed")),
        _value("--num-rollout", type=int, default=None, fills=("run.num_rollout",)),
        _value("--num-epoch", type=int, default=None, fills=("run.num_epoch",)),
    )),
    ("rollout", (
        _value("--rollout-batch-size", type=int, default=None, fills=("rollout.rollout_batch_size",)),
        _value("--n-samples-per-prompt", type=int, default=1, fills=("rollout.n_samples_per_prompt", "loss.std_normalization")),
        _value("--rollout-temperature", type=float, default=1.0, fills=("rollout.sampling.temperature", "loss.temperature", "eval.sampling.temperature")),
        _value("--rollout-top-p", type=float, default=1.0, fills=("rollout.sampling.top_p", "eval.sampling.top_p")),
        _value("--rollout-top-k", type=int, default=-1, fills=("rollout.sampling.top_k", "eval.sampling.top_k")),
        _value("--rollout-max-response-len", type=int, default=1024, fills=("rollout.sampling.max_response_len", "loss.max_response_len", "eval.sampling.max_response_len")),
        _value("--rollout-max-prompt-len", type=int, default=None, fills=("data.rollout_max_prompt_len",)),
        _value("--rollout-stop-token-ids", type=int, nargs="+", default=None, fills=("rollout.sampling.stop_token_ids", "eval.sampling.stop_token_ids")),
        _value("--rm-type", default=None,
               help="built-in reward (slime/rewards: deepscaler, math, dapo, f1, gpqa, remote_rm, ...); "
                    "boxed_<name> grades only a \\boxed{} answer", fills=("rollout.rm_type",)),
        _value("--rm-url", default=None, help="--rm-type remote_rm: the reward model's HTTP endpoint (POST)", fills=("rollout.rm_url",)),
        _value("--rm-timeout", type=float, default=60.0, help="seconds per remote reward request", fills=("rollout.rm_timeout",)),
        _value("--rm-max-retries", type=int, default=3,
               help="retries of a failed remote reward request before the run stops naming the sample", fills=("rollout.rm_max_retries",)),
        _value("--custom-rm-path", default=None, fills=("rollout.custom_rm_path",)),
        _value("--reward-key", default=None, fills=("rollout.reward_key",)),
        _switch("--group-rm", "the custom reward receives the whole group of n samples", fills=("rollout.group_rm",)),
        _value("--custom-generate-function-path", default=None, fills=("rollout.custom_generate_function_path",)),
        _value("--sglang-server-concurrency", type=int, default=512, fills=("rollout.server_concurrency",)),
        _value("--over-sampling-batch-size", type=int, default=None,
               help="prompts (groups) submitted per sampling round, >= --rollout-batch-size; the first "
                    "rollout-batch-size groups that finish and pass the filter are kept, the rest aborted", fills=("rollout.over_sampling_batch_size",)),
        _value("--dynamic-sampling-filter-path", default=None,
               help="module.fn(args, samples) -> bool: keep a finished group? "
                    "built-in: slime.rollout.filters.nonzero_reward_std", fills=("rollout.dynamic_sampling_filter_path",)),
        _switch("--partial-rollout", "keep generations aborted at the end of a rollout (tokens, log-probs, weight "
                                     "version per token) and continue them in a later rollout", fills=("rollout.partial_rollout",)),
        _switch("--mask-offpolicy-in-partial-rollout", "tokens a resumed sample got from an older weight version "
                                                        "are masked out of the loss", fills=("rollout.mask_offpolicy_in_partial_rollout",)),
        _value("--rollout-queue-dir", default=None,
               help="straw: durable rollout queue (payloads + state) in this directory", fills=("rollout.queue_dir",)),
        _value("--rollout-queue-run-id", default=None,
               help="straw run id: the same id resumes the queue, a new experiment takes a fresh id", fills=("rollout.queue_run_id",)),
        _value("--num-rollout-producers", type=int, default=None,
               help="train_async.py with --rollout-queue-dir: producer actors that generate each rollout's "
                    "groups into the straw queue, one beside each engine group (default: one per engine "
                    "group there, 1 elsewhere); a producer killed mid-rollout is restarted and loses and "
                    "duplicates nothing", fills=("rollout.num_producers",)),
        _value("--max-weight-staleness", type=int, default=None,
               help="train_async.py: drop (and count) groups holding a token generated more than N weight "
                    "versions before the one being trained; 0 keeps only on-policy samples", fills=("rollout.max_weight_staleness",)),
    )),
    ("algorithm and loss", (
        _value("--advantage-estimator", default="grpo", choices=advantage_estimator_choices,
               help="ppo trains a critic (value model) beside the policy; trainer backends without one refuse it", fills=("loss.advantage_estimator",)),
        _switch("--normalize-advantages", "whiten token advantages over the rollout (mean 0, variance 1)", fills=("loss.normalize_advantages",)),
        _switch("--calculate-per-token-loss", "token-mean loss over the step's tokens instead of the mean of "
                                              "per-sample means", fills=("loss.calculate_per_token_loss",)),
        _switch("--disable-grpo-std-normalization", "mean-centring only", fills=("loss.std_normalization",)),
        _switch("--disable-rewards-normalization", "raw rewards as advantages", fills=("loss.normalize_rewards",)),
        _value("--eps-clip", type=float, default=0.2, fills=("loss.eps_clip",)),
        _value("--eps-clip-high", type=float, default=None, fills=("loss.eps_clip_high",)),
        _value("--eps-clip-c", type=float, default=None, fills=("loss.eps_clip_c",)),
        _switch("--use-kl-loss", "add a KL term against the --ref-load model", fills=("loss.use_kl_loss",)),
        _value("--kl-loss-coef", type=float, default=0.0, fills=("loss.kl_loss_coef",)),
        _value("--kl-loss-type", choices=KL_TYPES, default="k1", fills=("loss.kl_loss_type",)),
        _value("--kl-coef", type=float, default=0.0,
               help="KL to --ref-load in the per-token reward (reinforce_plus_plus*, ppo); with group estimators "
                    "use --use-kl-loss", fills=("loss.kl_coef",)),
        _value("--entropy-coef", type=float, default=0.0, fills=("loss.entropy_coef",)),
        _value("--gamma", type=float, default=1.0, help="ppo: GAE discount per token", fills=("loss.gamma",)),
        _value("--lambd", type=float, default=1.0, help="ppo: GAE lambda (1: Monte-Carlo returns minus values)", fills=("loss.lambd",)),
        _value("--value-clip", type=float, default=0.2,
               help="ppo: a value moves at most this far from its pre-update prediction in the value loss", fills=("loss.value_clip",)),
        _switch("--use-tis", "truncated importance sampling against the rollout log-probs", fills=("loss.use_tis",)),
        _value("--tis-clip", type=float, default=2.0, fills=("loss.tis_clip",)),
        _value("--tis-clip-low", type=float, default=0.0, fills=("loss.tis_clip_low",)),
        _switch("--use-sc", "SC (score centering): advantage = importance-weighted reward (sequence ratio "
                            "pi_train/pi_rollout, truncated at --tis-clip) minus its group mean; plain REINFORCE loss "
                            "(slime/training/advantages.py)", fills=("loss.use_sc",)),
        _switch("--use-icepop", "IcePop: mask tokens whose train/rollout ratio leaves [low, high]", fills=("loss.use_icepop",)),
        _value("--icepop-low", type=float, default=0.5, fills=("loss.icepop_low",)),
        _value("--icepop-high", type=float, default=2.0, fills=("loss.icepop_high",)),
        _switch("--use-rollout-logprobs", "use the engine's log-probs as the PPO old policy", fills=("loss.use_rollout_logprobs",)),
        _switch("--use-routing-replay", "MoE: replay the routes of the first training forward (needs a MoE backend)", fills=("loss.use_routing_replay",)),
        _switch("--use-rollout-routing-replay", "MoE R3: replay the rollout engine's routes in training "
                                                "(needs a MoE backend and engines that return routes)", fills=("loss.use_rollout_routing_replay",)),
    )),
    ("critic (--advantage-estimator ppo)", (
        _value("--critic-lr", type=float, default=None, help="the critic's learning rate (default: --lr)", fills=("critic.lr",)),
        _value("--critic-load", default=None,
               help="resume the critic from this checkpoint directory (default with --load: <--load>_critic)", fills=("critic.load",)),
        _value("--critic-save", default=None, help="critic checkpoints (default: <--save>_critic)", fills=("critic.save",)),
    )),
    ("batching and optimizer", (
        _value("--global-batch-size", type=int, default=None, fills=("batch.global_batch_size",)),
        _value("--num-steps-per-rollout", type=int, default=None, fills=("batch.num_steps_per_rollout",)),
        _value("--micro-batch-size", type=int, default=1, fills=("batch.micro_batch_size",)),
        _switch("--use-dynamic-batch-size", "pack micro-batches up to --max-tokens-per-gpu", fills=("batch.use_dynamic_batch_size",)),
        _value("--max-tokens-per-gpu", type=int, default=None, fills=("batch.max_tokens_per_gpu",)),
        _switch("--balance-data", "split each step over the data-parallel ranks with equal sample counts and "
                                  "near-equal token totals (longest first), instead of consecutive slices", fills=("batch.balance_data",)),
        _value("--lr", type=float, default=1e-6, fills=("optim.lr",)),
        _value("--weight-decay", type=float, default=0.0, fills=("optim.weight_decay",)),
        _value("--adam-beta1", type=float, default=0.9, fills=("optim.adam_beta1",)),
        _value("--adam-beta2", type=float, default=0.98, fills=("optim.adam_beta2",)),
        _value("--adam-eps", type=float, default=1e-8, fills=("optim.adam_eps",)),
        _value("--clip-grad", type=float, default=1.0, fills=("optim.clip_grad",)),
        _value("--seed", type=int, default=1234, fills=("run.seed",)),
    )),
    ("weight sync", (
        _value("--update-weight-mode", choices=("full", "delta"), default="full", fills=("sync.update_weight_mode",)),
        _value("--update-weight-transport", choices=("nccl", "gloo", "disk", "tensor", "http", "mooncake"),
               default=None,
               help="default: tensor (object-store hand-off) when colocated, else disk. nccl: broadcast from "
                    "trainer rank 0 (gloo where there is no GPU); gloo forces gloo; mooncake: Mooncake's "
                    "transfer engine writes each bucket into registered engine buffers", fills=("sync.transport",)),
        _value("--mooncake-protocol", choices=("tcp", "rdma"), default="tcp",
               help="transport mooncake: tcp anywhere, rdma on InfiniBand/RoCE clusters", fills=("sync.mooncake_protocol",)),
        _value("--mooncake-device", default="", help="transport mooncake over rdma: device names (mlx5_0,...)", fills=("sync.mooncake_device",)),
        _value("--weight-sync-check-tol", type=float, default=1e-4,
               help="after each sync every engine's log-probs must match the trainer's within this; <= 0: off", fills=("sync.check_tol",)),
        _value("--update-weight-disk-dir", default=None, fills=("sync.disk_dir",)),
        _value("--update-weight-buffer-size", type=int, default=512 * 1024**2, fills=("sync.buffer_size",)),
        _value("--update-weights-interval", type=int, default=1, fills=("sync.interval",)),
    )),
    ("evaluation", (
        _value("--eval-interval", type=int, default=None, fills=("eval.interval",)),
        _value("--eval-prompt-data", nargs="+", default=None, metavar="NAME PATH", fills=("eval.datasets",)),
        _value("--n-samples-per-eval-prompt", type=int, default=1, fills=("eval.n_samples_per_prompt",)),
        _value("--eval-max-response-len", type=int, default=None, fills=("eval.sampling.max_response_len",)),
        _value("--eval-temperature", type=float, default=None, fills=("eval.sampling.temperature",)),
        _value("--eval-top-p", type=float, default=None, fills=("eval.sampling.top_p",)),
        _switch("--skip-eval-before-train", "no evaluation before the first rollout", fills=("eval.skip_eval_before_train",)),
    )),
    ("logging", (
        _value("--output-dir", default=None, help="metrics.jsonl is appended here", fills=("log.output_dir",)),
        _switch("--use-tensorboard", "also write TensorBoard events to OUTPUT_DIR/tensorboard", fills=("log.use_tensorboard",)),
        _switch("--use-wandb", "not available in this build: refused by validate()", fills=("log.use_wandb",)),
        _value("--save-debug-rollout-data", default=None,
               help="write each rollout's samples to this path ({rollout_id} is filled in), JSONL", fills=("log.save_debug_rollout_data",)),
    )),
)

BY_NAME: dict[str, Flag] = {f.name: f for f in FLAGS}


def default_of(name: str) -> Any:
    """The default of a runtime flag: the one home of the fact, read by every other place."""
    return BY_NAME[name].default


def _type_name(t: Callable[[str], Any] | None) -> str:
    return {int: "int", float: "float", json.loads: "json"}.get(t, "str") if t is not None else "str"


@lru_cache(maxsize=1)
def describe() -> tuple[FlagInfo, ...]:
    """Every runtime flag as a plain record (the registries' choices read now), in table order."""
    return tuple(FlagInfo(name=f.name, group=f.group, kind="switch" if f.switch else "list" if f.nargs else "value",
                          type="bool" if f.switch else _type_name(f.type), default=f.default,
                          choices=f.choice_list(), help=f.help, fills=f.fills) for f in FLAGS)


def add_to(parser: argparse.ArgumentParser) -> None:
    """Declare every flag of the table on `parser`, in argument groups named as the table's."""
    groups: dict[str, Any] = {}
    for f in FLAGS:
        g = groups.get(f.group) or groups.setdefault(f.group, parser.add_argument_group(f.group))
        if f.switch:
            g.add_argument(f.name, action="store_true", help=f.help)
            continue
        kw: dict[str, Any] = {"default": f.default}
        for key in ("type", "nargs", "metavar", "help"):
            if getattr(f, key) is not None:
                kw[key] = getattr(f, key)
        choices = f.choice_list()
        if choices is not None:
            kw["choices"] = list(choices)
        g.add_argument(f.name, **kw)
