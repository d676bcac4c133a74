"""The Qwen3.5 hybrid (megatron-core's GatedDeltaNet and gated attention) and GLM-5 (megatron-core's
DSA indexer on absorbed MLA) built by the Megatron backend (layers.py) compute what transformers'
own models compute, on a CPU, from the tiny reference checkpoints.

Runs where megatron-core and flash-linear-attention import (megatron-core's GatedDeltaNet refuses
to build without ``fla``, and importing megatron-core needs triton); skips elsewhere, saying which
is missing. The GPU tests (tests/gpu/test_families_gpu.py) check the same models in bf16.

What a CPU cannot run is replaced, each named here:
- fake: ``torch.cuda.current_device`` returns ``"cpu"`` (GatedDeltaNet allocates its conv, A_log
  and dt_bias on the current CUDA device);
- fake: fla's ``l2norm`` (a Triton kernel) is the same formula in torch; megatron-core's
  ``deterministic_mode`` already runs the DeltaNet's conv and chunked delta rule in torch;
- setting: the MoE layers use the allgather token dispatcher without variable lengths (the
  alltoall one opens CUDA streams); routing is per token, so the result is the same.
The reference side is transformers' model in a separate process on its torch path, and the fp32
log-probs must agree to rounding: a wrong weight layout moves them by whole units.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SEQ = 70


# family -> (transformers class, megatron config overrides besides fp32, max |Δ log-prob|)
CASES = {
    "qwen3_5": ("Qwen3_5ForConditionalGeneration", {"deterministic_mode": True}, 1e-4),
    # fp32 sigmoid routing over 8 experts: near-equal scores may order differently, hence 1e-3
    "glm_moe_dsa": ("GlmMoeDsaForCausalLM", {"moe_token_dispatcher_type": "allgather",
                                             "variable_seq_lengths": False}, 1e-3),
}


def _missing(family: str) -> str | None:
    for mod, why in (("megatron.core", "megatron-core"), ("fla", "flash-linear-attention (fla-core)")):
        try:
            if importlib.util.find_spec(mod) is None:
                return why
        except ImportError:
            return why
    import transformers

    if not hasattr(transformers, CASES[family][0]):
        return f"transformers {transformers.__version__} without {family}"
    return None


def _hf_log_probs(family: str, hf: str, out: str) -> None:
    """The reference, on transformers' torch path (fla's kernels need a GPU: keep it unimportable)."""
    sys.modules["fla"] = None  # type: ignore[assignment]
    import torch
    import transformers

    cls = getattr(transformers, CASES[family][0])
    ref = cls.from_pretrained(hf, dtype=torch.float32, attn_implementation="eager").eval()
    ids = torch.randint(1, 256, (1, SEQ), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        lp = torch.log_softmax(ref(input_ids=ids).logits.float(), -1)
    torch.save({"ids": ids, "lp": lp}, out)


def _megatron_log_probs(family: str, spec: str, hf: str, ref: str) -> dict:
    import torch

    from tests.runtime.megatron_cpu_fakes import install

    install(gated_delta_net=True)  # both fakes (module docstring)

    from slime.backends.megatron import hf_mapping as hm
    from slime.backends.megatron.model import (
        HFReader,
        build_model,
        global_named_parameters,
        init_parallel,
        iter_hf_tensors,
        load_hf_into,
    )
    from slime.model_spec import load_flags

    flags = load_flags(spec)
    init_parallel({}, backend="gloo")
    model = build_model(flags, {}, cpu=True, init_weights=False, params_dtype=torch.float32,
                        pipeline_dtype=torch.float32, bf16=False, **CASES[family][1])
    d = hm.dims_from_flags(flags)
    names = [n for n, _ in global_named_parameters(model)]
    reader = HFReader(hf)
    load_hf_into(model, flags, reader.get)
    exported = dict(iter_hf_tensors(model, flags))
    saved = torch.load(ref)
    ids, lp_hf = saved["ids"], saved["lp"]
    with torch.no_grad():
        logits = model(input_ids=ids, position_ids=torch.arange(SEQ)[None], attention_mask=None)
    lp = torch.log_softmax(logits[..., : d.vocab].float(), -1)
    diff = (lp - lp_hf).abs()
    kinds = sorted({type(m).__name__ for m in model.modules()})
    packed_gap = None
    if family == "glm_moe_dsa":  # the trainer packs sequences into THD rows (the DeltaNet's torch path cannot)
        from megatron.core.packed_seq_params import PackedSeqParams

        cut = 40
        cu = torch.tensor([0, cut, SEQ], dtype=torch.int32)
        packed = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=cut,
                                 max_seqlen_kv=cut)
        pos = torch.cat([torch.arange(cut), torch.arange(SEQ - cut)])[None]
        with torch.no_grad():
            one_row = model(input_ids=ids, position_ids=pos, attention_mask=None, packed_seq_params=packed)
            apart = torch.cat([model(input_ids=x, position_ids=torch.arange(x.shape[1])[None], attention_mask=None)
                               for x in (ids[:, :cut], ids[:, cut:])], 1)
        packed_gap = float((one_row - apart)[..., : d.vocab].abs().max())
    return {"packed_vs_separate_max_abs_dlogit": packed_gap, "names_match": sorted(names) == sorted(hm.iter_mcore_names(d)),
            "export_bitwise": all(torch.equal(t, reader.get(k)) for k, t in exported.items()),
            "exported": len(exported), "max_abs_dlogp": float(diff.max()), "mean_abs_dlogp": float(diff.mean()),
            "modules": kinds}


@pytest.mark.parametrize("family", sorted(CASES))
def test_megatron_model_matches_transformers_in_fp32(tmp_path, family):
    missing = _missing(family)  # checked here, not at import: the reference process imports this file too
    if missing:
        pytest.skip(f"needs {missing}")
    sys.path.insert(0, str(ROOT / "tools"))
    import reference_models as rm

    hf, spec = rm.build(family, tmp_path / "ref", dtype="float32")
    ref = tmp_path / "hf_lp.pt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    for args in (["hf", family, str(hf), str(ref)], ["megatron", family, str(spec), str(hf), str(ref)]):
        # separate processes: each sets up its own fakes / process groups
        r = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=600, env=env,
                           cwd=ROOT)
        assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    print(res)
    built = {"qwen3_5": {"GatedDeltaNet", "SelfAttention", "OnePlusRMSNorm", "GatedOutputRMSNorm"},
             "glm_moe_dsa": {"AbsorbedMLASelfAttention", "DSAttention", "DSAIndexer", "MoELayer"}}[family]
    assert built <= set(res["modules"]), res["modules"]
    assert res["names_match"] and res["export_bitwise"] and res["exported"] > 0
    assert res["max_abs_dlogp"] < CASES[family][2], res
    if family == "glm_moe_dsa":
        assert res["packed_vs_separate_max_abs_dlogit"] < 1e-5, res


if __name__ == "__main__":
    if sys.argv[1] == "hf":
        _hf_log_probs(*sys.argv[2:5])
    else:
        print(json.dumps(_megatron_log_probs(*sys.argv[2:6])))
