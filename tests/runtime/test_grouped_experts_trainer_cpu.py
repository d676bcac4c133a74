"""A tiny GLM-4-MoE in slime's Megatron trainer (CPU, gloo, float32) with ``--moe-grouped-gemm``
(grouped_experts.GroupedSequentialMLP) gives what it gives with megatron-core's SequentialMLP:
the step-1 log-probs, the first step's loss and grad norm, and the weight export (bitwise the HF
checkpoint: the grouped path keeps SequentialMLP's parameters); also at EP 2 against one rank.

The harness is test_megatron_parallel_cpu.py's (one spawned process per rank, real gloo groups);
each rank also reports which experts module its MoE layers built, so the switch is checked too.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _experts_classes(tr) -> set[str]:
    from slime.backends.megatron.model import unwrap

    return {type(mod).__name__ for mod in unwrap(tr.model).modules() if hasattr(mod, "local_experts")}


def _worker(rank: int, world: int, port: int, spec: str, hf: str, layout: dict, out: str, q) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      LOCAL_RANK="0")
    try:
        torch.set_num_threads(1)
        from slime.backends.megatron.trainer import MegatronTrainer
        from slime.config import BatchConfig, LossConfig, ModelConfig, OptimConfig
        from slime.model_spec import load_flags
        from tests.runtime.test_megatron_parallel_cpu import _records

        flags = {**load_flags(spec), **{k: str(v) for k, v in layout.items()}}
        tr = MegatronTrainer(flags, ModelConfig(hf_checkpoint=hf), OptimConfig(lr=1e-3, weight_decay=0.0),
                             LossConfig(), BatchConfig(micro_batch_size=4))
        vocab = int(flags["vocab_size"])
        lp = tr.log_probs(_records(vocab))
        exported = [(n, t.clone()) for b in tr.export_hf_weights(bucket_bytes=64 * 1024) for n, t in b]
        metrics = tr.train(_records(vocab, seed=1), 1)
        if rank == 0:
            torch.save({"lp": lp, "metrics": metrics, "export": exported, "experts": _experts_classes(tr)}, out)
        q.put((rank, "ok", len(exported)))
    except BaseException as e:  # noqa: BLE001 - report to the test, which names the rank
        q.put((rank, f"{type(e).__name__}: {e}", 0))
        raise


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

    saved = par._worker
    par._worker = _worker  # the same spawn harness, with this file's worker (it reports the experts)
    try:
        return par._run(spec, hf, layout, world, out)
    finally:
        par._worker = saved


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
