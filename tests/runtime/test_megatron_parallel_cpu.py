"""The Megatron trainer at TP 2, PP 2, TP 2 x PP 2 and EP 2 equals itself at one rank, on the CPU
with gloo (float32): step-1 log-probs within 1e-5, the first step's loss and grad norm, and the
weight export (what weight sync streams) is bitwise the HF checkpoint, every tensor exactly once.

Real parts only: megatron-core with its product CPU mode (slime/backends/megatron/cpu.py), real
gloo process groups (one spawned process per rank, as the Ray trainer actors are), the tiny dense
model of the tiny-cpu recipe and a tiny GLM-4-MoE reference (tools/reference_models.py).
"""

from __future__ import annotations

import json
import os
import queue
import random
import socket
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _records(vocab: int, n: int = 8, seed: int = 0):
    from slime.data.train_data import TrainRecord

    rng = random.Random(seed)
    out = []
    for i in range(n):
        p, r = 3 + i % 3, 2 + i % 4
        toks = [rng.randrange(4, vocab) for _ in range(p + r)]
        out.append(TrainRecord(toks, p, rng.choice([-1.0, 1.0]), [-1.0] * r, [1] * r))
    return out


def _experts_classes(tr) -> set[str]:
    """The module class of the MoE layers' experts (empty for a dense model): which experts path was built."""
    from slime.backends.megatron.model import unwrap

    return {type(mod).__name__ for mod in unwrap(tr.model).modules() if hasattr(mod, "local_experts")}


def _worker(rank: int, world: int, port: int, spec: str, hf: str, layout: dict, out: str, q) -> None:
    """One trainer rank: log-probs, the export, one optimizer step; rank 0 saves what it saw."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      LOCAL_RANK="0")
    try:
        torch.set_num_threads(1)
        from slime.backends.megatron.trainer import MegatronTrainer
        from slime.config import BatchConfig, LossConfig, ModelConfig, OptimConfig
        from slime.model_spec import load_flags

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


def _run(spec: Path, hf: Path, layout: dict, world: int, out: Path) -> dict:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, world, port, str(spec), str(hf), layout, str(out), q))
             for r in range(world)]
    for p in procs:
        p.start()
    answers = {}
    try:
        while len(answers) < world:
            try:
                rank, status, n = q.get(timeout=5)
                answers[rank] = (status, n)
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise AssertionError(f"a rank died (exit codes {dead}); answers so far {answers}") from None
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    bad = {r: a for r, a in answers.items() if a[0] != "ok"}
    assert not bad, f"{layout}: {bad}"
    # only global rank 0 holds the export: the others handed their tensors over (export.py)
    assert answers[0][1] > 0 and all(answers[r][1] == 0 for r in range(1, world)), answers
    return torch.load(out)


def _hf(hf: Path) -> dict:
    from safetensors.torch import load_file

    sd = {}
    for f in sorted(hf.glob("*.safetensors")):
        sd.update(load_file(str(f)))
    return sd


def _assert_equivalent(base: dict, got: dict, hf: dict, what: str, carried: set[str] = frozenset()) -> dict:
    lp_diff = max(abs(a - b) for ra, rb in zip(base["lp"], got["lp"]) for a, b in zip(ra, rb))
    names = [n for n, _ in got["export"]]
    assert len(names) == len(set(names)), f"{what}: a tensor exported twice"
    exported = dict(got["export"])
    missing = sorted(set(hf) - carried - set(exported))
    assert not missing, f"{what}: the export misses {len(missing)} of {len(hf)} tensors: {missing[:5]}"
    assert set(exported) <= set(hf), f"{what}: names the checkpoint lacks: {sorted(set(exported) - set(hf))[:5]}"
    unequal = [n for n, t in exported.items() if not torch.equal(t, hf[n].to(t.dtype)) or t.dtype != hf[n].dtype]
    assert not unequal, f"{what}: exported tensors differ from the HF weights: {unequal[:5]}"
    bm, gm = base["metrics"], got["metrics"]
    loss_diff = abs(bm["train/loss"] - gm["train/loss"])
    gn_diff = abs(bm["train/grad_norm"] - gm["train/grad_norm"])
    figures = {"layout": what, "max_logprob_diff": lp_diff, "loss_diff": loss_diff, "grad_norm_diff": gn_diff,
               "grad_norm": gm["train/grad_norm"]}
    print("[equivalence]", json.dumps(figures), flush=True)  # the figures docs/benchmarks.md quotes
    assert lp_diff <= 1e-5, figures
    assert loss_diff <= 1e-6 * max(1.0, abs(bm["train/loss"])), figures
    assert gn_diff <= 1e-5 * max(1.0, bm["train/grad_norm"]), figures
    return figures


# --- the tiny dense model of the tiny-cpu recipe ---------------------------------------------------

DENSE_SPEC = ROOT / "scripts" / "models" / "tiny-cpu.sh"


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    root = tmp_path_factory.mktemp("dense")
    sys.path.insert(0, str(ROOT / "tools" / "tiny"))
    import prepare  # tools/tiny/prepare.py: the recipe's own model (float32)

    prepare.main(["--model-dir", str(root / "model"), "--data-dir", str(root / "data")])
    base = _run(DENSE_SPEC, root / "model", {}, 1, root / "tp1.pt")
    return root, base, _hf(root / "model")


@pytest.mark.parametrize("layout,world", [
    ({"tensor_model_parallel_size": 2}, 2),
    ({"pipeline_model_parallel_size": 2}, 2),
    ({"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2}, 4),
], ids=["tp2", "pp2", "tp2xpp2"])
def test_dense_model_at_tp_pp_equals_one_rank(dense, layout, world):
    root, base, hf = dense
    got = _run(DENSE_SPEC, root / "model", layout, world, root / f"{'-'.join(map(str, layout.values()))}.pt")
    _assert_equivalent(base, got, hf, json.dumps(layout))


# --- a tiny GLM-4-MoE at EP 2 --------------------------------------------------------------------

def test_moe_at_ep2_equals_one_rank_and_every_rank_exports_its_experts(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    import reference_models as rm

    hf, spec = rm.build("glm4_moe", tmp_path / "moe", dtype="float32")
    # The published MTP layer rides along unchanged (frozen) and the trainer exports it too.
    base = _run(spec, hf, {}, 1, tmp_path / "ep1.pt")
    got = _run(spec, hf, {"expert_model_parallel_size": 2}, 2, tmp_path / "ep2.pt")
    _assert_equivalent(base, got, _hf(hf), "ep2")
