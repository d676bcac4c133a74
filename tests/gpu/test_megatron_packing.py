"""The Megatron trainer's step loss and gradients do not depend on packing (GPU twin of
tests/runtime/test_loss_packing.py): the same 8 samples in 1, 2, 4 and 8 packed micro-batches, with
and without a sample that has no loss tokens, under both aggregations. Skips without a GPU.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

pytestmark = pytest.mark.gpu

N = 8


def _records(with_empty: bool):
    from slime.data.train_data import TrainRecord

    rng = random.Random(11)
    out = []
    for i in range(N):
        p, r = rng.randrange(3, 40), rng.randrange(1, 60)
        mask = [1] * r
        if with_empty and i == 5:
            mask = [0] * r
        out.append(TrainRecord([rng.randrange(2, 1000) for _ in range(p + r)], p, rng.uniform(-1.5, 1.5),
                               [rng.uniform(-8, -0.1) for _ in range(r)], mask))
    return out


@pytest.fixture(scope="module")
def trainer(tiny):
    from slime.backends.megatron.model_args import load_flags
    from slime.backends.megatron.trainer import MegatronTrainer
    from slime.config import BatchConfig, LossConfig, ModelConfig, OptimConfig

    hf, spec = tiny
    return MegatronTrainer(load_flags(spec), ModelConfig(hf_checkpoint=str(hf)), OptimConfig(lr=1e-5),
                           LossConfig(eps_clip=0.2, eps_clip_high=0.28), BatchConfig())


def _grads_and_loss(tr, records, agg, micro_batch_size, olds, denom):
    import torch

    tr.fn_cfg = replace(tr.fn_cfg, agg=agg)
    tr.batch_cfg = replace(tr.batch_cfg, micro_batch_size=micro_batch_size)
    metrics = tr.accumulate_grads(records, denom, olds, None)
    grads = torch.cat([p.main_grad.float().reshape(-1) for p in tr.model.parameters()])
    return sum(m["train/loss"] for m in metrics), grads.clone()


@pytest.mark.parametrize("agg", ["sample_mean", "token_mean"])
@pytest.mark.parametrize("with_empty", [False, True])
def test_megatron_step_is_the_same_for_1_2_4_8_micro_batches(trainer, agg, with_empty):
    from slime.training.loss import step_denominator

    records = _records(with_empty)
    # One set of old log-probs for every packing (shifted so ratios leave 1 and some clip).
    olds = {id(r): [x - 0.2 for x in lp] for r, lp in zip(records, trainer.log_probs(records))}
    denom = step_denominator([r.response_mask for r in records], agg)
    base_loss, base_g = _grads_and_loss(trainer, records, agg, N, olds, denom)
    assert base_g.norm() > 0
    for size in (4, 2, 1):
        loss, g = _grads_and_loss(trainer, records, agg, size, olds, denom)
        assert loss == pytest.approx(base_loss, rel=2e-3, abs=1e-5), size
        assert ((g - base_g).norm() / base_g.norm()).item() < 2e-2, size
