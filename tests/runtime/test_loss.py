"""The shared policy loss: PPO clip, KL, entropy, TIS / IcePop, SC, aggregation."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from slime.training.loss import (  # noqa: E402
    LossFnConfig,
    aggregate,
    compute_total_loss,
    entropy_from_logits,
    gather_log_probs,
    icepop_weights,
    kl_penalty,
    policy_loss,
    reinforce_loss,
    tis_weights,
)


def _t(values: list) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def test_ratio_one_gives_minus_mean_advantage() -> None:
    logp = _t([[-1.0, -2.0], [-0.5, -0.3]])
    adv = _t([2.0, -1.0])
    loss, metrics = policy_loss(logp, logp.clone(), adv, torch.ones(2, 2))
    assert loss.item() == pytest.approx(-0.5)
    assert metrics["pg_clipfrac"] == 0.0 and metrics["ratio_mean"] == pytest.approx(1.0)


def test_clip_is_asymmetric_high_for_positive_low_for_negative() -> None:
    mask = torch.ones(1, 1)
    logp = torch.log(_t([[1.5]])).requires_grad_()
    loss, metrics = policy_loss(logp, torch.zeros(1, 1), _t([1.0]), mask, eps_clip=0.2, eps_clip_high=0.28)
    assert loss.item() == pytest.approx(-1.28)
    assert metrics["pg_clipfrac"] == 1.0
    loss.backward()
    assert logp.grad.abs().sum() == 0  # clipped: no gradient pushes the ratio further

    logp = torch.log(_t([[0.5]]))
    loss, _ = policy_loss(logp, torch.zeros(1, 1), _t([-1.0]), mask, eps_clip=0.2, eps_clip_high=0.28)
    assert loss.item() == pytest.approx(0.8)


def test_dual_clip_bounds_negative_advantage_loss() -> None:
    logp = torch.log(_t([[10.0]]))
    loss, _ = policy_loss(logp, torch.zeros(1, 1), _t([-1.0]), torch.ones(1, 1), eps_clip_c=3.0)
    assert loss.item() == pytest.approx(3.0)
    with pytest.raises(ValueError, match="must be > 1"):
        policy_loss(logp, torch.zeros(1, 1), _t([-1.0]), torch.ones(1, 1), eps_clip_c=0.5)


@pytest.mark.parametrize("kl_type", ["k1", "k2", "k3", "low_var_kl"])
def test_kl_is_zero_when_policies_are_equal(kl_type: str) -> None:
    logp = _t([[-1.0, -2.5]])
    assert kl_penalty(logp, logp.clone(), kl_type).abs().max().item() == 0.0


def test_kl_types_known_values() -> None:
    d = 0.5
    logp, ref = _t([[d]]), _t([[0.0]])
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(d)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(d * d / 2)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(math.exp(-d) - 1 + d)
    assert kl_penalty(logp, ref, "low_var_kl").item() == pytest.approx(math.exp(-d) - 1 + d)
    # low_var_kl clamps to [-10, 10]; plain k3 does not.
    far = _t([[-15.0]])
    assert kl_penalty(far, ref, "low_var_kl").item() == pytest.approx(10.0)
    assert kl_penalty(far, ref, "k3").item() > 1e6
    with pytest.raises(ValueError, match="unknown kl type 'k4'"):
        kl_penalty(logp, ref, "k4")


def test_tis_weight_is_capped_and_clamped_below() -> None:
    old = torch.log(_t([[3.0, 1.0, 0.1]]))
    rollout = torch.zeros(1, 3)
    w, metrics = tis_weights(old, rollout, torch.ones(1, 3), tis_clip=2.0, tis_clip_low=0.2)
    assert w.tolist()[0] == pytest.approx([2.0, 1.0, 0.2])
    assert metrics["tis_clipfrac"] == pytest.approx(2 / 3)
    assert not w.requires_grad


def test_icepop_masks_out_of_range_tokens_instead_of_clipping() -> None:
    old = torch.log(_t([[3.0, 1.2, 0.1]]))
    w, metrics = icepop_weights(old, torch.zeros(1, 3), torch.ones(1, 3), low=0.5, high=2.0)
    assert w.tolist()[0] == pytest.approx([0.0, 1.2, 0.0])
    assert metrics["icepop_mask_frac"] == pytest.approx(2 / 3)

    logp = old.clone().requires_grad_()
    config = LossFnConfig(tis_mode="icepop", tis_clip=2.0, tis_clip_low=0.5)
    loss, m = compute_total_loss(logp, old, _t([1.0]), torch.ones(1, 3), config, rollout_log_probs=torch.zeros(1, 3))
    loss.backward()
    assert logp.grad[0, 0] == 0 and logp.grad[0, 2] == 0 and logp.grad[0, 1] != 0
    assert m["train/icepop_mask_frac"] == pytest.approx(2 / 3)


def test_sample_mean_and_token_mean_aggregation_differ() -> None:
    values = _t([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    mask = _t([[1, 1, 1, 1], [1, 0, 0, 0]])
    assert aggregate(values, mask, "sample_mean").item() == pytest.approx(0.5)  # (1 + 0) / 2
    assert aggregate(values, mask, "token_mean").item() == pytest.approx(0.8)  # 4 / 5
    # A fully masked (removed) sample contributes zero and still counts as a sample of the step.
    assert aggregate(values, _t([[1, 1, 1, 1], [0, 0, 0, 0]]), "sample_mean").item() == pytest.approx(0.5)


def test_gradient_flows_only_through_log_probs() -> None:
    shape = (2, 3)
    logp = torch.full(shape, -1.0, requires_grad=True)
    others = {name: torch.full(shape, -1.1, requires_grad=True) for name in ("old", "ref", "rollout")}
    adv = torch.tensor([1.0, -1.0], requires_grad=True)
    config = LossFnConfig(kl_loss_coef=0.1, tis_mode="tis", eps_clip_high=0.28)
    loss, _ = compute_total_loss(logp, others["old"], adv, torch.ones(shape), config,
                                 ref_log_probs=others["ref"], rollout_log_probs=others["rollout"])
    loss.backward()
    assert logp.grad is not None and logp.grad.abs().sum() > 0
    assert all(t.grad is None for t in others.values()) and adv.grad is None


def test_total_loss_reports_train_metrics() -> None:
    logp = torch.full((2, 3), -1.0)
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    config = LossFnConfig(kl_loss_coef=0.5, kl_loss_type="k1", entropy_coef=0.01, tis_mode="tis")
    loss, metrics = compute_total_loss(logp, logp - 0.1, _t([1.0, 0.0]), torch.ones(2, 3), config,
                                       ref_log_probs=logp - 0.2, rollout_log_probs=logp - 0.3,
                                       entropy=entropy_from_logits(logits))
    expected = {"train/pg_loss", "train/kl_loss", "train/entropy", "train/pg_clipfrac", "train/tis_clipfrac",
                "train/train_rollout_logp_abs_diff"}
    assert expected <= set(metrics)
    assert metrics["train/kl_loss"] == pytest.approx(0.2)
    assert metrics["train/train_rollout_logp_abs_diff"] == pytest.approx(0.2)
    total = metrics["train/pg_loss"] + 0.5 * metrics["train/kl_loss"] - 0.01 * metrics["train/entropy"]
    assert loss.item() == pytest.approx(total, abs=1e-6)


def test_missing_inputs_for_configured_terms_raise() -> None:
    logp = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="ref_log_probs"):
        compute_total_loss(logp, logp, _t([1.0]), torch.ones(1, 2), LossFnConfig(kl_loss_coef=0.1))
    with pytest.raises(ValueError, match="rollout_log_probs"):
        compute_total_loss(logp, logp, _t([1.0]), torch.ones(1, 2), LossFnConfig(tis_mode="tis"))


def test_gather_log_probs_divides_by_temperature() -> None:
    logits = _t([[[2.0, 0.0, -1.0]]])
    tokens = torch.tensor([[0]])
    expected = torch.log_softmax(logits / 0.7, dim=-1)[0, 0, 0].item()
    assert gather_log_probs(logits, tokens, temperature=0.7).item() == pytest.approx(expected)
    assert gather_log_probs(logits, tokens).item() != pytest.approx(expected)


def test_entropy_chunked_matches_unchunked() -> None:
    logits = torch.randn(3, 5, 11, generator=torch.Generator().manual_seed(1))
    full = entropy_from_logits(logits)
    assert torch.allclose(entropy_from_logits(logits, chunk_size=4), full, atol=1e-6)
    uniform = entropy_from_logits(torch.zeros(1, 8))
    assert uniform.item() == pytest.approx(math.log(8))


def test_reinforce_loss_is_minus_advantage_times_token_mean_log_prob() -> None:
    logp = _t([[-1.0, -3.0], [-2.0, 0.0]])
    loss = reinforce_loss(logp, _t([1.0, 2.0]), _t([[1, 1], [1, 0]]))
    # sample 0: -1 * mean(-1, -3) = 2; sample 1: -2 * (-2) = 4; mean 3.
    assert loss.item() == pytest.approx(3.0)
