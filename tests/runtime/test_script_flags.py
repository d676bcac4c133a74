"""Flags real slime launch scripts carry: --balance-data gives each data-parallel rank the same number
of samples of a step with token totals as even as the longest-first split makes them (the plain split
takes consecutive slices); --attention-backend is read (flash, auto) or refused with the reason."""
from __future__ import annotations

import random

from slime.args import parse_args
from slime.data.train_data import TrainRecord, balanced_partition, rank_shard
from tests.refusal_codes import codes, with_code


def _records(lengths: list[int]) -> list[TrainRecord]:
    return [TrainRecord(list(range(n)), 1, 0.0, [0.0] * n, [1] * n, reward=0.0, group=i)
            for i, n in enumerate(lengths)]


def test_balance_data_is_read_into_the_batch_config():
    assert parse_args(["--balance-data"]).batch.balance_data is True
    assert parse_args([]).batch.balance_data is False


def test_balance_data_gives_every_rank_the_same_count_and_near_equal_tokens():
    rng = random.Random(0)
    lengths = sorted((rng.randint(50, 8000) for _ in range(64)), reverse=True)  # long answers first, as sorted
    step = _records(lengths)
    world = 4
    plain = [sum(len(r.tokens) for r in rank_shard(step, k, world)) for k in range(world)]
    balanced = [rank_shard(step, k, world, balance=True) for k in range(world)]
    tokens = [sum(len(r.tokens) for r in shard) for shard in balanced]
    assert [len(s) for s in balanced] == [16] * world
    assert sorted(r.group for s in balanced for r in s) == list(range(64))  # each sample exactly once
    assert max(tokens) - min(tokens) <= max(lengths)  # within one sample of even
    assert max(tokens) - min(tokens) < (max(plain) - min(plain)) / 10


def test_balanced_partition_is_the_same_on_every_rank_and_leaves_the_remainder_as_the_plain_split():
    lengths = [5, 9, 1, 7, 3, 3, 8]
    groups = balanced_partition(lengths, 3)
    assert groups == balanced_partition(list(lengths), 3)
    assert [len(g) for g in groups] == [2, 2, 2] and 6 not in {i for g in groups for i in g}


def test_attention_backend_flash_is_read_and_another_backend_is_refused_with_the_reason():
    from slime.args import validate

    base = ["--train-backend", "megatron", "--num-rollout", "1", "--rollout-batch-size", "2"]
    assert "script_flags.attention_backend" not in codes(validate(parse_args(base + ["--attention-backend", "flash"]),
                                                                  environment=False))
    errors = with_code(validate(parse_args(base + ["--attention-backend", "fused"]), environment=False),
                       "script_flags.attention_backend", value="fused")
    assert len(errors) == 1


def test_the_dropout_a_launch_script_sets_reaches_the_transformer_config_and_softmax_stays_fp32():
    from slime.backends.megatron.model_args import transformer_config_kwargs
    from slime.model_spec import flags_from_argv

    spec = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--swiglu",
            "--normalization", "RMSNorm", "--vocab-size", "128"]
    kw = transformer_config_kwargs(flags_from_argv(spec + ["--attention-dropout", "0.1", "--hidden-dropout", "0.05",
                                                           "--attention-softmax-in-fp32"]))
    assert kw["attention_dropout"] == 0.1 and kw["hidden_dropout"] == 0.05
    assert kw["attention_softmax_in_fp32"] is True


def test_the_no_fusion_switches_of_a_spec_are_read_as_what_the_backend_does():
    from slime.backends.megatron.model_args import transformer_config_kwargs
    from slime.model_spec import flags_from_argv

    cfg = parse_args(["--train-backend", "megatron", "--no-masked-softmax-fusion", "--no-rope-fusion"])
    assert cfg.megatron["no_masked_softmax_fusion"] is True and cfg.megatron["no_rope_fusion"] is True
    kw = transformer_config_kwargs(flags_from_argv(["--num-layers", "2", "--hidden-size", "64",
                                                    "--num-attention-heads", "4", "--no-rope-fusion"]))
    assert kw["masked_softmax_fusion"] is False and kw["apply_rope_fusion"] is False
