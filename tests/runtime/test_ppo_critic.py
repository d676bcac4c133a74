"""PPO with a critic: GAE and the clipped value loss on hand-computed numbers, the embedded critic
learning and round-tripping through its checkpoint, the capability verdicts, and a short real run
through the registry on local Ray."""

from __future__ import annotations

import json

import pytest
import torch

from slime.args import parse_args, validate
from slime.training.advantages import gae, ppo_targets, ppo_token_rewards
from slime.training.loss import value_loss
from tests.refusal_codes import codes, has, raised

BASE = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "1", "--rm-type", "math"]
VALUES = [0.5, 0.6, 0.7]  # the critic's values of a 3-token response
REWARDS = [0.0, 0.0, 1.0]  # the sequence reward arrives with the last token


def test_gae_with_gamma_and_lambda_one_is_the_return_minus_the_value():
    adv, ret = gae(REWARDS, VALUES, [1, 1, 1], gamma=1.0, lambd=1.0)
    # deltas 0.1, 0.1, 0.3 summed backwards; every return is the final reward 1
    assert adv == pytest.approx([0.5, 0.4, 0.3]) and ret == pytest.approx([1.0, 1.0, 1.0])


def test_gae_with_lambda_below_one_discounts_later_deltas():
    adv, ret = gae(REWARDS, VALUES, [1, 1, 1], gamma=1.0, lambd=0.95)
    # A2 = 0.3; A1 = 0.1 + 0.95 * 0.3 = 0.385; A0 = 0.1 + 0.95 * 0.385 = 0.46575
    assert adv == pytest.approx([0.46575, 0.385, 0.3]) and ret == pytest.approx([0.96575, 0.985, 1.0])


def test_gae_with_gamma_below_one_discounts_the_bootstrapped_value():
    adv, ret = gae(REWARDS, VALUES, [1, 1, 1], gamma=0.9, lambd=0.95)
    # deltas: 1 - 0.7 = 0.3; 0.9 * 0.7 - 0.6 = 0.03; 0.9 * 0.6 - 0.5 = 0.04; gamma * lambd = 0.855
    a1 = 0.03 + 0.855 * 0.3
    a0 = 0.04 + 0.855 * a1
    assert adv == pytest.approx([a0, a1, 0.3]) and ret == pytest.approx([a0 + 0.5, a1 + 0.6, 1.0])
    assert a0 == pytest.approx(0.2849575)


def test_gae_skips_tokens_the_policy_did_not_generate():
    adv, ret = gae(REWARDS, VALUES, [1, 0, 1], gamma=1.0, lambd=1.0)
    # token 0 bootstraps from token 2's value: delta0 = 0.7 - 0.5; the tool token gets nothing
    assert adv == pytest.approx([0.5, 0.0, 0.3]) and ret == pytest.approx([1.0, 0.0, 1.0])


def test_kl_in_the_reward_is_charged_per_generated_token_and_the_reward_at_the_last():
    old, ref = [-1.0, -2.0, -0.5], [-1.2, -1.9, -0.8]  # k1 = old - ref = 0.2, -0.1, 0.3
    assert ppo_token_rewards(1.0, [1, 1, 1], old, ref, 0.1, "k1") == pytest.approx([-0.02, 0.01, 0.97])
    assert ppo_token_rewards(1.0, [1, 1, 0], old, ref, 0.1, "k1") == pytest.approx([-0.02, 1.01, 0.0])
    assert ppo_token_rewards(1.0, [0, 0, 0], old, ref, 0.1, "k1") == [0.0, 0.0, 0.0]  # no loss token, no reward
    with pytest.raises(ValueError, match="--ref-load"):
        ppo_token_rewards(1.0, [1, 1, 1], None, None, 0.1, "k1")


def test_ppo_targets_whiten_the_advantages_and_never_the_returns():
    rewards, masks, values = [1.0, 0.0], [[1, 1], [1, 1]], [[0.2, 0.4], [0.1, 0.3]]
    raw, ret = ppo_targets(rewards, masks, values, None, None, 0.0, "k1", 1.0, 1.0, normalize=False)
    white, ret2 = ppo_targets(rewards, masks, values, None, None, 0.0, "k1", 1.0, 1.0, normalize=True)
    assert [pytest.approx(row) for row in raw] == [[0.8, 0.6], [-0.1, -0.3]]
    assert ret == ret2 and [pytest.approx(row) for row in ret] == [[1.0, 1.0], [0.0, 0.0]]
    flat = [a for row in white for a in row]
    assert sum(flat) == pytest.approx(0.0, abs=1e-9)
    assert sum(a * a for a in flat) / 3 == pytest.approx(1.0, abs=1e-6)  # unbiased variance 1


def test_value_loss_takes_the_larger_of_the_clipped_and_unclipped_error():
    values = torch.tensor([[1.5, 0.1, 0.5]], requires_grad=True)
    old, returns = torch.tensor([[1.0, 0.0, 1.0]]), torch.tensor([[2.0, 1.0, 2.0]])
    loss, m = value_loss(values, old, returns, torch.ones(1, 3), value_clip=0.2)
    # token 0: V moved +0.5, clipped to 1.2: 0.5 * max(0.25, 0.64) = 0.32, and no gradient (clip taken)
    # token 1: inside the clip: 0.5 * 0.81 = 0.405; token 2: moved away, unclipped is larger: 0.5 * 2.25
    assert loss.item() == pytest.approx((0.32 + 0.405 + 1.125) / 3)
    assert m["value_clipfrac"] == pytest.approx(1 / 3) and m["values"] == pytest.approx(0.7)
    loss.backward()
    assert values.grad.tolist()[0] == pytest.approx([0.0, (0.1 - 1.0) / 3, (0.5 - 2.0) / 3])
    plain, _ = value_loss(values, old, returns, torch.ones(1, 3), value_clip=None)
    assert plain.item() == pytest.approx((0.125 + 0.405 + 1.125) / 3)


def test_the_megatron_backend_refuses_ppo_with_its_reason_and_the_embedded_one_runs_it():
    from slime.backends.registry import TRAIN_BACKENDS, capability_errors

    for name, backend in TRAIN_BACKENDS.items():
        errors = capability_errors(parse_args([*BASE, "--advantage-estimator", "ppo", "--train-backend", name]))
        if backend.critic is None:  # every backend without a critic says so, with its own code
            assert f"{name}.ppo_critic" in codes(errors), name
        else:
            assert "ppo" not in " ".join(errors), name
    assert TRAIN_BACKENDS["megatron"].critic is None and TRAIN_BACKENDS["embedded"].critic


def test_ppo_flags_are_read_with_ppo_and_refused_without_it():
    cfg = parse_args([*BASE, "--advantage-estimator", "ppo", "--gamma", "0.99", "--lambd", "0.95", "--value-clip",
                      "0.5", "--critic-lr", "2e-6", "--critic-save", "/c", "--save", "/s"])
    assert (cfg.loss.gamma, cfg.loss.lambd, cfg.loss.value_clip, cfg.critic.lr, cfg.critic.save) == \
        (0.99, 0.95, 0.5, 2e-6, "/c")
    assert not [e for e in validate(cfg) if "gamma" in e or "critic" in e]
    assert has(validate(parse_args([*BASE, "--gamma", "0.9", "--critic-lr", "1e-5"])), "args.critic_flags_unused",
               flags="--gamma, --critic-lr")
    errors = validate(parse_args([*BASE, "--advantage-estimator", "ppo", "--lambd", "1.5", "--value-clip", "0"]))
    assert has(errors, "args.gae_range", lambd=1.5) and has(errors, "args.value_clip", value_clip=0.0)


# -- the embedded critic ------------------------------------------------------------------------


def _critic(tiny, out, *extra):
    from slime.backends.embedded.critic import EmbeddedCritic

    cfg = parse_args(["--hf-checkpoint", str(tiny["model"]), "--ref-load", str(tiny["ref"]), *BASE,
                      "--advantage-estimator", "ppo", "--micro-batch-size", "2", "--critic-lr", "3e-3", *extra])
    return EmbeddedCritic.build(cfg, 0, 1, ("127.0.0.1", 0))


def _records():
    from slime.data.train_data import TrainRecord

    # distinct prompts, so every state has one target and the critic can fit them all
    return [TrainRecord([4 + i, 9 - i, 6, 7, 8][: 3 + i % 3], 2, float(i % 2), [-1.0] * (1 + i % 3),
                        [1] * (1 + i % 3)) for i in range(4)]


def _set_targets(critic, recs):
    """What the runtime does each rollout: the critic's values, then GAE toward the rewards."""
    values = critic.values(recs)
    _, returns = ppo_targets([r.advantage for r in recs], [r.response_mask for r in recs], values, None, None,
                             0.0, "k1", 1.0, 0.95, False)
    for r, v, g in zip(recs, values, returns):
        r.values, r.returns = v, g


def test_a_fresh_critic_predicts_zero_and_its_value_loss_falls_on_a_fixed_batch(tiny, tmp_path):
    torch.set_num_threads(1)
    critic = _critic(tiny, tmp_path)
    recs = _records()
    assert all(v == 0.0 for row in critic.values(recs) for v in row)
    losses = []
    for _ in range(6):
        _set_targets(critic, recs)
        losses.append(critic.train(recs, 2)["critic/value_loss"])
    print(f"critic value loss over 6 rollouts: {[round(x, 4) for x in losses]}")
    assert losses[-1] < 0.5 * losses[0], losses  # Adam at this LR wobbles on the way down; the trend is the claim


def test_the_critics_step_does_not_depend_on_micro_batching(tiny, tmp_path):
    """The critic aggregates like the policy: 1 or 4 micro-batches give the same loss and update."""
    torch.set_num_threads(1)
    got = []
    for mbs in ("4", "1"):
        critic = _critic(tiny, tmp_path, "--micro-batch-size", mbs)
        recs = _records()
        _set_targets(critic, recs)
        for r in recs:  # a target the zero head misses by a different amount per token
            r.returns = [g + 0.1 * k for k, g in enumerate(r.returns)]
        loss = critic.train(recs, 1)["critic/value_loss"]
        got.append((loss, critic.named_weights()))
    (one, w1), (four, w4) = got
    assert one == pytest.approx(four, rel=1e-6)
    assert all(torch.allclose(w1[k], w4[k], atol=1e-6) for k in w1)


def _critic_rank(rank: int, world: int, port: int, tiny: dict, out, queue) -> None:
    """One critic rank in its own process (gloo), one step over the records; reports its result."""
    from slime.backends.embedded.critic import EmbeddedCritic

    torch.set_num_threads(1)
    cfg = parse_args(["--hf-checkpoint", str(tiny["model"]), "--ref-load", str(tiny["ref"]), *BASE,
                      "--advantage-estimator", "ppo", "--micro-batch-size", "1", "--critic-lr", "3e-3"])
    critic = EmbeddedCritic.build(cfg, rank, world, ("127.0.0.1", port))
    recs = _records()
    _set_targets(critic, recs)
    for r in recs:
        r.returns = [g + 0.1 * k for k, g in enumerate(r.returns)]
    loss = critic.train(recs, 1)["critic/value_loss"]
    queue.put((rank, loss, critic.named_weights()["value_head.weight"].tolist()))  # plain data across processes


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_critic_ranks_take_the_step_one_rank_takes(tiny, tmp_path):
    """Data parallel critic ranks (DDP over gloo) split the step and end with one rank's update."""
    import multiprocessing
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_critic_rank, args=(r, 2, port, tiny, tmp_path, queue)) for r in range(2)]
    for proc in procs:
        proc.start()
    got = sorted(queue.get(timeout=240) for _ in procs)
    for proc in procs:
        proc.join(timeout=60)
    _critic_rank(0, 1, 0, tiny, tmp_path, queue)
    _, single_loss, single_w = queue.get(timeout=10)
    (_, loss0, w0), (_, loss1, w1) = got
    assert loss0 == loss1 == pytest.approx(single_loss, rel=1e-5)
    assert w0 == w1 and torch.allclose(torch.tensor(w0), torch.tensor(single_w), atol=1e-6)


def test_the_critic_checkpoint_round_trips_weights_and_optimizer_at_the_policys_iteration(tiny, tmp_path):
    from slime.checkpoint import CheckpointError, resolve_critic, save_checkpoint

    torch.set_num_threads(1)
    critic = _critic(tiny, tmp_path)
    recs = _records()
    _set_targets(critic, recs)
    critic.train(recs, 2)
    save = tmp_path / "ckpt"
    critic.save(f"{save}_critic", 3, {"next_rollout_id": 3})
    save_checkpoint(save, 3, {"w": torch.zeros(1)}, None, {"next_rollout_id": 3})  # the policy's, same iteration
    back = _critic(tiny, tmp_path, "--load", str(save))  # default: <--load>_critic
    assert back.values(recs) == critic.values(recs)
    assert back.steps_taken == critic.steps_taken == 2
    assert torch.equal(back.optimizer.state_dict()["state"][0]["exp_avg"],
                       critic.optimizer.state_dict()["state"][0]["exp_avg"])
    # a policy saved later than its critic: refused, never a silently fresh or mismatched critic
    save_checkpoint(save, 5, {"w": torch.zeros(1)}, None, {"next_rollout_id": 5})
    cfg = parse_args([*BASE, "--advantage-estimator", "ppo", "--load", str(save)])
    with pytest.raises(CheckpointError) as e:
        resolve_critic(cfg.model, cfg.critic)
    assert raised(e.value, "checkpoint.no_iteration", name="iter_0000005", iteration=5)


# -- the Ray loop -------------------------------------------------------------------------------

PPO_FLAGS = ("--advantage-estimator", "ppo", "--gamma", "1.0", "--lambd", "0.95", "--kl-coef", "0.01",
             "--critic-lr", "1e-3")


def _rows(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def ppo_run(tiny, ray_cluster, tmp_path_factory):
    """One rollout of ppo through train.py on local Ray (the registry's embedded trainer and critic), saved."""
    import train
    from tests.runtime.conftest import tiny_flags

    out = tmp_path_factory.mktemp("ppo")
    train.main(tiny_flags(tiny, out, "--num-rollout", "1", *PPO_FLAGS, "--save", str(out / "ckpt"),
                          "--save-interval", "1"))
    return out


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_tiny_ppo_run_trains_a_critic_beside_the_policy_and_saves_it(ppo_run):
    (row,) = _rows(ppo_run)
    print({k: round(v, 4) for k, v in row.items() if k.startswith(("critic/", "train/pg_loss", "perf/step_time"))})
    for key in ("critic/value_loss", "critic/value_clipfrac", "critic/returns_mean", "train/pg_loss", "train/ppo_kl"):
        assert key in row, key
    assert row["critic/values"] == 0.0 and row["critic/value_loss"] > 0  # a fresh critic: zero head
    assert abs(row["train/ppo_kl"]) < 1e-8  # the policy's first step starts at the old policy
    state = json.loads((ppo_run / "ckpt_critic" / "iter_0000001" / "state.json").read_text())
    assert state["role"] == "critic" and state["next_rollout_id"] == 1
    assert (ppo_run / "ckpt" / "iter_0000001" / "state.json").exists()


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_resuming_a_ppo_run_resumes_its_critic(tiny, ppo_run, tmp_path):
    import shutil

    import train
    from tests.runtime.conftest import tiny_flags

    for name in ("ckpt", "ckpt_critic"):
        shutil.copytree(ppo_run / name, tmp_path / name)
    train.main(tiny_flags(tiny, tmp_path, "--num-rollout", "2", *PPO_FLAGS, "--load", str(tmp_path / "ckpt"),
                          "--save", str(tmp_path / "ckpt"), "--save-interval", "1"))
    (row,) = _rows(tmp_path)
    print({k: round(v, 4) for k, v in row.items() if k.startswith(("critic/", "train/pg_loss"))})
    assert row["rollout_id"] == 1
    assert row["critic/values"] != 0.0  # the trained critic, not a fresh zero head
    assert (tmp_path / "ckpt_critic" / "iter_0000002" / "state.json").exists()
