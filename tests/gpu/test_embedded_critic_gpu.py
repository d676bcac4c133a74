"""The embedded critic (--advantage-estimator ppo) on a GPU: it trains, and --offload-train gives
its memory back and restores it unchanged. Skips without CUDA."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]


def _critic():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from slime.args import parse_args
    from slime.backends.embedded.critic import EmbeddedCritic, ValueModel

    cfg = Qwen2Config(vocab_size=5000, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024)
    torch.manual_seed(0)
    args = parse_args(["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "1",
                       "--rm-type", "math", "--advantage-estimator", "ppo", "--micro-batch-size", "2",
                       "--critic-lr", "1e-3"])
    return EmbeddedCritic(ValueModel(Qwen2ForCausalLM(cfg)), args, 0, 1, pad_id=0)


def _records():
    from slime.data.train_data import TrainRecord

    g = torch.Generator().manual_seed(1)
    recs = []
    for i in range(4):
        tokens = torch.randint(1, 5000, (40 + 10 * i,), generator=g).tolist()
        n = len(tokens) - 8
        recs.append(TrainRecord(tokens, 8, float(i % 2), [-1.0] * n, [1] * n))
    return recs


def test_the_critic_trains_on_the_gpu_and_offload_gives_its_memory_back_unchanged():
    critic = _critic()
    assert critic.device.type == "cuda"
    recs = _records()
    losses = []
    for _ in range(4):
        values = critic.values(recs)
        for r, v in zip(recs, values):
            r.values, r.returns = v, [r.advantage] * len(v)
        losses.append(critic.train(recs, 1)["critic/value_loss"])
    assert losses[-1] < losses[0], losses
    before = critic.values(recs)
    allocated = torch.cuda.memory_allocated()
    out = critic.offload()
    assert out["critic_offloaded_gib"] > 0 and torch.cuda.memory_allocated() < allocated
    critic.onload()
    assert critic.values(recs) == before
    print(f"critic value loss {losses[0]:.4f} -> {losses[-1]:.4f}; offloaded {out['critic_offloaded_gib']:.3f} GiB")
