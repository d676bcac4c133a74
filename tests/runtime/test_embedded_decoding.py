"""The embedded engine's decoding: static-KV-slot forward, device sampling, continuous batching.
Real (small, randomly initialised) Hugging Face models on the CPU in float32."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from slime.inference.batcher import ContinuousBatcher
from slime.inference.decoder import (
    RecomputeDecoder,
    SlotDecoder,
    fast_path_supported,
)
from slime.inference.sampler import (
    RowParams,
    TruncationPlan,
    choose_tokens,
    row_uniforms,
)

pytestmark = pytest.mark.timeout(120)


def _model(kind: str):
    import transformers

    torch.manual_seed(0)
    common = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    cfg = {"qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config,
           "llama": transformers.LlamaConfig}[kind](**common)
    cls = {"qwen2": transformers.Qwen2ForCausalLM, "qwen3": transformers.Qwen3ForCausalLM,
           "llama": transformers.LlamaForCausalLM}[kind]
    model = cls(cfg).eval()
    with torch.no_grad():  # random init is near-uniform; sharpen so sampling choices matter
        model.lm_head.weight.mul_(8)
    return model


def _batcher(model, **kw) -> ContinuousBatcher:
    return ContinuousBatcher(model, (), torch.Generator().manual_seed(0), threading.Lock(), **kw)


def _prompts(n: int, seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 97, size=int(rng.integers(3, 12))).tolist() for _ in range(n)]


def _full_forward_logprobs(model, prompt, out, temperature=1.0):
    ids = torch.tensor([prompt + out])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float() / temperature
    lp = torch.log_softmax(logits, -1)
    return [float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(out)]


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama"])
def test_logprobs_match_a_full_forward_of_the_same_model(kind):
    model = _model(kind)
    assert fast_path_supported(model)
    prompts = _prompts(5)
    params = [RowParams(max_new_tokens=12, temperature=t, ignore_eos=True, seed=i)
              for i, t in enumerate([1.0, 0.7, 1.3, 1.0, 0.9])]
    rows = _batcher(model).run(prompts, params)
    for p, rp, r in zip(prompts, params, rows):
        assert len(r.output_ids) == 12 and r.finish_type == "length"
        ref = _full_forward_logprobs(model, p, r.output_ids, rp.temperature)
        assert max(abs(a - b) for a, b in zip(r.logprobs, ref)) < 1e-4


def test_fixed_seeds_give_the_same_tokens_twice_and_whatever_rows_share_the_batch():
    model = _model("qwen2")
    prompts = _prompts(6)
    params = [RowParams(max_new_tokens=10, ignore_eos=True, seed=100 + i) for i in range(6)]
    a = _batcher(model).run(prompts, params)
    b = _batcher(model).run(prompts, params)
    assert [r.output_ids for r in a] == [r.output_ids for r in b]
    assert [r.logprobs for r in a] == [r.logprobs for r in b]
    alone = _batcher(model).run(prompts[2:3], params[2:3])[0]  # same row, no companions
    assert alone.output_ids == a[2].output_ids
    assert np.allclose(alone.logprobs, a[2].logprobs, atol=1e-5)
    other = _batcher(model).run(prompts[:1], [RowParams(max_new_tokens=10, ignore_eos=True, seed=7)])[0]
    assert other.output_ids != a[0].output_ids  # the seed matters


def test_recompute_fallback_samples_the_same_tokens_as_the_kv_slot_path():
    model = _model("qwen2")
    prompts = _prompts(4, seed=3)
    params = [RowParams(max_new_tokens=8, ignore_eos=True, seed=i, top_p=0.9) for i in range(4)]
    fast = _batcher(model).run(prompts, params)
    slow_b = _batcher(model)
    slow_b.decoder = RecomputeDecoder(model)
    slow = slow_b.run(prompts, params)
    assert [r.output_ids for r in fast] == [r.output_ids for r in slow]
    assert np.allclose([r.logprobs for r in fast], [r.logprobs for r in slow], atol=1e-4)


def test_top_k_and_top_p_keep_only_the_truncated_set_and_logprobs_stay_untruncated():
    torch.manual_seed(0)
    logits = torch.randn(6, 50) * 3
    top_k = torch.tensor([-1, 1, 5, -1, 3, 50])
    top_p = torch.tensor([1.0, 1.0, 1.0, 0.5, 0.9, 1.0])
    temp = torch.tensor([1.0, 1.0, 0.8, 1.0, 1.2, 1.0])
    plan = TruncationPlan.of(top_k.numpy(), top_p.numpy(), 50)
    assert plan.rows == [1, 2, 3, 4] and plan.k == 50  # row 3 (top-p alone) needs a full ranking
    assert TruncationPlan.of(np.array([-1, 4]), np.array([1.0, 1.0]), 50).k == 4  # top-k alone: topk(4)
    assert TruncationPlan.of(np.array([-1, 50]), np.array([1.0, 1.0]), 50).rows == []  # nothing to cut
    scaled = logits / temp[:, None]
    order = scaled.argsort(-1, descending=True)
    probs = torch.softmax(scaled, -1)
    seen = [set() for _ in range(6)]
    for step in range(300):
        u = torch.from_numpy(row_uniforms(np.arange(6, dtype=np.uint64), np.full(6, step, dtype=np.uint64)))
        tok, lp = choose_tokens(logits, temp, top_k, top_p, u, plan)
        assert torch.allclose(lp, torch.log_softmax(scaled, -1).gather(1, tok[:, None])[:, 0], atol=1e-6)
        for i, t in enumerate(tok.tolist()):
            seen[i].add(t)
    assert seen[1] == {int(order[1, 0])}  # top_k 1 is greedy
    assert seen[2] <= set(order[2, :5].tolist()) and len(seen[2]) > 1
    nucleus = int((probs[3, order[3]].cumsum(0) - probs[3, order[3]] < 0.5).sum())
    assert seen[3] <= set(order[3, :nucleus].tolist())
    assert seen[4] <= set(order[4, :3].tolist())
    assert len(seen[0]) > 5 and len(seen[5]) > 5  # untruncated rows range over the vocabulary


def test_uniforms_are_counter_based_and_cover_the_unit_interval():
    seeds = np.repeat(np.arange(50, dtype=np.uint64), 200)
    steps = np.tile(np.arange(200, dtype=np.uint64), 50)
    u = row_uniforms(seeds, steps)
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.01
    assert np.array_equal(u, row_uniforms(seeds, steps))
    assert len(np.unique(u)) == len(u)


def test_a_request_joins_a_running_batch_between_steps_and_a_finished_row_frees_its_slot():
    model = _model("qwen2")
    b = _batcher(model, max_running=2)
    b.step_delay_s = 0.01
    out: dict[str, object] = {}

    def long():
        out["long"] = b.run(_prompts(1), [RowParams(max_new_tokens=60, ignore_eos=True, seed=1)])
        out["long_done"] = time.monotonic()

    t = threading.Thread(target=long)
    t.start()
    while b.steps < 5:
        time.sleep(0.005)
    short = b.run(_prompts(2, seed=9), [RowParams(max_new_tokens=3, ignore_eos=True, seed=s) for s in (2, 3)])
    short_done = time.monotonic()
    t.join()
    assert all(len(r.output_ids) == 3 for r in short)
    assert short_done < out["long_done"]  # served while the long row was still decoding
    assert len(out["long"][0].output_ids) == 60
    # max_running 2: the second short row waited for the first's slot, yet no step ran more rows
    assert b.decoder.slots == 2 and b.running() == 0


def test_an_aborted_row_leaves_at_once_and_the_others_continue():
    model = _model("qwen2")
    b = _batcher(model)
    b.step_delay_s = 0.005
    flag = threading.Event()
    res: list = []
    t = threading.Thread(target=lambda: res.extend(b.run(
        _prompts(3), [RowParams(max_new_tokens=40, ignore_eos=True, seed=s) for s in range(3)],
        lambda i: i == 1 and flag.is_set())))
    t.start()
    while b.steps < 3:
        time.sleep(0.002)
    flag.set()
    t.join()
    assert res[1].finish_type == "abort" and len(res[1].output_ids) < 40
    assert [r.finish_type for r in (res[0], res[2])] == ["length", "length"]
    assert all(len(r.output_ids) == 40 for r in (res[0], res[2]))


def test_stop_tokens_end_a_row_and_report_the_match():
    model = _model("qwen2")
    prompts = _prompts(1)
    free = _batcher(model).run(prompts, [RowParams(max_new_tokens=10, ignore_eos=True, seed=4)])[0]
    stop = free.output_ids[3]
    first = free.output_ids.index(stop)
    r = _batcher(model).run(prompts, [RowParams(max_new_tokens=10, stop_token_ids=(stop,), seed=4)])[0]
    assert r.finish_type == "stop" and r.matched == stop and r.output_ids == free.output_ids[: first + 1]


def test_slot_decoder_cache_grows_and_keeps_what_it_holds():
    model = _model("llama")
    dec = SlotDecoder(model)
    dec.ensure(1, 10)
    logits_a = dec.prefill([0], [[5, 6, 7]])
    dec.ensure(3, 200)  # grow slots and length: slot 0's keys must survive
    assert dec.slots == 4 and dec.capacity >= 200
    dec.seat([0], logits_a.argmax(-1))
    step = dec.decode(1, 3)
    ref = model(input_ids=torch.tensor([[5, 6, 7, int(logits_a.argmax())]])).logits[0, -1]
    assert torch.allclose(step[0], ref, atol=1e-4)
