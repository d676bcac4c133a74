"""One family's tiny recipe (tiny-gpu-glm4-moe: MoE layers with per-expert checkpoint tensors, a
sigmoid router with expert bias, a shared expert) around the whole loop on the CPU, through the
lab's experiment.sh: prepare -> convert (megatron-core on gloo) -> check -> train (a real
`ray job submit`; the Megatron trainer and the embedded engine colocated, 3 rollouts). Step 1's
KL is 0, every step's train/rollout |Δ log-prob| and post-sync check are within 0.1.

The CPU keeps the recipe's flags except the batch (4 prompts x 4 samples instead of 32 x 8), so
the run fits CI; tests/gpu/test_family_recipes_gpu.py runs all six recipes as written. Other
families on the CPU (a few minutes each, not in CI):
SLIME_CPU_FAMILY_RECIPES=glm4,glm4_moe_lite,deepseek_v3,glm_moe_dsa pytest tests/runtime/test_family_recipe_cpu.py.
Qwen3.5 cannot train on the CPU: megatron-core's GatedDeltaNet runs fla's Triton kernels."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("megatron.core")
pytest.importorskip("ray")

from tests.family_loop import FAMILY_RECIPES, checkout_in, loop_problems, ray_head, run_recipe, summary  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(900)]
SMALL_BATCH = ("--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--micro-batch-size", "16",
               "--global-batch-size", "16")
FAMILIES = [f for f in os.environ.get("SLIME_CPU_FAMILY_RECIPES", "glm4_moe").split(",") if f]
NO_CPU = {"qwen3_5": "megatron-core's GatedDeltaNet runs fla's Triton kernels (causal conv1d), which need a GPU"}


@pytest.mark.parametrize("family", FAMILIES)
def test_family_recipe_goes_around_the_loop_on_cpu(family, tmp_path):
    if family not in FAMILY_RECIPES:
        pytest.fail(f"SLIME_CPU_FAMILY_RECIPES: {family!r} is not one of {sorted(FAMILY_RECIPES)}")
    if family in NO_CPU:
        pytest.skip(NO_CPU[family])
    repo = checkout_in(tmp_path / "checkout")
    with ray_head(repo, num_cpus=8, num_gpus=0) as head:
        res = run_recipe(FAMILY_RECIPES[family], repo, head, SMALL_BATCH)
    print("[family-loop]", json.dumps(summary(res)), flush=True)
    assert not loop_problems(res), loop_problems(res)
    from lab.core.recipes import get_recipe

    assert f"--family {get_recipe(FAMILY_RECIPES[family]).family}" in (repo / "experiment.sh").read_text()
