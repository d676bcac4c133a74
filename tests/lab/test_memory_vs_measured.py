"""The lab's memory estimate against the peaks measured on the H200 (bench/data/memory_measured.json,
copied from docs/benchmarks.md): the goal of issue 12 is within 15 %. The estimate is computed
from the model spec and the layout (lab/rules/memory_model.py); only the measured side is recorded."""
from __future__ import annotations

import pytest

from bench.compare_memory import GOAL, compare, measured_rows
from lab.rules.dependents import new_experiment
from lab.rules.memory import estimate_memory
from lab.rules.memory_model import GIB, TrainLayout, embedded_engine_parts, training_parts
from slime.model_spec import spec_from_flags

ROWS = measured_rows()
# Known misses, each with its reason: a row listed here must still miss (strict xfail), so the
# entry goes once the estimate reaches it.
KNOWN_MISSES = {
    "tiny-gpu recipe, training phase": "fixed per-process allocations the model does not name dominate a "
                                       "100k-parameter model (0.13 GiB measured, weights + activations ≈ 0.03)",
    "tiny-gpu recipe, rollout phase (embedded engine)": "about 1 GiB allocated by the engine process that weights, "
                                                       "KV slots and a prefill chunk do not explain (they are < 0.1 GiB); "
                                                       "needs a torch.cuda.memory_snapshot() of the engine on the H200",
}


def _marks(row):
    reason = KNOWN_MISSES.get(row["name"])
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []


@pytest.mark.parametrize("row", [pytest.param(r, id=r["name"], marks=_marks(r)) for r in ROWS])
def test_the_estimate_is_within_15_percent_of_the_measured_peak(row):
    (got,) = compare([row])
    assert abs(got["error"]) <= GOAL, got


def test_every_measured_row_names_the_run_it_comes_from():
    assert len(ROWS) >= 5
    for row in ROWS:
        assert "docs/benchmarks.md" in row["source"] and row["measured_gib"] > 0


def test_the_bench_comparison_uses_the_same_arithmetic_as_the_lab():
    """The lab's training phase for a recipe is training_parts over its spec and layout."""
    from lab.rules.derive import recipe_and_spec

    exp = new_experiment("glm4-9b")
    _, spec = recipe_and_spec(exp)
    r = exp.resources
    dp = max(exp.placement.train_gpus // (r.tp * r.pp), 1)  # the distributed optimizer shards over DP×CP
    parts = training_parts(spec, TrainLayout(tokens=r.max_tokens_per_gpu, tp=r.tp, pp=r.pp, ep=r.ep, dp=dp,
                                             edp=max(exp.placement.train_gpus // (r.ep * r.pp), 1),
                                             recompute=r.recompute, cpu_adam=r.cpu_adam))
    assert estimate_memory(exp).training.total_gib == pytest.approx(sum(parts.values()) / GIB, abs=0.05)


def test_logits_grow_with_the_vocabulary_and_the_rows_the_loss_reads():
    from bench.bench_megatron import flags_for

    spec = spec_from_flags(flags_for("qwen2.5-1.5b"))
    some = training_parts(spec, TrainLayout(tokens=8192, logit_rows=2048))["logits"]
    every = training_parts(spec, TrainLayout(tokens=8192))["logits"]
    assert every > some > 8192 * spec.vocab * 2  # at least the bf16 logits of every token


def test_an_embedded_engine_is_estimated_from_what_it_serves_not_a_static_fraction():
    m = estimate_memory(new_experiment("tiny-gpu"))
    assert m.rollout.total_gib < 1.0  # SGLang's static fraction would be 0.5 x 80 GiB
    assert any(k.startswith("KV slots (256 requests") for k in m.rollout.items_gib)
    spec = spec_from_flags({"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4,
                            "group_query_attention": True, "num_query_groups": 2, "kv_channels": 16, "vocab_size": 14})
    small, large = embedded_engine_parts(spec, 100, 300), embedded_engine_parts(spec, 200, 300)
    # 100 and 200 rows take 128 and 256 slots; 300 tokens take 512 positions
    assert small["kv_cache"] == 128 * 512 * 2 * 2 * 16 * 2 * 2 and large["kv_cache"] == 2 * small["kv_cache"]


def test_an_sglang_engine_keeps_the_static_fraction():
    exp = new_experiment("glm4-9b")
    m = estimate_memory(exp)
    assert m.rollout.total_gib == pytest.approx(exp.serving.mem_fraction_static * m.gpu_memory_gib, abs=0.01)
