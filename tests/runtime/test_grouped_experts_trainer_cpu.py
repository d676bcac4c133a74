"""A tiny GLM-4-MoE in slime's Megatron trainer (CPU, gloo, float32) with ``--moe-grouped-gemm``
(grouped_experts.GroupedSequentialMLP) gives what it gives with megatron-core's SequentialMLP:
the step-1 log-probs, the first step's loss and grad norm, and the weight export (bitwise the HF
checkpoint: the grouped path keeps SequentialMLP's parameters); also at EP 2 against one rank.

The harness is test_megatron_parallel_cpu.py's (one spawned process per rank, real gloo groups);
rank 0 also reports which experts module its MoE layers built, so the switch is checked too.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    sys.path.insert(0, str(ROOT / "tools"))
    import reference_models as rm

    from tests.runtime import test_megatron_parallel_cpu as par

    root = tmp_path_factory.mktemp("grouped")
    hf, spec = rm.build("glm4_moe", root / "moe", dtype="float32")
    base = _run(spec, hf, {}, 1, root / "sequential.pt")
    assert base["experts"] == {"SequentialMLP"}, base["experts"]
    return par, root, spec, hf, base


def _run(spec, hf, layout, world, out):
    from tests.runtime import test_megatron_parallel_cpu as par

    return par._run(spec, hf, layout, world, out)


def test_grouped_experts_train_step_equals_sequential_mlp(moe):
    par, root, spec, hf, base = moe
    got = _run(spec, hf, {"moe_grouped_gemm": True}, 1, root / "grouped.pt")
    assert got["experts"] == {"GroupedSequentialMLP"}, got["experts"]
    par._assert_equivalent(base, got, par._hf(hf), "grouped-ep1")


def test_grouped_experts_at_ep2_equal_sequential_mlp_on_one_rank(moe):
    par, root, spec, hf, base = moe
    got = _run(spec, hf, {"moe_grouped_gemm": True, "expert_model_parallel_size": 2}, 2, root / "grouped-ep2.pt")
    assert got["experts"] == {"GroupedSequentialMLP"}, got["experts"]
    par._assert_equivalent(base, got, par._hf(hf), "grouped-ep2")
