"""One step's loss and gradients do not depend on how its samples are packed (embedded trainer, CPU).

The same 8 samples go through 1, 2, 4 and 8 micro-batches and token-capped packs, with and without
a sample that has no loss tokens, under both aggregations; two half-shards (the data-parallel
split) add up to the whole. The Megatron twin of this test is tests/gpu/test_megatron_packing.py.
"""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from slime.config import BatchConfig, LossConfig, OptimConfig  # noqa: E402
from slime.data.train_data import TrainRecord, micro_batches  # noqa: E402
from slime.training.loss import step_denominator  # noqa: E402

N = 8


def _records(with_empty: bool) -> list[TrainRecord]:
    rng = random.Random(7)
    out = []
    for i in range(N):
        p, r = rng.randrange(2, 6), rng.randrange(1, 7)
        toks = [rng.randrange(4, 14) for _ in range(p + r)]
        mask = [1] * r
        if i == 3 and r > 2:
            mask[1] = 0  # a tool-output token inside the response
        if with_empty and i == 5:
            mask = [0] * r  # removed sample: no loss tokens
        out.append(TrainRecord(toks, p, rng.uniform(-1.5, 1.5), [rng.uniform(-3, -0.1) for _ in range(r)], mask))
    return out


@pytest.fixture(scope="module")
def trainer(tiny):
    from slime.backends.embedded.trainer import EmbeddedTrainer

    torch.set_num_threads(1)
    loss = LossConfig(use_kl_loss=False, entropy_coef=0.01, eps_clip=0.2, eps_clip_high=0.28)
    return EmbeddedTrainer(str(tiny["model"]), None, None, OptimConfig(lr=1e-3), loss, BatchConfig())


def _step(trainer, records, agg: str, mbs: list[list[TrainRecord]], denom: float):
    from dataclasses import replace

    trainer.fn_cfg = replace(trainer.fn_cfg, agg=agg)
    trainer.optimizer.zero_grad(set_to_none=True)
    # Old log-probs of the current weights plus a fixed per-token offset (a function of the sample
    # and the token, never of the packing), so ratios differ from 1 and some are clipped.
    olds = []
    for mb in mbs:
        old, ref = trainer._old(mb)
        shift = torch.zeros_like(old)
        for row, r in enumerate(mb):
            k = sum(r.tokens) % 97  # the sample's own key, not its position in a list
            lo, hi = r.prompt_len - 1, len(r.tokens) - 1
            shift[row, lo:hi] = 0.3 * torch.sin(torch.arange(hi - lo, dtype=old.dtype) * 1.7 + k)
        olds.append((old + shift, ref))
    metrics = trainer.accumulate_grads(mbs, olds, denom)
    grads = torch.cat([p.grad.reshape(-1) for p in trainer.module.parameters() if p.grad is not None])
    return metrics, grads.clone()


@pytest.mark.parametrize("agg", ["sample_mean", "token_mean"])
@pytest.mark.parametrize("with_empty", [False, True])
def test_loss_and_grads_are_the_same_for_1_2_4_8_micro_batches_and_packs(trainer, agg, with_empty):
    records = _records(with_empty)
    denom = step_denominator([r.response_mask for r in records], agg)
    results = {}
    for size in (8, 4, 2, 1):
        results[f"{N // size} micro-batches"] = _step(trainer, records, agg, micro_batches(records, size, None), denom)
    results["packs of <= 14 tokens"] = _step(trainer, records, agg, micro_batches(records, 1, 14), denom)
    base_m, base_g = results["1 micro-batches"]
    assert base_g.abs().sum() > 0
    for name, (m, g) in results.items():
        assert m["train/loss"] == pytest.approx(base_m["train/loss"], rel=1e-5, abs=1e-7), name
        assert m["train/pg_clipfrac"] == pytest.approx(base_m["train/pg_clipfrac"], rel=1e-5, abs=1e-7), name
        assert torch.allclose(g, base_g, rtol=1e-4, atol=1e-7), (name, (g - base_g).abs().max().item())


def test_data_parallel_halves_add_up_to_the_whole_step(trainer):
    records = _records(True)
    denom = step_denominator([r.response_mask for r in records], "sample_mean")
    whole_m, whole_g = _step(trainer, records, "sample_mean", micro_batches(records, 3, None), denom)
    m0, g0 = _step(trainer, records, "sample_mean", micro_batches(records[:4], 2, None), denom)
    m1, g1 = _step(trainer, records, "sample_mean", micro_batches(records[4:], 2, None), denom)
    assert m0["train/loss"] + m1["train/loss"] == pytest.approx(whole_m["train/loss"], rel=1e-5)
    assert torch.allclose(g0 + g1, whole_g, rtol=1e-4, atol=1e-7)


def test_empty_sample_contributes_zero_and_counts_in_the_sample_mean(trainer):
    """Sample 5 loses its loss tokens: the token mean is unchanged, the sample mean scales by 7/8."""
    full, empty = _records(False), _records(True)
    drop = [r for i, r in enumerate(full) if i != 5]
    mbs = lambda rs: micro_batches(rs, 4, None)  # noqa: E731
    m_empty, _ = _step(trainer, empty, "sample_mean", mbs(empty), step_denominator([r.response_mask for r in empty]))
    m_drop, _ = _step(trainer, drop, "sample_mean", mbs(drop), step_denominator([r.response_mask for r in drop]))
    assert m_empty["train/pg_loss"] == pytest.approx(m_drop["train/pg_loss"] * 7 / 8, rel=1e-5)
    t_empty, _ = _step(trainer, empty, "token_mean", mbs(empty),
                       step_denominator([r.response_mask for r in empty], "token_mean"))
    t_drop, _ = _step(trainer, drop, "token_mean", mbs(drop),
                      step_denominator([r.response_mask for r in drop], "token_mean"))
    assert t_empty["train/pg_loss"] == pytest.approx(t_drop["train/pg_loss"], rel=1e-5)
