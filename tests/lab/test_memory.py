"""Per-GPU memory estimate: phases, sharding, CPU Adam, stated exclusions."""
from __future__ import annotations

import pytest

from lab.core.recipes import all_recipes
from lab.rules.dependents import apply_change, new_experiment
from lab.rules.memory import estimate_memory


@pytest.mark.parametrize("name", list(all_recipes()))
def test_every_recipe_gets_an_estimate_with_stated_exclusions(name):
    m = estimate_memory(new_experiment(name))
    assert m.training.total_gib > 0 and m.rollout.total_gib >= 0
    joined = " ".join(m.exclusions)
    for word in ("CUDA context", "NCCL", "fragmentation"):
        assert word in joined


def test_cpu_adam_moves_the_optimizer_to_host():
    off = estimate_memory(new_experiment("glm4-9b"))
    on = estimate_memory(apply_change(new_experiment("glm4-9b"), "resources.cpu_adam", True)[0])
    key = next(k for k in off.training.items_gib if k.startswith("Adam"))
    assert off.training.items_gib[key] > 0 and on.training.items_gib[key] == 0
    assert on.host_optimizer_gib_per_gpu == pytest.approx(off.training.items_gib[key], rel=0.01)
    assert on.training.total_gib < off.training.total_gib


def test_optimizer_is_sharded_over_data_and_context_parallel_ranks():
    e = new_experiment("glm4-9b")  # 4 training GPUs, TP 2 CP 2 → DP 1, DP×CP 2
    key = "Adam state (FP32 master + moments, ZeRO over DP)"
    dp2 = apply_change(e, "resources.cp", 1)[0]  # DP 2, DP×CP 2: the same shards
    assert estimate_memory(dp2).training.items_gib[key] == pytest.approx(estimate_memory(e).training.items_gib[key], rel=0.01)
    tp4 = apply_change(dp2, "resources.tp", 4)[0]  # DP 1: one shard of a quarter of the weights
    assert estimate_memory(tp4).training.items_gib[key] == pytest.approx(estimate_memory(e).training.items_gib[key], rel=0.01)
    dp4 = apply_change(dp2, "resources.tp", 1)[0]  # DP 4: a quarter of the whole weights' state
    assert estimate_memory(dp4).training.items_gib[key] == pytest.approx(estimate_memory(e).training.items_gib[key], rel=0.01)
    two = apply_change(dp4, "placement.train_gpus", 2)[0]  # DP 2: half of the whole weights' state
    assert estimate_memory(two).training.items_gib[key] == pytest.approx(2 * estimate_memory(e).training.items_gib[key], rel=0.01)


def test_adam_is_twelve_bytes_per_param_shard():
    e = new_experiment("glm4-9b")
    m = estimate_memory(e)
    key = "Adam state (FP32 master + moments, ZeRO over DP)"
    assert m.training.items_gib[key] == pytest.approx(6 * m.training.items_gib["weights (BF16)"] / 2, rel=0.01)  # 12 B vs 2 B, DP×CP 2


def test_full_recompute_uses_less_activation_memory():
    e = new_experiment("glm4.7")
    none = apply_change(e, "resources.recompute", "none")[0]
    assert estimate_memory(e).training.items_gib["activations"] < estimate_memory(none).training.items_gib["activations"]


def test_fp8_rollout_halves_engine_weights_and_grows_the_kv_cache():
    e = new_experiment("glm4.7")
    fp8 = apply_change(e, "precision.rollout", "fp8")[0]
    a, b = estimate_memory(e), estimate_memory(fp8)
    wa = next(v for k, v in a.rollout.items_gib.items() if k.startswith("weights"))
    wb = next(v for k, v in b.rollout.items_gib.items() if k.startswith("weights"))
    assert wb == pytest.approx(wa / 2, rel=0.01) and b.kv_tokens_per_engine > a.kv_tokens_per_engine


def test_kv_cache_comes_from_the_static_fraction_of_the_image_gpu():
    e = new_experiment("glm4-9b")
    low = apply_change(e, "serving.mem_fraction_static", 0.5)[0]
    m = estimate_memory(e)
    assert m.gpu_memory_gib == 80
    assert estimate_memory(low).kv_tokens_per_engine < m.kv_tokens_per_engine
    blackwell = apply_change(e, "install.image", "slimerl/slime:0.1.0-cu130-blackwell")[0]
    assert estimate_memory(blackwell).kv_tokens_per_engine > m.kv_tokens_per_engine


def test_colocated_peak_is_the_larger_phase():
    m = estimate_memory(new_experiment("glm4.7"))
    assert m.colocated and m.peak_gib == max(m.training.total_gib, m.rollout.total_gib)


def test_param_counts_are_reported_from_the_model_spec():
    m = estimate_memory(new_experiment("deepseek-r1"))
    assert 600 < m.total_params_b < 740 and 33 < m.active_params_b < 41


def test_hybrid_cache_is_two_pools_split_at_the_state_kv_ratio():
    e = new_experiment("qwen3.8-27b")
    m = estimate_memory(e)
    assert m.state_kv_ratio == 0.9  # SGLang's default when the experiment sets none
    assert m.state_pool_gib == pytest.approx(m.kv_pool_gib * 0.9, rel=0.02)
    names = list(m.rollout.items_gib)
    assert any(n.startswith("attention KV pool") for n in names) and any(n.startswith("recurrent-state pool") for n in names)
    half = estimate_memory(apply_change(e, "precision.state_kv_ratio", 0.5)[0])
    assert half.state_pool_gib == pytest.approx(half.kv_pool_gib * 0.5, rel=0.02)
    assert half.kv_pool_gib > m.kv_pool_gib and half.kv_tokens_per_engine > m.kv_tokens_per_engine
    both = m.kv_pool_gib + m.state_pool_gib
    assert both == pytest.approx(half.kv_pool_gib + half.state_pool_gib, abs=0.02)  # the same budget, split differently


def test_models_without_recurrent_layers_have_one_pool():
    m = estimate_memory(new_experiment("glm4-9b"))
    assert m.state_pool_gib == 0 and m.state_kv_ratio is None and "KV cache (rest of the static fraction)" in m.rollout.items_gib
