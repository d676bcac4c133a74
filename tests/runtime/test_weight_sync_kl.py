"""After a sync, the engine's log-probs of its sampled tokens equal the trainer's recomputation.

float32 on CPU: the engine decodes with a KV cache and left padding, the trainer recomputes the
whole sequence right-padded, so the two agree to float rounding, not bitwise. The bound we
promise: train/rollout KL <= 1e-6 and per-token |diff| <= 1e-5 (measured ~1e-7 / ~5e-7).
"""

from __future__ import annotations

import torch

from slime.backends.embedded.trainer import EmbeddedTrainer
from slime.config import BatchConfig, LossConfig, OptimConfig
from slime.data.train_data import TrainRecord
from slime.hf.weights import bucketize, encode_bucket
from slime.inference.engine_core import EngineCore
from slime.rollout.client import EngineClient
from slime.rollout.engines.embedded import EngineServer

PROMPTS = [[2, 8, 11, 6, 3], [2, 5, 5, 4, 3], [2, 13, 4, 4, 3], [2, 6, 7, 12, 3]]


def _records(outs, prompts, advs):
    return [TrainRecord(p + o.output_ids, len(p), a, o.output_logprobs, [1] * len(o.output_ids))
            for p, o, a in zip(prompts, outs, advs)]


def test_kl_is_zero_at_step_one_after_sync(tiny):
    torch.set_num_threads(1)
    temp = 0.7
    core = EngineCore(str(tiny["model"]), seed=3)
    server = EngineServer(core)
    client = EngineClient(server.start())
    try:
        trainer = EmbeddedTrainer(str(tiny["model"]), None, None, OptimConfig(lr=1e-2), LossConfig(temperature=temp),
                                  BatchConfig(micro_batch_size=64))
        prompts = [p for p in PROMPTS for _ in range(4)]
        params = {"max_new_tokens": 4, "temperature": temp, "sampling_seed": 1}
        outs = client.generate(prompts, params)
        trainer.train(_records(outs, prompts, [1.0 if i % 2 else -1.0 for i in range(len(prompts))]), 1)
        # Sync the updated weights as version 1, in small buckets, then sample again.
        buckets = bucketize(trainer.named_weights(), 8192)
        for i, b in enumerate(buckets):
            client.update_weights_from_tensor(encode_bucket(b), 1, "safetensors", i == len(buckets) - 1)
        outs = client.generate(prompts, {**params, "sampling_seed": 2})
        assert {o.weight_version for o in outs} == {"1"}
        recs = _records(outs, prompts, [0.0] * len(prompts))
        recomputed = trainer.log_probs(recs)  # before the next update
        metrics = trainer.train(recs, 1)  # its train_rollout_kl is measured before the update too
        diffs = [abs(a - b) for r, lp in zip(recs, recomputed) for a, b in zip(r.rollout_log_probs, lp)]
        assert max(diffs) <= 1e-5, max(diffs)
        assert abs(metrics["train/train_rollout_kl"]) <= 1e-6, metrics
    finally:
        server.stop()
