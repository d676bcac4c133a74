"""The Megatron backend on a real GPU: conversion round trip, refusal, HF/Megatron forward
agreement, a GRPO step with the embedded rollout engine (KL 0 at step 1), weight export into the
engine, and torch_dist save/load. Run with tools/run_gpu_tests.sh on the GPU machine.
"""

from __future__ import annotations

import random

import pytest
from gpu_helpers import record, run_tool, spec_text

pytestmark = pytest.mark.gpu


def _load_all(d):
    from safetensors.torch import load_file

    out = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _trainer(tiny, converted=None, lr=1e-4, kl=False, dynamic=None, **loss_kw):
    from slime.backends.megatron.model_args import load_flags
    from slime.backends.megatron.trainer import MegatronTrainer
    from slime.config import BatchConfig, LossConfig, ModelConfig, OptimConfig

    hf, spec = tiny
    flags = load_flags(spec)
    model = ModelConfig(hf_checkpoint=str(hf), load=str(converted) if converted else None)
    batch = BatchConfig(use_dynamic_batch_size=dynamic is not None, max_tokens_per_gpu=dynamic)
    return MegatronTrainer(flags, model, OptimConfig(lr=lr, weight_decay=0.0),
                           LossConfig(use_kl_loss=kl, kl_loss_coef=0.01 if kl else 0.0, kl_loss_type="low_var_kl",
                                      **loss_kw), batch)


def _records(n, lens, prompt_len=1, seed=0):
    from slime.data.train_data import TrainRecord

    rng = random.Random(seed)
    out = []
    for i in range(n):
        L = lens[i % len(lens)]
        toks = [rng.randrange(2, 1000) for _ in range(L)]
        out.append(TrainRecord(toks, prompt_len, 0.0, [], [1] * (L - prompt_len)))
    return out


# --- conversion ---------------------------------------------------------------------------------


def test_hf_torch_dist_hf_round_trip_is_identical(tiny, converted):
    hf, spec = tiny
    back = hf.parent / "hf_back"
    r = run_tool("tools/convert_torch_dist_to_hf.py", "--model-args", str(spec), "--load", str(converted),
                 "--save", str(back), "--hf-template", str(hf))
    assert r.returncode == 0, r.stderr[-2000:]
    a, b = _load_all(hf), _load_all(back)
    assert set(a) == set(b)
    same = [k for k in a if a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and (a[k] == b[k]).all()]
    record("roundtrip_tensors_identical", f"{len(same)}/{len(a)}")
    assert len(same) == len(a)
    assert "[convert" in r.stdout  # progress is printed


def test_mismatched_config_is_refused_before_any_weight_moves(tiny):
    hf, _ = tiny
    bad = hf.parent / "bad.sh"
    bad.write_text(spec_text(**{"num-layers": 5, "num-query-groups": 4}))
    out = hf.parent / "should_not_exist"
    r = run_tool("tools/convert_hf_to_torch_dist_megatron.py", "--model-args", str(bad), "--hf-checkpoint", str(hf),
                 "--save", str(out))
    assert r.returncode == 2
    assert "num_hidden_layers = 6 in config.json" in r.stderr and "--num-layers 5" in r.stderr
    assert "num_key_value_heads = 2" in r.stderr and not out.exists()
    record("mismatch_refusal", r.stderr.strip().splitlines()[:3])


# --- forward agreement --------------------------------------------------------------------------


def test_megatron_and_hf_forwards_agree(tiny, converted):
    import torch
    from transformers import AutoModelForCausalLM

    from slime.backends.megatron import attention

    hf, _ = tiny
    recs = _records(8, [37, 128, 301, 512, 1000, 64, 700, 2048])
    tr = _trainer(tiny, converted)
    mg = tr.log_probs(recs)
    attention.FORCE_LOOP = True
    mg_loop = tr.log_probs(recs)
    attention.FORCE_LOOP = False
    ref = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
    diffs, loop_diffs = [], []
    with torch.no_grad():
        for r, m, ml in zip(recs, mg, mg_loop):
            ids = torch.tensor([r.tokens], device="cuda")
            logits = ref(input_ids=ids).logits[0, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
            diffs.append((lp - torch.tensor(m, device="cuda")).abs())
            loop_diffs.append((torch.tensor(ml) - torch.tensor(m)).abs())
    d = torch.cat(diffs)
    ld = torch.cat(loop_diffs)
    res = {"mean_abs_dlogp": float(d.mean()), "max_abs_dlogp": float(d.max()), "tokens": int(d.numel()),
           "mean_logp_hf": float(torch.cat([torch.tensor(m) for m in mg]).mean()),
           "varlen_vs_loop_max": float(ld.max()), "model": "Qwen2 6L h512 8/2 heads vocab 1000, bf16"}
    record("forward_agreement_bf16", res)
    assert res["mean_abs_dlogp"] < 0.05 and res["max_abs_dlogp"] < 1.0

    # packing several sequences into one THD row must not change any log-prob
    packed_tr_out = None
    from slime.config import BatchConfig

    tr.batch_cfg = BatchConfig(use_dynamic_batch_size=True, max_tokens_per_gpu=4096)
    packed_tr_out = tr.log_probs(recs)
    pd = max(max(abs(a - b) for a, b in zip(x, y)) for x, y in zip(packed_tr_out, mg))
    record("packed_vs_unpacked_max_abs_dlogp", pd)
    assert pd < 0.05


# --- GRPO step with the embedded rollout engine -------------------------------------------------


def test_grpo_step_with_embedded_engine_kl_zero_then_sync(tiny, converted, tmp_path):
    import torch

    from slime.data.sample import Sample
    from slime.data.train_data import build_records
    from slime.inference.engine_core import EngineCore, GenerateRequest, new_rid
    from slime.inference.sampler import RowParams

    hf, _ = tiny
    engine = EngineCore(str(hf), seed=1)
    engine.model.to(torch.bfloat16)  # same precision as the trainer
    n, prompts = 4, 4
    rng = random.Random(3)
    prompt_ids = [[rng.randrange(2, 1000) for _ in range(rng.randrange(8, 40))] for _ in range(prompts)]
    req = GenerateRequest([p for p in prompt_ids for _ in range(n)],
                          [RowParams(max_new_tokens=48, temperature=1.0, ignore_eos=True) for _ in range(prompts * n)],
                          [new_rid() for _ in range(prompts * n)])
    outs = engine.generate(req)
    samples = []
    for i, o in enumerate(outs):
        toks = o["output_ids"]
        s = Sample(prompt_id=i // n, group_index=i // n, prompt="", prompt_tokens=prompt_ids[i // n],
                   response_tokens=toks, rollout_log_probs=[x[0] for x in o["meta_info"]["output_token_logprobs"]])
        s.reward = sum(t < 500 for t in toks) / max(len(toks), 1)  # a verifiable toy reward
        samples.append(s)
    records = build_records(samples, n, prompts, "grpo", True, True)

    tr = _trainer(tiny, converted, lr=1e-4, kl=True, dynamic=4096)
    m1 = tr.train(records, 1)
    m2 = tr.train(records, 1)
    res = {"step1_kl_loss": m1["train/kl_loss"], "step1_ppo_kl": m1["train/ppo_kl"],
           "step1_pg_loss": m1["train/pg_loss"], "step1_grad_norm": m1.get("train/grad_norm"),
           "step1_train_rollout_logp_abs_diff": m1["train/train_rollout_logp_abs_diff"],
           "step2_kl_loss": m2["train/kl_loss"], "rollout": "embedded engine (EngineCore, in-process, bf16)",
           "samples": len(records)}
    record("grpo_step", res)
    assert m1["train/kl_loss"] == 0.0 and m1["train/ppo_kl"] == 0.0
    assert m2["train/kl_loss"] > 0.0  # the reference stays put while the policy moves

    # weight sync: export HF-named buckets into the engine, then both must hold the same weights
    buckets = list(tr.export_hf_weights(bucket_bytes=4 * 2**20))
    for i, b in enumerate(buckets):
        engine.update_from_named({k: v for k, v in b}, version=1, last_bucket=i == len(buckets) - 1)
    exported = {k: v for b in buckets for k, v in b}
    params = dict(engine.model.named_parameters())
    assert set(exported) == set(params)
    assert all(torch.equal(params[k].data, exported[k].to(params[k].dtype)) for k in exported)
    assert engine.weight_version == "1"
    after = engine.generate(GenerateRequest([prompt_ids[0]], [RowParams(max_new_tokens=8)], [new_rid()]))
    assert len(after[0]["output_ids"]) > 0
    record("weight_sync", {"buckets": len(buckets), "tensors": len(exported)})

    # torch_dist save (with optimizer) -> train on -> load restores the saved weights exactly
    snap = {k: v.clone() for k, v in exported.items()}
    tr.save(tmp_path / "ckpt")
    tr.train(records, 1)
    tr.load(tmp_path / "ckpt")
    again = {k: v for b in tr.export_hf_weights() for k, v in b}
    assert all(torch.equal(again[k], snap[k]) for k in snap)
    # and the saved checkpoint (optimizer state inside) converts to HF with the same tensors
    out = tmp_path / "hf_from_train"
    r = run_tool("tools/convert_torch_dist_to_hf.py", "--model-args", str(tiny[1]), "--load", str(tmp_path / "ckpt"),
                 "--save", str(out), "--hf-template", str(hf))
    assert r.returncode == 0, r.stderr[-2000:]
    conv = _load_all(out)
    assert all(torch.equal(conv[k], snap[k].cpu()) for k in snap)
    record("train_checkpoint_roundtrip", "save/load and torch_dist->HF identical")


def _adam_states(tr):
    inner = [o.optimizer for o in (getattr(tr.optimizer, "chained_optimizers", None) or [tr.optimizer])]
    return [(float(st["step"]), st["exp_avg"].clone(), st["exp_avg_sq"].clone())
            for opt in inner for g in opt.param_groups for p in g["params"] for st in [opt.state[p]]]


def test_resume_loads_into_a_fresh_trainer_with_its_adam_state(tiny, converted, tmp_path):
    """`--load` builds a new trainer and loads before its first step (a fresh optimizer has no Adam
    state yet): the weights and the optimizer's moments and step come back exactly."""
    import torch

    tr = _trainer(tiny, converted, lr=1e-3)
    records = _records(8, [12, 7, 20, 5], prompt_len=2)
    for i, r in enumerate(records):
        r.advantage = 1.0 if i % 2 else -1.0
    tr.train(records, 1)
    tr.train(records, 1)
    saved = {k: v.clone() for b in tr.export_hf_weights() for k, v in b}
    states = _adam_states(tr)
    tr.save(tmp_path / "ckpt")
    fresh = _trainer(tiny, tmp_path / "ckpt", lr=1e-3)  # ModelConfig(load=...): the resume path
    loaded = {k: v for b in fresh.export_hf_weights() for k, v in b}
    assert set(loaded) == set(saved) and all(torch.equal(loaded[k], saved[k]) for k in saved)
    again = _adam_states(fresh)
    assert len(again) == len(states) and states[0][0] == 2.0
    diffs = [(a[0], b[0], float((a[1] - b[1]).abs().max()), float((a[2] - b[2]).abs().max()), float(a[1].abs().max()))
             for a, b in zip(states, again)]
    assert all(d[0] == d[1] and d[2] == 0 and d[3] == 0 for d in diffs), diffs[:3]
    record("resume_fresh_trainer", {"params": len(states), "adam_step": states[0][0]})


def test_cpu_adam_offload_trains(tiny, converted):
    """--optimizer-cpu-offload: Adam states and step on the CPU (megatron's HybridDeviceOptimizer)."""
    import torch

    from slime.backends.megatron.model_args import load_flags
    from slime.backends.megatron.trainer import MegatronTrainer
    from slime.config import BatchConfig, LossConfig, ModelConfig, OptimConfig

    hf, spec = tiny
    flags = {**load_flags(spec), "optimizer_cpu_offload": True}
    tr = MegatronTrainer(flags, ModelConfig(hf_checkpoint=str(hf), load=str(converted)), OptimConfig(lr=1e-3),
                         LossConfig(use_rollout_logprobs=True), BatchConfig(use_dynamic_batch_size=True, max_tokens_per_gpu=4096))
    recs = _records(8, [64, 200], prompt_len=16)
    for i, r in enumerate(recs):
        r.advantage = 1.0 if i % 2 else -1.0
        r.rollout_log_probs = [-6.9] * r.response_len
    before = {k: v.clone() for b in tr.export_hf_weights() for k, v in b}
    m = tr.train(recs, 1)
    after = {k: v for b in tr.export_hf_weights() for k, v in b}
    changed = sum(not torch.equal(before[k], after[k]) for k in before)
    record("cpu_adam_offload", {"changed_tensors": f"{changed}/{len(before)}", "grad_norm": m.get("train/grad_norm"),
                                "optimizer": type(tr.optimizer).__name__})
    assert changed > len(before) // 2


def test_megatron_trains_sc_advantages_from_its_own_old_log_probs(tiny, converted):
    """--use-sc: each record's advantage is its centred importance-weighted reward, computed from
    the Megatron trainer's own old log-probs (slime/training/advantages.py); REINFORCE, no clipping."""
    import math

    tr = _trainer(tiny, converted, lr=0.0, use_sc=True, tis_clip=2.0)
    recs = _records(4, [24, 40], prompt_len=8, seed=3)
    for i, r in enumerate(recs):
        r.reward, r.group = float(i % 2), i // 2
        r.rollout_log_probs = [-7.0] * r.response_len
    old = tr.log_probs(recs)
    m = tr.train(recs, 1)
    w = [min(math.exp(sum(o) - sum(r.rollout_log_probs)), 2.0) for o, r in zip(old, recs)]
    s = [wi * r.reward for wi, r in zip(w, recs)]
    want = [s[i] - (s[2 * (i // 2)] + s[2 * (i // 2) + 1]) / 2 for i in range(4)]
    record("megatron_sc", {"advantages": [r.advantage for r in recs], "expected": want})
    assert [r.advantage for r in recs] == pytest.approx(want, rel=1e-4, abs=1e-5)
    assert m["train/pg_clipfrac"] == 0.0


def test_megatron_train_reports_its_sub_phases_inside_its_own_time(tiny, converted):
    """The phase timeline's trainer part (slime/timeline.py): old and reference log-probs, packing,
    forward/backward and the optimizer step, each timed after the GPU's queued kernels, all within
    the trainer's own perf/train_seconds."""
    from slime.timeline import TRAINER_PHASES

    tr = _trainer(tiny, converted, lr=1e-4, kl=True, dynamic=4096)
    recs = _records(8, [64, 200], prompt_len=16)
    for i, r in enumerate(recs):
        r.advantage = 1.0 if i % 2 else -1.0
        r.rollout_log_probs = [-6.9] * r.response_len
    m = tr.train(recs, 1)
    phases = {p: m[f"phase/{p}"] for p in TRAINER_PHASES}
    record("megatron_sub_phases", {**phases, "train_seconds": m["perf/train_seconds"]})
    assert all(v > 0 for v in phases.values()), phases
    assert sum(phases.values()) <= m["perf/train_seconds"]
