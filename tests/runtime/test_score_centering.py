"""--use-sc: score centering (centred importance-weighted rewards) trained with plain REINFORCE.

The numbers are worked by hand from the definition in docs/en/corrections.md (SC section):
``w_i = min(exp(sum_t (log pi_old - log pi_rollout)), --tis-clip)``, ``s_i = w_i r_i``,
``A_i = s_i - mean_group(s)``.
"""
from __future__ import annotations

import math

import pytest

from slime.args import parse_args, validate
from slime.training.advantages import sc_advantages

BASE = ["--num-rollout", "1", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rm-type", "math",
        "--prompt-data", "p.jsonl", "--hf-checkpoint", "hf", "--actor-num-gpus-per-node", "1"]


def test_sc_advantage_is_the_truncated_ratio_times_reward_minus_its_group_mean():
    # group 0: log-ratios ln2 (over two tokens: ln2 - 0 + 0) and 0 -> w = 2, 1; rewards 1, 0 -> s = 2, 0
    # group 1: log-ratio ln10 truncated at C = 3 and ln0.5 -> w = 3, 0.5; rewards 1, 1 -> s = 3, 0.5
    olds = [[math.log(2.0), -1.0], [-0.5], [math.log(10.0)], [math.log(0.5)]]
    rollouts = [[0.0, -1.0], [-0.5], [0.0], [0.0]]
    masks = [[1, 1], [1], [1], [1]]
    adv = sc_advantages([1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1], 2, masks, olds, rollouts, clip=3.0)
    assert adv == pytest.approx([1.0, -1.0, 1.25, -1.25])


def test_sc_ratio_counts_loss_tokens_only():
    # the masked token's log-ratio (ln 100) is left out: w = 1, s = 1 and 0.5 * 1 -> A = +-0.25
    adv = sc_advantages([1.0, 0.5], [0, 0], 1, [[1, 0], [1]], [[0.0, math.log(100.0)], [0.0]], [[0.0, 0.0], [0.0]],
                        clip=2.0)
    assert adv == pytest.approx([0.25, -0.25])


def test_sc_group_means_add_up_over_ranks():
    """Two ranks holding one sample of the same group each get the mean of both."""
    olds, rollouts, masks = [[math.log(2.0)], [0.0]], [[0.0], [0.0]], [[1], [1]]
    whole = sc_advantages([1.0, 1.0], [0, 0], 1, masks, olds, rollouts, clip=5.0)
    parts = [sc_advantages([1.0], [0], 1, [masks[i]], [olds[i]], [rollouts[i]], 5.0) for i in range(2)]
    assert parts == [[0.0], [0.0]]  # without the reduction each rank would centre on itself
    local = [[2.0, 1.0], [1.0, 1.0]]  # each rank's [sum of s, count]
    total = [local[0][0] + local[1][0], local[0][1] + local[1][1]]
    split = [sc_advantages([1.0], [0], 1, [masks[i]], [olds[i]], [rollouts[i]], 5.0, lambda _s: total)[0]
             for i in range(2)]
    assert whole == pytest.approx([0.5, -0.5])  # s = 2, 1: mean 1.5
    assert split == pytest.approx(whole)


def test_use_sc_selects_plain_reinforce_and_is_read_by_the_loss():
    pytest.importorskip("torch")
    from slime.training.loss import from_runtime

    cfg = parse_args([*BASE, "--use-sc", "--tis-clip", "3"])
    assert cfg.loss.use_sc and validate(cfg, environment=False) == []
    assert from_runtime(cfg.loss).policy_loss == "reinforce"
    assert from_runtime(parse_args(BASE).loss).policy_loss == "ppo"


@pytest.mark.parametrize(("extra", "code"), [
    (["--use-tis"], "args.sc_ratio"), (["--use-icepop"], "args.sc_ratio"),
    (["--advantage-estimator", "gspo"], "args.sc_estimator"), (["--tis-clip", "0"], "args.sc_clip"),
])
def test_use_sc_refuses_what_would_weigh_the_ratio_twice_or_replace_another_loss(extra, code):
    problems = validate(parse_args([*BASE, "--use-sc", *extra]), environment=False)
    assert [p.code for p in problems] == [code], problems


def test_embedded_trainer_trains_sc_advantages_from_its_own_old_log_probs(tiny):
    torch = pytest.importorskip("torch")
    from slime.backends.embedded.trainer import EmbeddedTrainer
    from slime.config import BatchConfig, LossConfig, OptimConfig
    from slime.data.train_data import TrainRecord

    torch.set_num_threads(1)
    tr = EmbeddedTrainer(str(tiny["model"]), None, None, OptimConfig(lr=0.0), LossConfig(use_sc=True, tis_clip=2.0),
                         BatchConfig(micro_batch_size=2))
    recs = [TrainRecord([4, 5, 6, 7][: 3 + i % 2], 2, 99.0, [-1.0] * (1 + i % 2), [1] * (1 + i % 2),
                        reward=float(i % 2), group=i // 2) for i in range(4)]
    old = tr.log_probs(recs)
    metrics = tr.train(recs, 1)
    w = [min(math.exp(sum(o) - sum(r.rollout_log_probs)), 2.0) for o, r in zip(old, recs)]
    s = [wi * r.reward for wi, r in zip(w, recs)]
    want = [s[i] - (s[2 * (i // 2)] + s[2 * (i // 2) + 1]) / 2 for i in range(4)]
    assert [r.advantage for r in recs] == pytest.approx(want, abs=1e-5)
    assert metrics["train/pg_clipfrac"] == 0.0  # REINFORCE: no ratio clipping


def test_records_carry_the_reward_and_group_sc_needs():
    from slime.data.sample import Sample
    from slime.data.train_data import build_records

    s = [Sample(i, i // 2, "p", [5, 6], reward=float(i), response_tokens=[7], rollout_log_probs=[-1.0])
         for i in range(4)]
    recs = build_records(s, 2, 2, "grpo", True, True)
    assert [(r.reward, r.group) for r in recs] == [(0.0, 0), (1.0, 0), (2.0, 1), (3.0, 1)]
