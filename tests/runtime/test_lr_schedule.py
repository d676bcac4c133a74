"""The LR schedule flags (Megatron's names) as the embedded trainer runs them: hand-computed values."""

from __future__ import annotations

import math

import pytest

from slime.config import OptimConfig
from slime.training.lr_schedule import LRSchedule, from_optim
from tests.refusal_codes import has


def test_linear_warmup_then_linear_decay_to_min_lr():
    s = LRSchedule(lr=1.0, min_lr=0.1, warmup_steps=2, decay_steps=6, style="linear")
    assert [round(s(k), 6) for k in range(8)] == [0.0, 0.5, 1.0, 0.775, 0.55, 0.325, 0.1, 0.1]


def test_cosine_decay_is_half_a_cosine():
    s = LRSchedule(lr=1.0, min_lr=0.1, warmup_steps=2, decay_steps=6, style="cosine")
    assert s(3) == pytest.approx(0.1 + 0.9 * 0.5 * (math.cos(math.pi / 4) + 1))
    assert s(4) == pytest.approx(0.55) and s(6) == pytest.approx(0.1) and s(9) == pytest.approx(0.1)


def test_constant_keeps_lr_after_warmup_and_inverse_square_root_decays():
    assert [LRSchedule(lr=2.0, warmup_steps=4)(k) for k in (0, 2, 4, 100)] == [0.0, 1.0, 2.0, 2.0]
    s = LRSchedule(lr=1.0, min_lr=0.01, warmup_steps=4, decay_steps=10**6, style="inverse-square-root")
    assert s(16) == pytest.approx(0.5) and s(10**5) == pytest.approx(max(0.01, 2 / math.sqrt(10**5)))


def test_flags_map_to_the_schedule_decay_defaults_to_the_whole_run():
    o = OptimConfig(lr=1e-3, min_lr=1e-5, lr_warmup_fraction=0.1, lr_decay_style="cosine", total_steps=300)
    s = from_optim(o)
    assert (s.warmup_steps, s.decay_steps, s.style, s.min_lr) == (30, 300, "cosine", 1e-5)
    assert from_optim(OptimConfig(lr=1e-3, lr_warmup_iters=5, lr_decay_iters=50)).decay_steps == 50


def test_unknown_decay_style_and_double_warmup_are_refused():
    from slime.args import parse_args, validate

    base = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "1", "--rm-type", "math"]
    errors = validate(parse_args([*base, "--lr-decay-style", "WSD", "--lr-warmup-iters", "3",
                                  "--lr-warmup-fraction", "0.1"]))
    assert has(errors, "args.lr_decay_style", style="WSD") and has(errors, "args.warmup_both")


def test_embedded_trainer_steps_with_the_scheduled_lr_and_resumes_it(tiny):
    torch = pytest.importorskip("torch")
    from slime.backends.embedded.trainer import EmbeddedTrainer
    from slime.config import BatchConfig, LossConfig
    from slime.data.train_data import TrainRecord

    torch.set_num_threads(1)
    optim = OptimConfig(lr=1e-3, lr_warmup_iters=2, lr_decay_style="linear", total_steps=4)
    tr = EmbeddedTrainer(str(tiny["model"]), None, None, optim, LossConfig(), BatchConfig())
    recs = [TrainRecord([4, 5, 6, 7], 2, 1.0 if i % 2 else -1.0, [-1.0, -1.0], [1, 1]) for i in range(2)]
    lrs = [tr.train(recs, 1)["train/lr"] for _ in range(4)]
    assert lrs == pytest.approx([0.0, 5e-4, 1e-3, 5e-4])
    again = EmbeddedTrainer(str(tiny["model"]), None, None, optim, LossConfig(), BatchConfig())
    again.optimizer.load_state_dict(tr.optimizer.state_dict())
    again.resume_lr_schedule()
    assert again.steps_taken == 4
