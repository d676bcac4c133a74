"""What the Megatron trainer backend can honour, checked before Ray reserves anything (torch-free:
slime.args.validate and the lab ask these on machines without megatron-core or a GPU).

TP, PP and EP > 1 run in the Ray loop (every rank takes part in weight sync: export.py), on GPUs
or, slowly, on the CPU with gloo (cpu.py). CP > 1 needs Transformer Engine's attention, which this
build cannot use: refused."""

from __future__ import annotations

from slime import estimators
from slime.backends.megatron.model_args import builds_mtp, unsupported_flags
from slime.model_spec import flag_bool, flag_int
from slime.parallel_sizes import data_parallel_size, model_parallel_size
from slime.refusals import declare

_R = declare("megatron", {
    "model_flags": ("missing",),
    "context_parallel": ("cp",),
    "dp_whole": ("ranks", "model"),
    "ppo_critic": (),
    "mtp_training": (),
    "mtp_loss_scale": ("value",),
    "routing_replay": (),
})

_MODEL_FLAGS = ("num_layers", "hidden_size", "num_attention_heads")


def megatron_trainer_errors(cfg) -> list[str]:
    e: list[str] = []
    m = cfg.megatron
    missing = [k for k in _MODEL_FLAGS if k not in m]
    if missing:
        e.append(_R("model_flags", missing=", ".join("--" + k.replace("_", "-") for k in missing)))
    e.extend(unsupported_flags(m))
    cp = flag_int(m, "context_parallel_size", 1) or 1
    if cp > 1:
        e.append(_R("context_parallel", cp=cp))
    tp = flag_int(m, "tensor_model_parallel_size", 1) or 1
    pp = flag_int(m, "pipeline_model_parallel_size", 1) or 1
    ranks = cfg.cluster.num_trainer_ranks
    if not data_parallel_size(ranks, tp, pp, cp):
        e.append(_R("dp_whole", ranks=ranks, model=model_parallel_size(tp, pp, cp)))
    if flag_bool(m, "enable_mtp_training") and not builds_mtp(m):
        e.append(_R("mtp_training"))
    if "mtp_loss_scaling_factor" in m and not flag_bool(m, "enable_mtp_training"):
        e.append(_R("mtp_loss_scale", value=m["mtp_loss_scaling_factor"]))
    if estimators.of(cfg.loss).needs_critic:  # the registry's megatron entry has no critic
        e.append(_R("ppo_critic"))
    if getattr(cfg.loss, "use_rollout_routing_replay", False) or getattr(cfg.loss, "use_routing_replay", False):
        e.append(_R("routing_replay"))
    return e
