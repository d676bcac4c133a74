"""``--enable-mtp-training`` and ``--mtp-loss-scaling-factor`` are read by the Megatron trainer
where the model has an MTP layer it builds, and refused by name everywhere else (torch-free)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slime.args import parse_args
from slime.backends.embedded.capabilities import embedded_megatron_flag_errors
from slime.backends.megatron.capabilities import megatron_trainer_errors
from slime.backends.megatron.model_args import builds_mtp, read_model_args, transformer_config_kwargs
from tests.refusal_codes import has

ROOT = Path(__file__).resolve().parents[2]
BASE = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "1", "--rm-type", "math",
        "--train-backend", "megatron"]


def _refusals(spec: str, *extra: str) -> list[str]:
    cfg = parse_args([*BASE, *read_model_args(ROOT / "scripts" / "models" / spec), *extra])
    return megatron_trainer_errors(cfg)


def _errors(spec: str, *extra: str) -> str:
    return "\n".join(_refusals(spec, *extra))


def test_mtp_training_on_a_model_with_an_mtp_layer_is_accepted_and_weighs_the_loss():
    argv = ["--enable-mtp-training", "--mtp-loss-scaling-factor", "0.3"]
    assert "mtp" not in _errors("deepseek-v3.sh", *argv).lower()
    cfg = parse_args([*BASE, *read_model_args(ROOT / "scripts" / "models" / "deepseek-v3.sh"), *argv])
    assert cfg.megatron["enable_mtp_training"] is True and builds_mtp(cfg.megatron)
    kw = transformer_config_kwargs(cfg.megatron)
    assert kw["mtp_num_layers"] == 1 and kw["mtp_loss_scaling_factor"] == 0.3 and kw["mtp_detach_heads"] is True


@pytest.mark.parametrize("spec", ["glm4-9B.sh", "glm5.2-744B-A40B.sh"])
def test_mtp_training_without_an_mtp_layer_the_backend_builds_is_refused(spec):
    # GLM-4-9B has no MTP layer; GLM-5's (DSA) MTP layer is carried unchanged, not built
    assert has(_refusals(spec, "--enable-mtp-training"), "megatron.mtp_training")


def test_an_mtp_loss_weight_without_mtp_training_is_refused():
    assert has(_refusals("qwen3.5-27B.sh", "--mtp-loss-scaling-factor", "0.2"), "megatron.mtp_loss_scale")


def test_the_embedded_trainer_refuses_mtp_training_by_name():
    errors = "\n".join(embedded_megatron_flag_errors({"enable_mtp_training": True, "mtp_loss_scaling_factor": "0.1"}))
    assert "--enable-mtp-training" in errors and "--mtp-loss-scaling-factor" in errors


def test_more_than_one_mtp_depth_on_a_qwen3_5_spec_is_refused():
    assert has(_refusals("qwen3.5-27B.sh", "--mtp-num-layers", "2"), "megatron.unsupported.hybrid_mtp_depths", n=2)
