"""One family's tiny recipe (tiny-gpu-glm4-moe: MoE layers with per-expert checkpoint tensors, a
sigmoid router with expert bias, a shared expert) around the whole loop on the CPU, through the
lab's experiment.sh: prepare -> convert (megatron-core on gloo) -> check -> train (a real
`ray job submit`; the Megatron trainer and the embedded engine colocated, 3 rollouts). Step 1's
KL is 0, every step's train/rollout |Δ log-prob| and post-sync check are within 0.1.

The CPU keeps the recipe's flags except the batch (4 prompts x 4 samples instead of 32 x 8), so
the run fits CI; tests/gpu/test_family_recipes_gpu.py runs all six recipes as written."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("megatron.core")
pytest.importorskip("ray")

from tests.family_loop import checkout_in, loop_problems, ray_head, run_recipe, summary  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(900)]
SMALL_BATCH = ("--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--micro-batch-size", "16",
               "--global-batch-size", "16")


def test_tiny_gpu_glm4_moe_recipe_goes_around_the_loop_on_cpu(tmp_path):
    repo = checkout_in(tmp_path / "checkout")
    with ray_head(repo, num_cpus=8, num_gpus=0) as head:
        res = run_recipe("tiny-gpu-glm4-moe", repo, head, SMALL_BATCH)
    print("[family-loop]", json.dumps(summary(res)), flush=True)
    assert not loop_problems(res), loop_problems(res)
    assert "--family glm4_moe" in (repo / "experiment.sh").read_text()
