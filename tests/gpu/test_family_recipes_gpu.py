"""The six tiny-gpu-<family> recipes around the loop on one GPU, as written (32 prompts x 8 samples,
3 rollouts, Megatron trainer + bf16 embedded engine colocated, CUDA IPC weight hand-over): the lab
renders experiment.sh, then prepare -> convert -> check -> train (a real `ray job submit` to this
module's own Ray head). Each must show KL 0 at step 1 (train/kl_loss, train/ppo_kl), every step's
train/rollout |Δ log-prob| <= 0.1 and its post-sync check (sync/check_logp_max_diff) <= 0.1, and
no error. Figures go to gpu_test_results.json ($OUT) as family_recipe/<family>.

Run in two parts of the GPU suite (tools/gpu_parts.py): `bash tools/run_gpu_tests.sh --part 6`
(glm4, glm4_moe, glm4_moe_lite) and `--part 7` (deepseek_v3, glm_moe_dsa, qwen3_5). Qwen3.5 needs
flash-linear-attention and, on Hopper with Triton < 3.7.1, tilelang (the wheel set of
`tools/build_device_wheels.py --with-tilelang`); without fla it skips and says so."""

from __future__ import annotations

import json
import sys

import pytest
from gpu_helpers import ROOT, record

pytestmark = pytest.mark.gpu
sys.path.insert(0, str(ROOT))

from tests.family_loop import FAMILY_RECIPES, checkout_in, loop_problems, ray_head, run_recipe, summary  # noqa: E402


def _skip_without_family_deps(family: str) -> None:
    import transformers

    need = {"glm_moe_dsa": "GlmMoeDsaForCausalLM", "qwen3_5": "Qwen3_5ForConditionalGeneration"}
    if family in need and not hasattr(transformers, need[family]):
        pytest.skip(f"transformers {transformers.__version__} has no {family} model classes")
    if family == "qwen3_5":
        try:
            from megatron.core.ssm.gated_delta_net import HAVE_FLA
        except ImportError as exc:
            pytest.skip(f"megatron-core's gated_delta_net does not import: {exc}")
        if not HAVE_FLA:
            pytest.skip("Qwen3.5 needs flash-linear-attention (fla-core) for megatron-core's GatedDeltaNet")


@pytest.fixture(scope="module")
def head(gpu_ready, tmp_path_factory):
    base = tmp_path_factory.mktemp("family-recipes")
    repo = checkout_in(base / "checkout")
    with ray_head(repo, num_cpus=8, num_gpus=1) as h:
        yield repo, h


@pytest.mark.parametrize("family", list(FAMILY_RECIPES))
def test_family_recipe_goes_around_the_loop(family, head):
    _skip_without_family_deps(family)
    repo, h = head
    res = run_recipe(FAMILY_RECIPES[family], repo, h)
    fig = summary(res)
    record(f"family_recipe/{family}", fig)
    print("[family-loop]", json.dumps(fig), flush=True)
    problems = loop_problems(res)
    assert not problems, f"{family}: {problems}\n--- train log tail ---\n{res.logs['train'][-4000:]}"
