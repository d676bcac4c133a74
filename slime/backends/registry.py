"""Trainer backends by `--train-backend` name: which class the Ray trainer actor builds, and the
capability checks each backend declares for itself.

Torch-free on purpose: `slime.args.validate` (and the lab, through it) asks these checks on
machines without torch, megatron-core or a GPU. The classes named here are imported only inside
the trainer actor (`build_backend`), where their heavy dependencies are present. The parser
imports no backend: it asks this registry, which names each backend's checks by "module:function".
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from slime.refusals import declare

if TYPE_CHECKING:
    from slime.backends.protocol import CriticBackend, TrainerBackend

_R = declare("backends", {"unknown": ("name", "known")})


@dataclass(frozen=True)
class TrainBackend:
    name: str
    cls: str  # "module:Class" implementing slime.backends.protocol.TrainerBackend
    capabilities: str  # "module:function": (cfg) -> list of problems, torch-free
    needs_gpu: bool
    summary: str
    # "module:Class" implementing slime.backends.protocol.CriticBackend (--advantage-estimator ppo);
    # None: the backend has no critic, and its capability check refuses ppo with the reason.
    critic: str | None = None
    # "module:function" (cfg.megatron, config.json as a dict) -> problems: model-spec flags the
    # backend builds from config.json itself and would otherwise ignore (None: the shared
    # comparison in slime.model_spec covers all it reads).
    spec_checks: str | None = None


# What the rollout engine named by --rollout-backend cannot honour: "module:function"
# (cfg, environment) -> problems, torch-free.
ROLLOUT_CAPABILITIES = "slime.backends.embedded.capabilities:rollout_engine_errors"


TRAIN_BACKENDS: dict[str, TrainBackend] = {
    "embedded": TrainBackend(
        "embedded", "slime.backends.embedded.backend:EmbeddedBackend",
        "slime.backends.embedded.capabilities:embedded_trainer_errors", False,
        "one Hugging Face model per data-parallel rank (torch DDP); CPU float32 or GPU",
        critic="slime.backends.embedded.critic:EmbeddedCritic",
        spec_checks="slime.backends.embedded.capabilities:spec_extra_mismatches"),
    "megatron": TrainBackend(
        "megatron", "slime.backends.megatron.backend:MegatronBackend",
        "slime.backends.megatron.capabilities:megatron_trainer_errors", False,
        "megatron-core GPTModel with TP/PP/EP/DP process groups from the Ray placement; GPUs (NCCL), or "
        "CPU float32 with gloo (slow: tests and CI)"),
}


def backend_names() -> list[str]:
    return list(TRAIN_BACKENDS)


def get_backend(name: str) -> TrainBackend:
    try:
        return TRAIN_BACKENDS[name]
    except KeyError:
        raise ValueError(_R("unknown", name=name, known=", ".join(TRAIN_BACKENDS))) from None


def _resolve(path: str) -> Any:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def capability_errors(cfg) -> list[str]:
    """What the chosen trainer backend cannot honour in this configuration (torch-free)."""
    check: Callable[[Any], list[str]] = _resolve(get_backend(cfg.cluster.train_backend).capabilities)
    return check(cfg)


def backend_capability_errors(cfg, environment: bool = True) -> list[str]:
    """What the chosen trainer backend, then the rollout engine, cannot honour (torch-free);
    environment=False: judge the flags only, not what this machine has installed."""
    return [*capability_errors(cfg), *_resolve(ROLLOUT_CAPABILITIES)(cfg, environment)]


def model_flag_errors(cfg) -> list[str]:
    """Model architecture flags (from scripts/models/*.sh) must match --hf-checkpoint/config.json;
    slime.model_spec compares them (the same comparison the converters and ``check`` run), then
    the chosen backend's own spec checks (TrainBackend.spec_checks)."""
    if not cfg.model.hf_checkpoint:
        return []
    path = Path(cfg.model.hf_checkpoint) / "config.json"
    if not path.exists():
        return []
    from slime.model_spec import flag_mismatches

    hf = json.loads(path.read_text())
    lines = [f"{m.key} = {m.config} in config.json, but the spec says {m.flag} {m.spec} ({m.field})"
             for m in flag_mismatches(cfg.megatron, hf)]
    extra = get_backend(cfg.cluster.train_backend).spec_checks
    if extra is not None:
        lines += _resolve(extra)(cfg.megatron, hf)
    return [f"{path}: {line}" for line in lines]


def backend_class(name: str) -> type[TrainerBackend]:
    """The backend class (imports torch and, for megatron, megatron-core)."""
    return _resolve(get_backend(name).cls)


def critic_class(name: str) -> type[CriticBackend]:
    """The backend's critic class (--advantage-estimator ppo); its capability check refused ppo
    before start when there is none, so reaching the error below is a registry bug."""
    path = get_backend(name).critic
    if path is None:
        raise ValueError(f"--train-backend {name} has no critic; its capability check must refuse ppo")
    return _resolve(path)
