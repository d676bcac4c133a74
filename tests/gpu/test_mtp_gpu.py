"""The MTP layer of the Megatron backend on a real GPU, in bf16, for the families whose published
checkpoints have one (DeepSeek-V3, GLM-4.7 / GLM-4.7-Flash, Qwen3.5), from their tiny reference
checkpoints: the MTP block survives HF -> torch_dist -> HF bit for bit, its head predicts the token
after next as the published formula does on transformers' parts
(tools/reference_models.mtp_reference_log_probs), weight sync exports it under the names SGLang's
EAGLE draft reads, and in training it is frozen unless ``--enable-mtp-training``, which trains it on
its own loss without moving the policy's first step. tests/runtime/test_mtp_megatron_cpu.py checks
the same in fp32 on a CPU. Run with tools/run_gpu_tests.sh on the GPU machine."""

from __future__ import annotations

import sys

import pytest
from gpu_helpers import ROOT, record, run_tool

pytestmark = pytest.mark.gpu
sys.path.insert(0, str(ROOT / "tools"))

FAMILIES = ["deepseek_v3", "glm4_moe", "glm4_moe_lite", "qwen3_5"]
SEQ = 256


def _skip_without_family_deps(family: str) -> None:
    import transformers

    if family == "qwen3_5":
        if not hasattr(transformers, "Qwen3_5ForConditionalGeneration"):
            pytest.skip(f"transformers {transformers.__version__} has no qwen3_5 model classes")
        try:
            from megatron.core.ssm.gated_delta_net import HAVE_FLA
        except ImportError as exc:
            pytest.skip(f"megatron-core's gated_delta_net does not import: {exc}")
        if not HAVE_FLA:
            pytest.skip("megatron-core's GatedDeltaNet needs flash-linear-attention: pip install fla-core")


@pytest.fixture(scope="module", params=FAMILIES)
def fam(request, gpu_ready, tmp_path_factory):
    import reference_models as rm

    _skip_without_family_deps(request.param)
    base = tmp_path_factory.mktemp(f"mtp_{request.param}")
    hf, spec = rm.build(request.param, base)
    save = base / "torch_dist"
    r = run_tool("tools/convert_hf_to_torch_dist_megatron.py", "--model-args", str(spec), "--hf-checkpoint", str(hf),
                 "--save", str(save))
    assert r.returncode == 0, r.stderr[-3000:]
    return request.param, hf, spec, save


def _mtp_names(spec) -> set[str]:
    from slime.backends.megatron import hf_mapping as hm
    from slime.model_spec import load_flags

    d = hm.dims_from_flags(load_flags(spec))
    return {n for n in hm.iter_hf_names(d) if n.startswith("mtp.") or n.startswith(f"{d.hf_prefix}layers.{d.num_layers}.")}


def test_mtp_layer_round_trips_bitwise_through_torch_dist(fam):
    from safetensors.torch import load_file

    name, hf, spec, save = fam
    assert not (save / "hf_carried.safetensors").exists() or name == "qwen3_5"  # Qwen3.5 carries its vision tower
    back = hf.parent / "hf_back"
    r = run_tool("tools/convert_torch_dist_to_hf.py", "--model-args", str(spec), "--load", str(save),
                 "--save", str(back), "--hf-template", str(hf))
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = {}, {}
    for f in hf.glob("*.safetensors"):
        a.update(load_file(str(f)))
    for f in back.glob("*.safetensors"):
        b.update(load_file(str(f)))
    mtp = _mtp_names(spec)
    same = [k for k in mtp if k in b and a[k].dtype == b[k].dtype and bool((a[k] == b[k]).all())]
    record(f"{name}/mtp_roundtrip_identical", f"{len(same)}/{len(mtp)}")
    assert mtp and mtp <= set(a) and len(same) == len(mtp)


def test_mtp_head_matches_the_published_formula_in_bf16(fam):
    import reference_models as rm
    import torch

    from slime.backends.megatron import hf_mapping as hm
    from slime.backends.megatron import model as mm
    from slime.backends.megatron.convert import load_model_checkpoint
    from slime.model_spec import load_flags

    name, hf, spec, save = fam
    flags = load_flags(spec)
    d = hm.dims_from_flags(flags)
    mm.init_parallel(flags)
    model = mm.build_model(flags, flags)
    load_model_checkpoint(model, save)
    model.eval()
    ids = torch.randint(1, d.vocab, (1, SEQ), generator=torch.Generator().manual_seed(0))
    captured = {}
    model.mtp.register_forward_hook(lambda m, i, o: captured.__setitem__("h", o))
    with torch.no_grad():
        logits = model(input_ids=ids.cuda(), position_ids=torch.arange(SEQ, device="cuda")[None], attention_mask=None)
        mtp_logits, _ = model.output_layer(torch.chunk(captured["h"], 1 + d.mtp_layers, dim=0)[1])
    lp = torch.log_softmax(logits[..., : d.vocab].float(), -1)
    mtp_lp = torch.log_softmax(mtp_logits.transpose(0, 1)[..., : d.vocab].float(), -1)[:, : SEQ - 1]
    del model
    torch.cuda.empty_cache()
    ref_lp, ref_mtp = rm.mtp_reference_log_probs(name, hf, ids, dtype="bfloat16", device="cuda")
    nxt = ids[0, 1:].cuda()
    after = ids[0, 2:].cuda()
    main = (lp[0, :-1].gather(-1, nxt[:, None]) - ref_lp[0, :-1].gather(-1, nxt[:, None])).abs()
    head = (mtp_lp[0, :-1].gather(-1, after[:, None]) - ref_mtp[0, :-1].gather(-1, after[:, None])).abs()
    res = {"main_mean_abs_dlogp": round(float(main.mean()), 5), "main_max_abs_dlogp": round(float(main.max()), 4),
           "mtp_mean_abs_dlogp": round(float(head.mean()), 5), "mtp_max_abs_dlogp": round(float(head.max()), 4),
           "tokens": int(head.numel()), "dtype": "bf16"}
    record(f"{name}/mtp_head_vs_formula", res)
    assert res["mtp_mean_abs_dlogp"] <= 0.03 and res["main_mean_abs_dlogp"] <= 0.03, res


def _trainer(hf, spec, save, **extra):
    from slime.backends.megatron.trainer import MegatronTrainer
    from slime.config import BatchConfig, LossConfig, ModelConfig, OptimConfig
    from slime.model_spec import load_flags

    return MegatronTrainer({**load_flags(spec), **extra}, ModelConfig(hf_checkpoint=str(hf), load=str(save)),
                           OptimConfig(lr=1e-4, weight_decay=0.0),
                           LossConfig(use_kl_loss=True, kl_loss_coef=0.01, kl_loss_type="low_var_kl"),
                           BatchConfig(use_dynamic_batch_size=True, max_tokens_per_gpu=1024))


def _records():
    import random

    from slime.data.train_data import TrainRecord

    rng = random.Random(0)
    out = []
    for i, n in enumerate([40, 96, 160, 64, 40, 96, 160, 64]):
        toks = [rng.randrange(1, 256) for _ in range(n)]
        out.append(TrainRecord(toks, 4, 1.0 if i % 2 else -1.0, [], [1] * (n - 4)))
    return out


def _one_step(hf, spec, save, own: set[str], **extra):
    import torch

    from slime.data.train_data import TrainRecord

    tr = _trainer(hf, spec, save, **extra)
    recs = _records()
    lps = tr.log_probs(recs)
    recs = [TrainRecord(r.tokens, r.prompt_len, r.advantage, lp, r.response_mask) for r, lp in zip(recs, lps)]
    before = {k: v for k, v in tr.named_weights().items() if k in own}
    m1 = tr.train(recs, 1)
    after = tr.named_weights()
    moved = sorted(k for k in own if not torch.equal(before[k], after[k]))
    del tr
    torch.cuda.empty_cache()
    return m1, after, moved


def test_mtp_layer_is_frozen_unless_mtp_training_and_never_moves_the_policy(fam):

    name, hf, spec, save = fam
    mtp = _mtp_names(spec)
    # the MTP layer's own tensors (DeepSeek / GLM also publish copies of the shared embedding and head)
    own = {k for k in mtp if not k.endswith(("embed_tokens.weight", "shared_head.head.weight"))}
    off, w_off, moved_off = _one_step(hf, spec, save, own)
    on, w_on, moved_on = _one_step(hf, spec, save, own, enable_mtp_training=True, mtp_loss_scaling_factor="0.2")
    policy = [k for k in w_off if k not in own]
    gap = max(float((w_off[k].float() - w_on[k].float()).abs().max()) for k in policy)
    res = {"mtp_own_tensors": len(own), "moved_frozen": len(moved_off), "moved_mtp_training": len(moved_on),
           "mtp_loss": on.get("train/mtp_loss"), "mtp_accuracy": on.get("train/mtp_accuracy"),
           "policy_weights_max_abs_gap_on_vs_off": gap, "step1_kl_loss": [off["train/kl_loss"], on["train/kl_loss"]]}
    record(f"{name}/mtp_training", res)
    assert mtp <= set(w_off) and mtp <= set(w_on)  # weight sync sends the MTP layer (SGLang's EAGLE draft reads it)
    assert not moved_off and "train/mtp_loss" not in off, res  # frozen by default
    # --enable-mtp-training trains it on its own loss
    assert moved_on and on["train/mtp_loss"] > 0.0 and 0.0 <= on["train/mtp_accuracy"] <= 1.0, res
    # its loss is detached from the policy: the policy's step is the same with and without it (bf16
    # weights; MoE scatter order on the GPU may differ in the last bit)
    assert gap <= 2e-3, res
    assert off["train/kl_loss"] == 0.0 and on["train/kl_loss"] == 0.0
