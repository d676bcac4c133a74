"""Each estimator as its paper defines it, checked against numbers computed by hand.

Data shared by the loss tests: one sample of two tokens with ratios pi/pi_old = 1.1 and 0.5,
advantage +1, clip 0.2.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from slime.config import LossConfig as RuntimeLoss  # noqa: E402
from slime.data.batch_builder import compute_advantages  # noqa: E402
from slime.training.advantages import kl_value, token_advantages  # noqa: E402
from slime.training.loss import compute_total_loss, from_runtime, policy_loss, step_denominator  # noqa: E402
from tests.refusal_codes import has  # noqa: E402

RATIOS = [1.1, 0.5]


def _logp(ratios=RATIOS):
    return torch.log(torch.tensor([ratios])).requires_grad_()


def _loss(kind: str, ratios=RATIOS, adv=1.0):
    logp = _logp(ratios)
    loss, m = policy_loss(logp, torch.zeros(1, len(ratios)), torch.tensor([adv]), torch.ones(1, len(ratios)),
                          eps_clip=0.2, kind=kind)
    loss.backward()
    return loss.item(), logp.grad[0].tolist(), m


def test_grpo_is_token_level_ppo_clip():
    # token 1: max(-1.1, -clip(1.1)=-1.1) = -1.1; token 2: max(-0.5, -0.8) = -0.5; mean -0.8
    loss, grad, m = _loss("ppo")
    assert loss == pytest.approx(-0.8)
    assert grad == pytest.approx([-1.1 / 2, -0.5 / 2])  # d(-A r_t)/d log pi_t = -A r_t, / 2 tokens
    assert m["pg_clipfrac"] == 0.0


def test_gspo_uses_one_length_normalized_sequence_ratio_and_clips_it():
    # s = exp(mean(log 1.1, log 0.5)) = sqrt(0.55) = 0.741620; A > 0: max(-s, -0.8) = -s, and the
    # gradient of -A s is -A s / |y| on every token (one ratio for the whole sequence)
    s = math.sqrt(1.1 * 0.5)
    loss, grad, m = _loss("gspo")
    assert loss == pytest.approx(-s)
    assert grad == pytest.approx([-s / 2, -s / 2])
    assert m["pg_clipfrac"] == 0.0 and m["ppo_kl"] == pytest.approx(-math.log(s))
    # A < 0: max(s, 0.8) = 0.8, the clipped side: no gradient on any token of the sequence
    loss, grad, m = _loss("gspo", adv=-1.0)
    assert loss == pytest.approx(0.8)
    assert grad == pytest.approx([0.0, 0.0]) and m["pg_clipfrac"] == 1.0
    # token-level PPO on the same data clips only token 2 (ratio 0.5): token 1 keeps its gradient
    loss, grad, m = _loss("ppo", adv=-1.0)
    assert loss == pytest.approx((1.1 + 0.8) / 2) and grad == pytest.approx([1.1 / 2, 0.0])


def test_gspo_and_grpo_give_different_losses_on_the_same_data():
    data = [1.3, 0.95, 1.02]
    assert _loss("gspo", data)[0] != pytest.approx(_loss("ppo", data)[0], abs=1e-4)
    # GRPO: tokens -min(1.3, 1.2), -0.95, -1.02 -> mean -1.0566..; GSPO: s = (1.3*.95*1.02)^(1/3)
    assert _loss("ppo", data)[0] == pytest.approx(-(1.2 + 0.95 + 1.02) / 3)
    assert _loss("gspo", data)[0] == pytest.approx(-((1.3 * 0.95 * 1.02) ** (1 / 3)))


def test_cispo_weights_log_prob_by_the_detached_clipped_ratio():
    # weights clip(1.1) = 1.1, clip(0.5) = 0.8; loss = -(1.1 log 1.1 + 0.8 log 0.5) / 2
    loss, grad, m = _loss("cispo")
    assert loss == pytest.approx(-(1.1 * math.log(1.1) + 0.8 * math.log(0.5)) / 2)
    assert grad == pytest.approx([-1.1 / 2, -0.8 / 2])
    assert m["pg_clipfrac"] == pytest.approx(0.5)
    # a token PPO clips (ratio 1.5, A > 0) has no PPO gradient but keeps CISPO's (weight 1.2)
    assert _loss("ppo", [1.5])[1] == [0.0]
    assert _loss("cispo", [1.5])[1] == pytest.approx([-1.2])


def test_dr_grpo_centres_without_std_and_normalizes_by_a_constant_length():
    assert compute_advantages([1, 0, 0, 0], 4, "dr_grpo") == pytest.approx([0.75, -0.25, -0.25, -0.25])
    cfg = from_runtime(RuntimeLoss(advantage_estimator="dr_grpo", max_response_len=4))
    assert cfg.agg == "constant_norm" and cfg.policy_loss == "ppo"
    # two samples, 1 and 3 loss tokens, ratio 1: loss = -(A0 * 1 + A1 * 3) / (2 samples x 4)
    mask = torch.tensor([[1.0, 0, 0], [1, 1, 1]])
    lp = torch.zeros(2, 3)
    loss, _ = compute_total_loss(lp, lp, torch.tensor([2.0, -1.0]), mask, cfg,
                                 denominator=step_denominator(mask.tolist(), "constant_norm", 4))
    assert loss.item() == pytest.approx(-(2.0 * 1 - 1.0 * 3) / 8)


def test_estimator_picks_its_policy_loss():
    for est, kind in [("grpo", "ppo"), ("gspo", "gspo"), ("cispo", "cispo"), ("reinforce_plus_plus", "ppo"),
                      ("reinforce_plus_plus_baseline", "ppo")]:
        assert from_runtime(RuntimeLoss(advantage_estimator=est)).policy_loss == kind
    assert from_runtime(RuntimeLoss(calculate_per_token_loss=True)).agg == "token_mean"


OLD, REF, MASK = [-1.0, -1.0, -1.0], [-1.5, -1.0, -0.5], [1, 1, 1]  # k1 KL = [0.5, 0, -0.5]


def test_reinforce_plus_plus_return_to_go_with_kl_in_the_reward():
    # token rewards -0.1 * KL = [-0.05, 0, 0.05], reward 1 at the last token -> returns [1.0, 1.05, 1.05]
    adv = token_advantages([1.0], [MASK], [OLD], [REF], "reinforce_plus_plus", 0.1, "k1", False)
    assert adv[0] == pytest.approx([1.0, 1.05, 1.05])


def test_reinforce_plus_plus_return_to_go_has_no_kl_from_loss_masked_tokens():
    """Issue 27's example: mask [1, 0, 0, 1] gives G_0 = -1.7161 in THUDM/slime, -1.6837 when the
    KL of the two masked (tool-output) tokens leaks into the return-to-go.

    The issue gives only the mask and the two numbers; these inputs reproduce both exactly under
    the reference semantics (get_reinforce_plus_plus_returns: token reward ``-kl_coef * KL_t *
    mask_t``, the sample reward added at the last loss token, returns summed backwards with
    gamma 1): reward -1 (dapo's score of a wrong answer), kl_coef 0.5, k1 with
    ``d = log pi_old - log pi_ref = [0.7, -0.05, -0.0148, 0.7322]``.
    Reference: G_0 = -1 - 0.5 * (0.7 + 0.7322) = -1.7161.
    Leaking:   G_0 = -1.7161 - 0.5 * (-0.05 - 0.0148) = -1.6837.
    """
    old, ref, mask = [-0.5, -1.25, -1.0148, -0.2678], [-1.2, -1.2, -1.0, -1.0], [1, 0, 0, 1]
    adv = token_advantages([-1.0], [mask], [old], [ref], "reinforce_plus_plus", 0.5, "k1", False)[0]
    assert adv[0] == pytest.approx(-1.7161, abs=1e-9)
    assert adv == pytest.approx([-1.7161, -1.3661, -1.3661, -1.3661], abs=1e-9)
    leaked = -1.0 - 0.5 * sum(o - r for o, r in zip(old, ref))  # every token's KL, masked ones too
    assert leaked == pytest.approx(-1.6837, abs=1e-9) and adv[0] != pytest.approx(leaked)


def test_reinforce_plus_plus_baseline_subtracts_kl_per_token_from_the_group_centred_reward():
    base = compute_advantages([1.0, 0.0], 2, "reinforce_plus_plus_baseline")  # [0.5, -0.5]
    adv = token_advantages(base, [MASK, MASK], [OLD, OLD], [REF, REF], "reinforce_plus_plus_baseline", 0.1, "k1",
                           False)
    assert adv[0] == pytest.approx([0.45, 0.5, 0.55]) and adv[1] == pytest.approx([-0.55, -0.5, -0.45])


def test_normalize_advantages_whitens_over_loss_tokens_with_unbiased_variance():
    # tokens [1, 1, 3] (a masked fourth is ignored): mean 5/3, unbiased var 4/3
    adv = token_advantages([1.0, 3.0], [[1, 1], [1, 0]], None, None, "grpo", 0.0, "k1", True)
    scale = 1 / math.sqrt(4 / 3 + 1e-8)
    assert adv[0] == pytest.approx([(1 - 5 / 3) * scale] * 2)
    assert adv[1][0] == pytest.approx((3 - 5 / 3) * scale)


def test_whitening_statistics_add_up_over_ranks():
    """Two ranks whiten with the rollout's statistics, not their own."""
    from slime.training.advantages import whiten_stats

    shards = [([1.0], [[1, 1]]), ([3.0], [[1, 0]])]
    total = [a + b for a, b in zip(*(whiten_stats([[x] * len(m[0])], m) for (x,), m in shards))]
    got = [token_advantages(a, m, None, None, "grpo", 0.0, "k1", True, lambda _s: total) for a, m in shards]
    whole = token_advantages([1.0, 3.0], [[1, 1], [1, 0]], None, None, "grpo", 0.0, "k1", True)
    assert got[0][0] == pytest.approx(whole[0]) and got[1][0] == pytest.approx(whole[1])


@pytest.mark.parametrize("kl_type", ["k1", "k2", "k3", "low_var_kl"])
def test_kl_in_the_reward_uses_the_same_estimator_as_the_kl_loss(kl_type):
    from slime.training.loss import kl_penalty

    for d in (-25.0, -0.7, 0.0, 0.3, 2.0):
        assert kl_value(d, kl_type) == pytest.approx(kl_penalty(torch.tensor(d), torch.tensor(0.0), kl_type).item())


def test_ppo_on_a_backend_without_a_critic_and_kl_coef_with_group_estimators_are_refused():
    from slime.args import parse_args, validate

    base = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "1", "--rm-type", "math"]
    assert has(validate(parse_args([*base, "--advantage-estimator", "ppo", "--train-backend", "megatron"])),
               "megatron.ppo_critic")
    assert "ppo" not in " ".join(validate(parse_args([*base, "--advantage-estimator", "ppo"])))
    assert has(validate(parse_args([*base, "--kl-coef", "0.1"])), "args.kl_coef_group", kl_coef=0.1, estimator="grpo")
    assert has(validate(parse_args([*base, "--advantage-estimator", "reinforce_plus_plus", "--kl-coef", "0.1"])),
               "args.kl_coef_ref")
    cfg = parse_args([*base, "--advantage-estimator", "reinforce_plus_plus", "--kl-coef", "0.1", "--use-kl-loss",
                      "--kl-loss-coef", "0.01", "--normalize-advantages"])
    assert cfg.loss.kl_coef == 0.1 and cfg.loss.use_kl_loss and cfg.loss.normalize_advantages and cfg.loss.needs_ref


def test_embedded_trainer_shapes_advantages_with_kl_to_the_reference_and_whitens(tiny):
    """Wiring: the trainer's own old / reference log-probs feed token_advantages before the step."""
    from slime.backends.embedded.trainer import EmbeddedTrainer
    from slime.config import BatchConfig, OptimConfig
    from slime.data.train_data import TrainRecord

    torch.set_num_threads(1)
    loss = RuntimeLoss(advantage_estimator="reinforce_plus_plus", kl_coef=0.1, kl_loss_type="k1",
                       normalize_advantages=True)
    base = EmbeddedTrainer(str(tiny["model"]), None, None, OptimConfig(lr=1e-3), RuntimeLoss(), BatchConfig())
    ref = {k: v + 0.05 * torch.randn_like(v, generator=torch.Generator().manual_seed(0)) if v.is_floating_point()
           else v for k, v in base.named_weights().items()}
    tr = EmbeddedTrainer(str(tiny["model"]), None, ref, OptimConfig(lr=0.0), loss, BatchConfig(micro_batch_size=2))
    recs = [TrainRecord([4, 5, 6, 7, 8][: 3 + i % 3], 2, float(i % 2), [-1.0] * (1 + i % 3), [1] * (1 + i % 3))
            for i in range(4)]
    old = tr.log_probs(recs)
    ref_lp = tr.log_probs(recs, use_ref=True)
    tr.train(recs, 1)
    want = token_advantages([float(i % 2) for i in range(4)], [r.response_mask for r in recs], old, ref_lp,
                            "reinforce_plus_plus", 0.1, "k1", True)
    for r, w in zip(recs, want):
        assert r.token_advantages == pytest.approx(w, abs=1e-5)
    flat = [a for r in recs for a in r.token_advantages]
    assert sum(flat) == pytest.approx(0.0, abs=1e-5) and any(abs(o - f) > 1e-4 for o, f in zip(old[0], ref_lp[0]))
