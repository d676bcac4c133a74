"""The Megatron trainer at TP 2 and PP 2 in the real Ray loop on the CPU (gloo, float32): every
trainer rank takes part in each weight sync, the engines receive the HF weights bit for bit at
start-up, step 1's log-probs equal the engine's, and the post-sync check of every later sync
(a collective forward over both ranks) passes.

Real parts: Ray on 127.0.0.1, two Megatron trainer actors (megatron-core's CPU mode,
slime/backends/megatron/cpu.py), an embedded engine, the tiny-cpu recipe's model and data.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(900)]


def _megatron_flags(tiny: dict, out: Path, *extra: str) -> list[str]:
    from slime.model_spec import read_model_args

    return [
        "--train-backend", "megatron", *read_model_args(ROOT / "scripts" / "models" / "tiny-cpu.sh"),
        "--hf-checkpoint", str(tiny["model"]),
        "--prompt-data", str(tiny["train"]), "--input-key", "prompt", "--label-key", "label",
        "--apply-chat-template", "--rollout-shuffle", "--rm-type", "math",
        "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "2",
        "--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "1", "--micro-batch-size", "8",
        "--global-batch-size", "16", "--lr", "1e-3", "--output-dir", str(out), *extra,
    ]


def _load_dir(d: Path) -> dict:
    from safetensors.torch import load_file

    sd = {}
    for f in sorted(d.glob("*.safetensors")):
        sd.update(load_file(str(f)))
    return sd


@pytest.mark.parametrize("layout", [["--tensor-model-parallel-size", "2"], ["--pipeline-model-parallel-size", "2"]],
                         ids=["tp2", "pp2"])
def test_megatron_model_parallel_ranks_sync_the_hf_weights_and_train_in_the_ray_loop(tiny, ray_cluster, tmp_path,
                                                                                      layout):
    from slime.args import parse_args
    from slime.ray.runtime import Runtime

    disk = tmp_path / "weights"
    cfg = parse_args(_megatron_flags(tiny, tmp_path, *layout, "--num-rollout", "2",
                                     "--update-weight-transport", "disk", "--update-weight-disk-dir", str(disk)))
    rt = Runtime.start(cfg)  # includes the start-up sync and its post-sync check (both ranks)
    try:
        sent, hf = _load_dir(disk / "v1"), _load_dir(tiny["model"])
        assert sorted(sent) == sorted(hf), "the engines did not receive exactly the checkpoint's tensors"
        assert all(torch.equal(sent[n], hf[n]) and sent[n].dtype == hf[n].dtype for n in hf)
        rows = []
        for rollout_id in range(2):
            samples, metrics = rt.generate(rollout_id)
            metrics.update(rt.train(rt.build_records(samples)))
            metrics["perf/sync_time"] = rt.sync_weights()  # raises if an engine's log-probs disagree
            rows.append(metrics)
        print("[ray-loop]", json.dumps({"layout": layout, "step1_logp_abs_diff":
                                        rows[0]["train/train_rollout_logp_abs_diff"],
                                        "last_check": rt.sync.last_check}), flush=True)
        # Step 1: the trainer's old log-probs are the engine's (the same HF weights, two implementations).
        assert rows[0]["train/train_rollout_logp_abs_diff"] <= 1e-5
        assert rows[0]["train/grad_norm"] > 0 and rt.sync.version == 3
        assert max(rt.sync.last_check.values()) <= cfg.sync.check_tol
    finally:
        rt.shutdown()


@pytest.mark.parametrize("entry,extra", [("train", ["--colocate"]), ("train_async", [])], ids=["colocated", "async"])
def test_train_py_and_train_async_py_run_megatron_at_tp2(tiny, ray_cluster, tmp_path, entry, extra):
    """The entry points themselves, colocated (train.py) and fully async (train_async.py)."""
    import importlib

    importlib.import_module(entry).main(_megatron_flags(tiny, tmp_path, "--tensor-model-parallel-size", "2",
                                                        "--num-rollout", "2", *extra))
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout_id"] for r in rows] == [0, 1]
    assert rows[0]["train/train_rollout_logp_abs_diff"] <= 1e-5 and rows[0]["train/grad_norm"] > 0


def test_a_run_saved_at_tp1_resumes_at_tp2_at_the_next_rollout(tiny, ray_cluster, tmp_path):
    """Resume across layouts: the torch_dist checkpoint of a TP 1 run loads into two TP 2 ranks
    (megatron-core reshards on load), and the loop continues at the rollout after the save, from
    the saved data position. The reverse direction (TP 2 -> TP 1) was run by hand with the same
    flags; docs/benchmarks.md gives both."""
    import train

    ckpt = tmp_path / "ckpt"
    first, second = tmp_path / "tp1", tmp_path / "tp2"
    train.main(_megatron_flags(tiny, first, "--num-rollout", "2", "--save", str(ckpt), "--save-interval", "2"))
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    train.main(_megatron_flags(tiny, second, "--tensor-model-parallel-size", "2", "--num-rollout", "3",
                               "--load", str(ckpt), "--save", str(ckpt), "--save-interval", "100"))
    rows = [json.loads(x) for x in (second / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout_id"] for r in rows if "train/grad_norm" in r] == [2]
