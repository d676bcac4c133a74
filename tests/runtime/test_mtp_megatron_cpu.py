"""The multi-token-prediction (MTP) layer the Megatron backend builds (megatron-core's MTP block,
layers.mtp_block_spec) predicts the token after next as the published MTP layer does, its tensors
map both ways, and HF -> torch_dist -> HF gives the checkpoint back bit for bit; on a CPU, from the
tiny reference checkpoints of the families with an MTP layer.

transformers builds these models without their MTP layer (its weights load as unused keys), so the
reference of the MTP head is its formula on transformers' own parts
(``tools/reference_models.mtp_reference_log_probs``)::

    h'_i = eh_proj(cat(enorm(embed(t_{i+1})), hnorm(h_i)))     h_i: the model's final (normed) hidden
    logits_i = lm_head(shared_head_norm(decoder_layer(h'_i)))   -> t_{i+2}

Runs where megatron-core imports (and flash-linear-attention for Qwen3.5); skips elsewhere, saying
which is missing. Fakes, each named: ``torch.cuda.current_device`` returns ``"cpu"`` and fla's
``l2norm`` is the same formula in torch (both in megatron_cpu_fakes.py);
``torch.cuda.Stream`` is an empty class (conversion builds megatron-core's alltoall MoE dispatcher, which
opens one, and never runs it). The forward uses the allgather dispatcher (a setting, not a fake). tests/gpu/test_mtp_gpu.py checks the same in
bf16 on a GPU.
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
SEQ = 40

# family -> (transformers class, needs fla, megatron config overrides besides fp32, max |Δ log-prob|)
MOE = {"moe_token_dispatcher_type": "allgather", "variable_seq_lengths": False}
CASES = {
    # fp32 sigmoid routing: near-equal expert scores may order differently, hence 1e-3
    "deepseek_v3": ("DeepseekV3ForCausalLM", False, MOE, 1e-3),
    "glm4_moe": ("Glm4MoeForCausalLM", False, MOE, 1e-3),
    "glm4_moe_lite": ("Glm4MoeLiteForCausalLM", False, MOE, 1e-3),
    "qwen3_5": ("Qwen3_5ForConditionalGeneration", True, {"deterministic_mode": True}, 1e-4),
}


def missing_parts(family: str) -> str | None:
    mods = [("megatron.core", "megatron-core")] + ([("fla", "flash-linear-attention (fla-core)")]
                                                    if CASES[family][1] else [])
    for mod, why in mods:
        try:
            if importlib.util.find_spec(mod) is None:
                return why
        except ImportError:
            return why
    import transformers

    if not hasattr(transformers, CASES[family][0]):
        return f"transformers {transformers.__version__} without {family}"
    return None


def _ids(vocab: int = 256):
    import torch

    return torch.randint(1, vocab, (1, SEQ), generator=torch.Generator().manual_seed(0))


def _hf_reference(family: str, hf: str, out: str) -> None:
    """transformers' model (eager, fp32) and the MTP formula on its parts; log-probs to ``out``."""
    sys.modules["fla"] = None  # type: ignore[assignment]  # fla's kernels need a GPU: torch path
    import torch

    sys.path.insert(0, str(ROOT / "tools"))
    import reference_models as rm

    ids = _ids()
    lp, mtp_lp = rm.mtp_reference_log_probs(family, hf, ids)
    torch.save({"ids": ids, "lp": lp, "mtp_lp": mtp_lp}, out)


def _megatron(family: str, spec: str, hf_fp32: str, hf_bf16: str, ref: str, work: str) -> dict:
    """HF (bf16) -> torch_dist -> HF bitwise; then the fp32 model with MTP against the reference."""
    import torch

    from tests.runtime.megatron_cpu_fakes import install

    install(gated_delta_net=bool(CASES[family][1]))  # fakes 1 and 2 (module docstring)
    torch.cuda.Stream = type("NoStream", (), {})  # fake 3: conversion builds the alltoall dispatcher, never runs it
    from safetensors.torch import load_file

    from slime.backends.megatron import hf_mapping as hm
    from slime.backends.megatron.convert import hf_to_torch_dist, load_model_checkpoint, torch_dist_to_hf
    from slime.backends.megatron.model import (
        HFReader,
        build_model,
        global_named_parameters,
        iter_hf_tensors,
        load_hf_into,
    )
    from slime.model_spec import load_flags

    say = lambda m: None  # noqa: E731
    work_dir = Path(work)
    hf_to_torch_dist(hf_bf16, work_dir / "dist", spec, use_gpu=False, progress=say)
    torch_dist_to_hf(work_dir / "dist", work_dir / "back", spec, hf_template=hf_bf16, use_gpu=False, progress=say)
    src, back = {}, {}
    for f in Path(hf_bf16).glob("*.safetensors"):
        src.update(load_file(str(f)))
    for f in (work_dir / "back").glob("*.safetensors"):
        back.update(load_file(str(f)))
    roundtrip = sorted(src) == sorted(back) and all(torch.equal(src[k], back[k]) and src[k].dtype == back[k].dtype
                                                    for k in src)
    carried = (work_dir / "dist" / "hf_carried.safetensors").exists()

    flags = load_flags(spec)
    d = hm.dims_from_flags(flags)
    model = build_model(flags, {}, cpu=True, init_weights=False, params_dtype=torch.float32,
                        pipeline_dtype=torch.float32, bf16=False, **CASES[family][2])
    names = sorted(n for n, _ in global_named_parameters(model))
    reader = HFReader(hf_fp32)
    load_hf_into(model, flags, reader.get)
    exported = dict(iter_hf_tensors(model, flags))
    export_bitwise = all(torch.equal(t, reader.get(k)) for k, t in exported.items())
    mtp_exported = sorted(k for k in exported if k.startswith("mtp.") or k.startswith(f"{d.hf_prefix}layers.{d.num_layers}."))
    # the torch_dist checkpoint holds the MTP block (not a file beside it): a model loaded from it exports it
    reloaded = build_model(flags, {}, cpu=True, init_weights=False, **CASES[family][2])
    load_model_checkpoint(reloaded, work_dir / "dist")
    from_dist = {k: t for k, t in iter_hf_tensors(reloaded, flags) if k in set(mtp_exported)}
    mtp_from_dist = sorted(from_dist) == mtp_exported and all(torch.equal(t, src[k]) for k, t in from_dist.items())

    saved = torch.load(ref)
    ids = saved["ids"]
    captured = {}
    model.mtp.register_forward_hook(lambda m, i, o: captured.__setitem__("h", o))
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ids, position_ids=torch.arange(SEQ)[None], attention_mask=None)
        mtp_h = torch.chunk(captured["h"], 1 + d.mtp_layers, dim=0)[1]
        mtp_logits, _ = model.output_layer(mtp_h)
        # log-probs and frozen-MTP training run the model without its MTP block (the trainer's switch)
        from slime.backends.megatron.model import freeze_mtp, mtp_skipped

        captured.clear()
        with mtp_skipped(model):
            skipped = model(input_ids=ids, position_ids=torch.arange(SEQ)[None], attention_mask=None)
    skip_ok = "h" not in captured and torch.equal(skipped, logits) and model.config.mtp_num_layers == d.mtp_layers
    frozen = freeze_mtp(model)
    frozen_ok = frozen == sum(1 for n in names if n.startswith("mtp.") and not n.endswith("expert_bias")) and all(
        not p.requires_grad for p in model.mtp.parameters()) and model.decoder.layers[0].input_layernorm.weight.requires_grad
    lp = torch.log_softmax(logits[..., : d.vocab].float(), -1)
    mtp_lp = torch.log_softmax(mtp_logits.transpose(0, 1)[..., : d.vocab].float(), -1)[:, : SEQ - 1]
    main_diff = (lp - saved["lp"]).abs()
    mtp_diff = (mtp_lp - saved["mtp_lp"]).abs()
    return {"names_match": names == sorted(hm.iter_mcore_names(d)), "export_bitwise": export_bitwise,
            "exported": len(exported), "mtp_exported": len(mtp_exported), "roundtrip_bitwise": roundtrip,
            "roundtrip_tensors": len(src), "carried_file": carried, "mtp_from_dist": mtp_from_dist,
            "mtp_params": sum(1 for n in names if n.startswith("mtp.")), "skip_ok": skip_ok, "frozen_ok": frozen_ok,
            "main_max_abs_dlogp": float(main_diff.max()), "mtp_max_abs_dlogp": float(mtp_diff.max()),
            "mtp_mean_abs_dlogp": float(mtp_diff.mean()),
            "mtp_modules": sorted({type(m).__name__ for m in model.mtp.modules()})}


@pytest.mark.parametrize("family", sorted(CASES))
def test_megatron_mtp_head_predicts_the_token_after_next_like_the_published_layer(tmp_path, family):
    missing = missing_parts(family)  # checked here, not at import: the subprocesses import this file too
    if missing:
        pytest.skip(f"needs {missing}")
    sys.path.insert(0, str(ROOT / "tools"))
    import reference_models as rm

    hf32, spec = rm.build(family, tmp_path / "fp32", dtype="float32")
    hf16, _ = rm.build(family, tmp_path / "bf16", dtype="bfloat16")
    ref = tmp_path / "hf_lp.pt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    for args in (["hf", family, str(hf32), str(ref)],
                 ["megatron", family, str(spec), str(hf32), str(hf16), str(ref), str(tmp_path)]):
        r = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=900, env=env,
                           cwd=ROOT)
        assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    print(family, res)
    assert {"MultiTokenPredictionBlock", "MultiTokenPredictionLayer"} <= set(res["mtp_modules"])
    assert res["names_match"] and res["export_bitwise"] and res["mtp_exported"] > 4 and res["mtp_params"] > 4
    assert res["roundtrip_bitwise"] and res["mtp_from_dist"], res
    assert res["skip_ok"] and res["frozen_ok"], res
    assert res["carried_file"] == (family == "qwen3_5")  # only the vision tower is carried now
    assert res["main_max_abs_dlogp"] < CASES[family][3], res
    assert res["mtp_max_abs_dlogp"] < CASES[family][3], res


if __name__ == "__main__":
    if sys.argv[1] == "hf":
        _hf_reference(*sys.argv[2:5])
    else:
        print(json.dumps(_megatron(*sys.argv[2:8])))
