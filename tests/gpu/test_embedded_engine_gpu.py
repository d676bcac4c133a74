"""The embedded engine's decoding on a GPU: CUDA-graph decode steps in bf16, reproducible with
fixed seeds, log-probs within bf16 noise of a full forward. Skips without CUDA."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]


def _model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=5000, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval()
    with torch.no_grad():
        model.model.norm.weight.fill_(4.0)  # a non-flat next-token distribution
    return model


def _run(model, prompts, use_graphs=None, **sp):
    from slime.inference.batcher import ContinuousBatcher
    from slime.inference.sampler import RowParams

    b = ContinuousBatcher(model, (), torch.Generator().manual_seed(0), threading.Lock(), use_graphs=use_graphs)
    rows = b.run(prompts, [RowParams(max_new_tokens=40, ignore_eos=True, seed=i, **sp) for i in range(len(prompts))])
    return b, rows


def test_graph_decoding_is_reproducible_and_matches_a_full_forward_in_bf16():
    model = _model()
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(1, 5000, (int(n),), generator=g).tolist()
               for n in torch.randint(5, 60, (24,), generator=g)]
    b1, r1 = _run(model, prompts)
    assert b1.decoder.graphs, "the decode step should have been captured as CUDA graphs"
    _, r2 = _run(model, prompts)
    assert [r.output_ids for r in r1] == [r.output_ids for r in r2]
    assert [r.logprobs for r in r1] == [r.logprobs for r in r2]
    deltas = []
    for p, r in zip(prompts, r1):
        ids = torch.tensor([p + r.output_ids], device="cuda")
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
        ref = lp[torch.arange(len(p) - 1, len(p) - 1 + 40), torch.tensor(r.output_ids)].cpu()
        deltas.append((torch.tensor(r.logprobs) - ref).abs())
    d = torch.cat(deltas)
    assert float(d.mean()) < 0.05 and float(d.max()) < 0.5, (float(d.mean()), float(d.max()))


def test_graph_and_eager_decoding_agree_and_truncation_runs_on_the_device():
    model = _model()
    prompts = [[7, 8, 9, 10 + i] for i in range(6)]
    _, graphed = _run(model, prompts, top_k=20, top_p=0.9)
    _, eager = _run(model, prompts, use_graphs=False, top_k=20, top_p=0.9)
    same = sum(a == b for x, y in zip(graphed, eager) for a, b in zip(x.output_ids, y.output_ids))
    assert same >= 0.9 * 6 * 40  # bf16 attention over different padded lengths may flip a near-tie
    assert abs(graphed[0].logprobs[0] - eager[0].logprobs[0]) < 0.05


def test_engine_core_defaults_to_bf16_on_the_gpu(tmp_path):
    from slime.inference.engine_core import EngineCore

    model = _model()
    model.save_pretrained(tmp_path)
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(5000)}, unk_token="w0"))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="w1", pad_token="w0").save_pretrained(tmp_path)
    core = EngineCore(str(tmp_path))
    assert next(core.model.parameters()).dtype == torch.bfloat16 and core.device.type == "cuda"
