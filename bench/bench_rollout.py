"""Rollout speed of the embedded engine against Hugging Face `generate`, same model, same run.

    python bench/bench_rollout.py [--shapes 0.5b,1.5b] [--batches 64,256] [--prompt-len 64]
                                  [--new-tokens 256] [--out bench/results/rollout.json]

Models: Qwen2-shaped, made locally from a config (random init on the device, no hub), bf16 on
the GPU (float32 on a CPU). The final norm's weight is set to 5 so the next-token distribution
is not flat (random init gives near-uniform logits otherwise); speed does not depend on it.
- 0.5b: 24 layers, hidden 896, FFN 4864, 14 heads / 2 KV heads, vocabulary 151,936, tied.
- 1.5b: 28 layers, hidden 1536, FFN 8960, 12 heads / 2 KV heads, vocabulary 151,936, tied.

Per shape and batch: B random prompts of --prompt-len tokens, --new-tokens new tokens each
(stop tokens ignored, temperature 1, no top-k / top-p), one untimed warm-up run, then one timed
run. tokens/s = B x new tokens / wall time. Time to first token = wall time of the same batch
with one new token. Hugging Face: `model.generate(do_sample=True, top_k=0, top_p=1.0,
min_new_tokens=max_new_tokens)` on the same model object, timed the same way.

The memory-bandwidth bound beside each engine figure: a decode step reads every weight once (a tied
embedding once, as the LM head) and the keys and values of every row's context, so at batch B,
with the context averaged over the run (prompt + (new + 1) / 2 positions), tokens/s cannot exceed
B x bandwidth / bytes read per step. The bandwidth is the device's published peak (DEVICE_TB_S, by
name) or --bandwidth-tb-s; the bench prints the bound and the engine's share of it.

Checks on the first shape at the smallest batch: the same fixed seeds twice give the same tokens
and log-probs; the engine's log-probs against one full forward pass of the same model (what the
trainer recomputes) over prompt + response: mean and max |delta|.

    python bench/bench_rollout.py --tiny-recipe

The CPU path as the tiny recipe uses it: its model (tools/tiny/prepare.py), float32, one torch
thread; 16 prompts x 8 samples, 4 new tokens each (the recipe's rollout shape), sent as 128
single-row requests from 32 threads (as the rollout client sends them) and as one 128-row request.
Uses only EngineCore's public API, so the same command times an older checkout.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import threading
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SHAPES = {
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2),
    # a smoke test of this script on a CPU, not a measurement
    "smoke": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2),
}


# Published peak memory bandwidth (TB/s) by a piece of torch.cuda.get_device_name(); first match wins.
DEVICE_TB_S = (("H200", 4.8), ("H100 NVL", 3.9), ("H100 PCIe", 2.0), ("H100", 3.35), ("A100-SXM4-80GB", 2.039),
               ("A100", 1.555))


def device_bandwidth_tb_s(name: str) -> float | None:
    return next((tb for piece, tb in DEVICE_TB_S if piece in name), None)


def decode_step_bytes(model, batch: int, context: float) -> dict[str, float]:
    """Bytes one decode step must read at `batch` rows of `context` positions each: every weight once
    (parameters() yields a tied embedding once) and each row's keys and values in every layer."""
    cfg = model.config
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    elem = next(model.parameters()).element_size()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    kv = cfg.num_hidden_layers * 2 * kv_heads * head_dim * elem * context * batch
    return {"weights": float(weights), "kv": float(kv), "total": float(weights + kv)}


def bandwidth_bound(model, batch: int, prompt_len: int, new_tokens: int, tb_s: float) -> dict[str, float]:
    """The tokens/s a decode loop cannot exceed at `tb_s` TB/s: step j attends prompt_len + j + 1 positions."""
    step = decode_step_bytes(model, batch, prompt_len + (new_tokens + 1) / 2)
    return {"bytes_per_step": step["total"], "weight_bytes": step["weights"], "kv_bytes_per_step": step["kv"],
            "tb_s": tb_s, "tok_s": batch * tb_s * 1e12 / step["total"]}


def build(shape: str, device, dtype):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=151_936, max_position_embeddings=32_768, tie_word_embeddings=True,
                      rms_norm_eps=1e-6, rope_theta=1_000_000.0, **SHAPES[shape])
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg).to(dtype).eval()
    with torch.no_grad():
        model.model.norm.weight.fill_(5.0)
    return model


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def engine_run(batcher, prompts, new_tokens, seeds=None, **sp):
    from slime.inference.sampler import RowParams

    params = [RowParams(max_new_tokens=new_tokens, ignore_eos=True,
                        seed=None if seeds is None else seeds[i], **sp) for i in range(len(prompts))]
    return batcher.run(prompts, params)


def timed(fn, device) -> tuple[float, object]:
    sync(device)
    t = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t, out


def hf_generate(model, ids, new_tokens):
    import torch

    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=0,
                              top_p=1.0, temperature=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              pad_token_id=0, eos_token_id=None)


def logprob_check(model, prompts, rows, chunk: int = 16) -> dict:
    import torch

    deltas = []
    for i in range(0, len(rows), chunk):
        seqs = [p + r.output_ids for p, r in zip(prompts[i:i + chunk], rows[i:i + chunk])]
        ids = torch.tensor(seqs, device=next(model.parameters()).device)
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=ids).logits.float(), -1)
        for j, (p, r) in enumerate(zip(prompts[i:i + chunk], rows[i:i + chunk])):
            pos = torch.arange(len(p) - 1, len(p) - 1 + len(r.output_ids), device=ids.device)
            ref = lp[j, pos, torch.tensor(r.output_ids, device=ids.device)].cpu()
            deltas.append((torch.tensor(r.logprobs) - ref).abs())
    d = torch.cat(deltas)
    mean_lp = sum(sum(r.logprobs) for r in rows) / sum(len(r.logprobs) for r in rows)
    return {"tokens": int(d.numel()), "mean_abs_delta": float(d.mean()), "max_abs_delta": float(d.max()),
            "mean_logprob": mean_lp}


def step_breakdown(batcher, b: int, vocab: int) -> dict:
    """Device time of one decode step's parts at batch b (median of 20, CUDA events)."""
    import numpy as np
    import torch

    from slime.inference.sampler import TruncationPlan, choose_tokens

    def med(fn) -> float:
        times = []
        for _ in range(20):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e))
        return float(np.median(times))

    dec = batcher.decoder
    logits = torch.randn(b, vocab, device="cuda", dtype=torch.bfloat16)
    ones, none = torch.ones(b, device="cuda"), torch.full((b,), -1, device="cuda", dtype=torch.long)
    u = torch.rand(b, device="cuda", dtype=torch.float64)
    k50 = torch.full((b,), 50, device="cuda", dtype=torch.long)
    p95 = torch.full((b,), 0.95, device="cuda")
    plan = TruncationPlan.of(np.full(b, 50), np.full(b, 0.95), vocab)
    return {"decode_graph_len256": med(lambda: dec.decode(b, 255)),
            "sample_plain": med(lambda: choose_tokens(logits, ones, none, ones, u, TruncationPlan([], 0))),
            "sample_topk50_topp095": med(lambda: choose_tokens(logits, ones, k50, p95, u, plan))}


def tiny_recipe(repeats: int = 3) -> int:
    import os
    import random
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    import torch

    sys.path.insert(0, str(REPO / "tools" / "tiny"))
    import prepare

    from slime.inference.engine_core import EngineCore, GenerateRequest, new_rid
    from slime.inference.sampler import RowParams

    torch.set_num_threads(1)
    root = tempfile.mkdtemp(prefix="tiny-recipe-")
    with open(os.devnull, "w") as quiet:
        stdout, sys.stdout = sys.stdout, quiet
        try:
            prepare.main(["--model-dir", root + "/model", "--data-dir", root + "/data"])
        finally:
            sys.stdout = stdout
    core = EngineCore(root + "/model", seed=0)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 14) for _ in range(rng.randrange(20, 30))] for _ in range(16)]
    rows = [p for p in prompts for _ in range(8)]

    def one(p):
        return core.generate(GenerateRequest([p], [RowParams(max_new_tokens=4)], [new_rid()]))

    for _ in range(repeats):
        t = time.perf_counter()
        with ThreadPoolExecutor(32) as ex:
            list(ex.map(one, rows))
        singles = time.perf_counter() - t
        t = time.perf_counter()
        core.generate(GenerateRequest(rows, [RowParams(max_new_tokens=4)] * len(rows), [new_rid() for _ in rows]))
        batched = time.perf_counter() - t
        print(f"128 single-row requests: {1000 * singles:.0f} ms; one 128-row request: {1000 * batched:.0f} ms")
    return 0


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of TB/s; give e.g. 4.8") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a bandwidth must be above 0 TB/s (e.g. 4.8 for an H200)")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="0.5b,1.5b")
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--no-hf", action="store_true", help="skip Hugging Face generate")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "rollout.json"))
    ap.add_argument("--tiny-recipe", action="store_true", help="time the tiny CPU recipe's rollout shape instead")
    ap.add_argument("--bandwidth-tb-s", type=_positive, default=None,
                    help="the device's memory bandwidth for the bound (default: DEVICE_TB_S by the device's name)")
    a = ap.parse_args(argv)
    if a.tiny_recipe:
        return tiny_recipe()

    import torch
    import transformers

    from slime.inference.batcher import ContinuousBatcher

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    batches = [int(b) for b in a.batches.split(",")]
    res: dict = {"machine": {"device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor(),
                             "torch": torch.__version__, "transformers": transformers.__version__,
                             "python": platform.python_version(), "dtype": str(dtype)},
                 "prompt_len": a.prompt_len, "new_tokens": a.new_tokens, "runs": [], "checks": {}}
    tb_s = a.bandwidth_tb_s or (device_bandwidth_tb_s(res["machine"]["device"]) if device.type == "cuda" else None)
    if tb_s is None:
        print("no memory bandwidth known for this device (--bandwidth-tb-s): no bound printed", flush=True)
    table = []
    for si, shape in enumerate(a.shapes.split(",")):
        model = build(shape, device, dtype)
        g = torch.Generator().manual_seed(1)
        for b in batches:
            prompts = torch.randint(10, 150_000, (b, a.prompt_len), generator=g).tolist()
            row = {"shape": shape, "batch": b}
            try:
                batcher = ContinuousBatcher(model, (), torch.Generator().manual_seed(0), threading.Lock())
                engine_run(batcher, prompts, a.new_tokens)  # warm-up: graphs captured here
                engine_run(batcher, prompts, 1)
                t, rows = timed(lambda: engine_run(batcher, prompts, a.new_tokens), device)
                assert all(len(r.output_ids) == a.new_tokens for r in rows)
                row["engine_tok_s"] = b * a.new_tokens / t
                row["engine_s"] = t
                row["engine_ttft_s"], _ = timed(lambda: engine_run(batcher, prompts, 1), device)
                if si == 0 and b == max(batches):
                    t2, _ = timed(lambda: engine_run(batcher, prompts, a.new_tokens, top_k=50, top_p=0.95), device)
                    row["engine_topk50_topp095_tok_s"] = b * a.new_tokens / t2
                    if device.type == "cuda":  # the same engine without CUDA graphs
                        eager = ContinuousBatcher(model, (), torch.Generator().manual_seed(0), threading.Lock(),
                                                  use_graphs=False)
                        engine_run(eager, prompts, 8)
                        t3, _ = timed(lambda: engine_run(eager, prompts, a.new_tokens), device)
                        row["engine_eager_tok_s"] = b * a.new_tokens / t3
                if si == 0 and b == max(batches) and device.type == "cuda":
                    res["checks"]["step_breakdown_ms"] = step_breakdown(batcher, b, model.config.vocab_size)
                if si == 0 and b == min(batches):
                    seeds = list(range(1000, 1000 + b))
                    r1 = engine_run(batcher, prompts, a.new_tokens, seeds)
                    r2 = engine_run(batcher, prompts, a.new_tokens, seeds)
                    res["checks"]["same_seeds_twice"] = {
                        "tokens_equal": [r.output_ids for r in r1] == [r.output_ids for r in r2],
                        "logprobs_equal": [r.logprobs for r in r1] == [r.logprobs for r in r2]}
                    res["checks"]["logprobs_vs_full_forward"] = logprob_check(model, prompts, r1)
            except Exception:  # noqa: BLE001 - report, then measure without graphs
                row["engine_error"] = traceback.format_exc()[-2000:]
                print(row["engine_error"], flush=True)
                try:
                    eager = ContinuousBatcher(model, (), torch.Generator().manual_seed(0), threading.Lock(),
                                              use_graphs=False)
                    engine_run(eager, prompts, 8)
                    t, _ = timed(lambda: engine_run(eager, prompts, a.new_tokens), device)
                    row["engine_tok_s"], row["engine_mode"] = b * a.new_tokens / t, "eager (graphs failed)"
                except Exception:  # noqa: BLE001
                    row["engine_eager_error"] = traceback.format_exc()[-2000:]
            if not a.no_hf:
                try:
                    ids = torch.tensor(prompts, device=device)
                    hf_generate(model, ids, 8)  # warm-up
                    t, out = timed(lambda: hf_generate(model, ids, a.new_tokens), device)  # noqa: F821 - bound by the loop (ruff reads the del below)
                    assert out.shape[1] == a.prompt_len + a.new_tokens
                    row["hf_tok_s"] = b * a.new_tokens / t
                    row["hf_s"] = t
                    row["hf_ttft_s"], _ = timed(lambda: hf_generate(model, ids, 1), device)  # noqa: F821
                except Exception:  # noqa: BLE001
                    row["hf_error"] = traceback.format_exc()[-2000:]
            if "engine_tok_s" in row and "hf_tok_s" in row:
                row["speedup"] = row["engine_tok_s"] / row["hf_tok_s"]
            if tb_s:
                row["bandwidth_bound"] = bandwidth_bound(model, b, a.prompt_len, a.new_tokens, tb_s)
                if "engine_tok_s" in row:
                    row["engine_share_of_bound"] = row["engine_tok_s"] / row["bandwidth_bound"]["tok_s"]
            res["runs"].append(row)
            table.append(row)
            print(json.dumps(row), flush=True)
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps(res, indent=1))  # what is done survives a time limit
            if device.type == "cuda":
                torch.cuda.empty_cache()
        del model
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res["checks"], indent=1))
    print(f"{'shape':6} {'batch':>5} {'engine tok/s':>12} {'HF tok/s':>9} {'x':>5} {'TTFT ms':>8} {'HF TTFT ms':>10}"
          f" {'bound tok/s':>11} {'of bound':>8}")
    nan = float("nan")
    for r in table:
        print(f"{r['shape']:6} {r['batch']:>5} {r.get('engine_tok_s', nan):>12.0f} "
              f"{r.get('hf_tok_s', nan):>9.0f} {r.get('speedup', nan):>5.2f} "
              f"{1000 * r.get('engine_ttft_s', nan):>8.1f} {1000 * r.get('hf_ttft_s', nan):>10.1f} "
              f"{r.get('bandwidth_bound', {}).get('tok_s', nan):>11.0f} {100 * r.get('engine_share_of_bound', nan):>7.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
