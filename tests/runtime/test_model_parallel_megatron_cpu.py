"""Model parallelism of the Megatron backend on CPUs: several gloo processes under torchrun
compute what one process computes, and torch_dist checkpoints move between layouts.

Each case builds a tiny model of a seeded family from its reference checkpoint
(tools/reference_models.py, fp32) in every rank of a torchrun job (tests/runtime/mp_worker.py),
runs one forward/backward through megatron-core's schedule and gathers the weights and gradients
under HF names on rank 0:
- dense (GLM-4 with sandwich norms) at TP 2 (resumed from a TP 1 checkpoint), TP 2 x PP 2 and
  TP 4 (resumed from the TP 2 x PP 2 checkpoint), and TP 1 resumed from TP 2 x PP 2;
- MoE (GLM-4-MoE-like: shared expert, sigmoid router with expert bias, qk norms) at TP 2 x EP 2
  with sequence parallel;
- MLA + MoE (DeepSeek-V3-like: yarn rope, group-limited routing) at TP 2 x EP 2 with sequence
  parallel, and dense MLA at TP 2 without it.
Loss and every gradient must equal TP 1's within 1e-5 (fp32); weights loaded from another
layout's checkpoint must equal the HF weights bit for bit. The conversion tools run as a user
runs them (``--nproc-per-node 2 --cpu``, a MoE model at TP 2 x EP 2 in and PP 2 out; on CPUs they
build the model in the trainer's CPU mode) and must give the HF tensors back bit for bit.

What a CPU cannot run is replaced, each named in tests/runtime/megatron_cpu_fakes.py
(``install_multi_rank``):
- fake: ``torch.cuda.current_device`` returns ``"cpu"``;
- fake: megatron's CUDA RNG tracker is its public non-CUDA one;
- fake: a ``TorchFunctionMode`` sends the pipeline schedules' hard-coded ``device="cuda"`` to the CPU;
- setting: the MoE layers use the allgather token dispatcher (the alltoall one opens CUDA streams).
The product's own torch_dist writer runs without any fake (convert.torch_dist_io_without_cuda).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "runtime" / "mp_worker.py"
TOL = 1e-5

pytestmark = pytest.mark.slow


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "OMP_NUM_THREADS": "1"}


def _torchrun(nproc: int, script: Path, *args: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(script), *map(str, args)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=_env(), cwd=ROOT)
    assert r.returncode == 0, (" ".join(cmd), r.stdout[-2000:], r.stderr[-4000:])


def _run(tmp: Path, tag: str, nproc: int, *args: str) -> dict:
    out = tmp / f"{tag}.pt"
    _torchrun(nproc, WORKER, *args, "--out", out)
    return torch.load(out)


def _max_diff(a: dict, b: dict) -> tuple[float, str]:
    assert set(a) == set(b), (sorted(set(a) ^ set(b))[:5])
    return max((float((a[n] - b[n]).abs().max()), n) for n in a)


def _hf_tensors(hf: Path) -> dict:
    from slime.backends.megatron.model import HFReader

    r = HFReader(hf)
    return {n: r.get(n) for n in r.weight_map}


def _assert_matches_tp1(one: dict, many: dict, what: str) -> None:
    dloss = abs(one["loss"] - many["loss"])
    dgrad, worst = _max_diff(one["grads"], many["grads"])
    print(f"{what}: |dloss| {dloss:.2e}, max |dgrad| {dgrad:.2e} ({worst}), {len(many['grads'])} gradients")
    assert dloss <= TOL and dgrad <= TOL, (what, dloss, dgrad, worst)


def _same_as_hf(weights: dict, hf: dict) -> None:
    """Every tensor the model holds is the HF tensor, bit for bit (the HF file also holds the MTP
    layer, which these models leave out)."""
    assert weights and set(weights) <= set(hf), sorted(set(weights) - set(hf))[:5]
    bad = [n for n, t in weights.items() if not torch.equal(t, hf[n])]
    assert not bad, bad[:5]


def _reference(tmp: Path, family: str, **config: object) -> tuple[Path, Path]:
    """A family's tiny fp32 reference (its config changed by ``config``, the spec to match)."""
    sys.path.insert(0, str(ROOT / "tools"))
    import reference_models as rm

    if not config:
        return rm.build(family, tmp / family, dtype="float32")
    import transformers

    base = rm.make_config(family)
    cfg = type(base)(**{**base.to_dict(), **config})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # norms and biases off their init, as reference_models does
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    hf = tmp / family / "hf"
    model.save_pretrained(hf)
    return hf, tmp / family / "spec.sh"


def _spec(path: Path, family: str, overrides: dict[str, str], drop: tuple[str, ...] = ()) -> Path:
    sys.path.insert(0, str(ROOT / "tools"))
    import reference_models as rm

    text = rm.spec_text(family, overrides)
    lines = [ln for ln in text.splitlines() if not ln.strip().startswith(drop)] if drop else text.splitlines()
    path.write_text("\n".join(lines) + "\n")
    return path


# --- dense: TP 2, TP 2 x PP 2, TP 4, and resuming across them -------------------------------------


def test_dense_model_at_tp2_pp2_tp4_equals_tp1_and_resumes_across_layouts(tmp_path):
    """GLM-4 (4 query groups, so that TP 4 splits them): TP 1 saves; TP 2 resumes from it; TP 2 x
    PP 2 starts from HF and saves; TP 1 and TP 4 resume from that."""
    hf, _ = _reference(tmp_path, "glm4", num_key_value_heads=4)
    spec = _spec(tmp_path / "glm4" / "spec.sh", "glm4", {"--num-query-groups": "4"})
    ref = _hf_tensors(hf)
    base = ["--spec", spec]
    one = _run(tmp_path, "tp1", 1, *base, "--hf", hf, "--save", tmp_path / "ck_tp1")
    _same_as_hf(one["weights"], ref)
    tp2 = _run(tmp_path, "tp2_from_tp1", 2, *base, "--tp", "2", "--load", tmp_path / "ck_tp1")
    _same_as_hf(tp2["weights"], ref)
    _assert_matches_tp1(one, tp2, "dense TP 2 (resumed from TP 1)")
    tp2pp2 = _run(tmp_path, "tp2pp2", 4, *base, "--tp", "2", "--pp", "2", "--hf", hf, "--save", tmp_path / "ck_tp2pp2")
    _assert_matches_tp1(one, tp2pp2, "dense TP 2 x PP 2")
    back = _run(tmp_path, "tp1_from_tp2pp2", 1, *base, "--load", tmp_path / "ck_tp2pp2")
    _same_as_hf(back["weights"], ref)
    _assert_matches_tp1(one, back, "dense TP 1 (resumed from TP 2 x PP 2)")
    tp4 = _run(tmp_path, "tp4_from_tp2pp2", 4, *base, "--tp", "4", "--load", tmp_path / "ck_tp2pp2")
    _same_as_hf(tp4["weights"], ref)
    _assert_matches_tp1(one, tp4, "dense TP 4 (resumed from TP 2 x PP 2)")


# --- MoE and MLA at TP 2 -------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["glm4_moe", "deepseek_v3"])
def test_moe_and_mla_at_tp2_ep2_with_sequence_parallel_equal_tp1(tmp_path, family):
    """MoE at TP 2 trains only with sequence parallel (megatron-core asks for it), which the local
    spec's norms now support; DeepSeek-V3's MLA adds the rotary key whose gradient is summed over
    TP (layers.MLASelfAttentionTP)."""
    hf, spec = _reference(tmp_path, family)
    one = _run(tmp_path, "tp1", 1, "--spec", spec, "--hf", hf)
    many = _run(tmp_path, "tp2ep2", 2, "--spec", spec, "--hf", hf, "--tp", "2", "--ep", "2", "--sp")
    _same_as_hf(many["weights"], _hf_tensors(hf))
    _assert_matches_tp1(one, many, f"{family} TP 2 x EP 2 + SP")


def test_dense_mla_at_tp2_without_sequence_parallel_equals_tp1(tmp_path):
    """MLA without MoE at TP 2, no sequence parallel: the rotary key's gradient is summed by
    layers._SumRotaryKeyGrad, and the q norm's (whole on every rank) is averaged, not summed."""
    hf, _ = _reference(tmp_path, "deepseek_v3", first_k_dense_replace=3)
    spec = _spec(tmp_path / "deepseek_v3" / "spec.sh", "deepseek_v3", {},
                 drop=("--num-experts", "--moe-", "--mtp-"))
    one = _run(tmp_path, "tp1", 1, "--spec", spec, "--hf", hf)
    many = _run(tmp_path, "tp2", 2, "--spec", spec, "--hf", hf, "--tp", "2")
    _assert_matches_tp1(one, many, "dense MLA TP 2")


# --- the conversion tools at several ranks, on CPUs ----------------------------------------------


def test_conversion_tools_round_trip_a_moe_bitwise_at_tp2xep2_and_pp2_on_cpu(tmp_path):
    """A MoE model (GLM-4-MoE, 4 layers: a dense first layer, 8 routed experts with expert bias,
    a shared expert and the MTP layer) HF -> torch_dist with ``--nproc-per-node 2 --cpu --tp 2
    --ep 2`` (the torch_dist writer without CUDA; each EP rank writes its own experts), then back
    with ``--pp 2`` (each stage's rank writes its layers): every tensor is the HF one bit for bit,
    and the index names each tensor once."""
    import json

    sys.path.insert(0, str(ROOT / "tools"))
    import reference_models as rm

    hf, spec = rm.build("glm4_moe:4l", tmp_path / "moe", dtype="bfloat16")  # the spec's (training) dtype
    td, back = tmp_path / "td", tmp_path / "back"
    for script, args in (("convert_hf_to_torch_dist_megatron.py", ["--hf-checkpoint", hf, "--save", td, "--tp", "2",
                                                                   "--ep", "2"]),
                         ("convert_torch_dist_to_hf.py", ["--load", td, "--save", back, "--pp", "2",
                                                          "--dtype", "bfloat16"])):
        r = subprocess.run([sys.executable, str(ROOT / "tools" / script), "--model-args", str(spec),
                            "--nproc-per-node", "2", "--cpu", *map(str, args)], capture_output=True, text=True,
                           timeout=600, env={**_env(), "CONVERT_MASTER_PORT": str(_free_port())}, cwd=ROOT)
        assert r.returncode == 0, (script, r.stdout[-2000:], r.stderr[-4000:])
    ref, out = _hf_tensors(hf), _hf_tensors(back)
    assert set(out) == set(ref), sorted(set(out) ^ set(ref))[:5]
    unequal = [n for n in ref if out[n].dtype != ref[n].dtype or not torch.equal(out[n], ref[n])]
    assert not unequal, unequal[:5]
    index = json.loads((back / "model.safetensors.index.json").read_text())["weight_map"]
    assert {f.split("-r")[0] for f in index.values()} == {"model-pp000", "model-pp001"}  # one writer per stage
    assert sum(".mlp.experts." in n for n in index) >= 3 * 8 * 3  # 3 MoE layers x 8 experts x 3 (+ MTP's)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
