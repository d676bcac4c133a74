"""Helpers shared by the GPU tests (a uniquely named module: every test folder has a conftest)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 1000  # not a multiple of 128: exercises megatron's vocabulary padding (-> 1024)
SHAPE = dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=6, num_attention_heads=8,
             num_key_value_heads=2, head_dim=64)


def spec_text(**over) -> str:
    s = {"num-layers": SHAPE["num_hidden_layers"], "hidden-size": SHAPE["hidden_size"],
         "ffn-hidden-size": SHAPE["intermediate_size"], "num-attention-heads": SHAPE["num_attention_heads"],
         "num-query-groups": SHAPE["num_key_value_heads"], "kv-channels": SHAPE["head_dim"],
         "norm-epsilon": "1e-6", "rotary-base": "1000000", "vocab-size": VOCAB}
    s.update(over)
    args = " ".join(f"--{k} {v}" for k, v in s.items())
    return ("MODEL_ARGS=(\n   " + args + "\n   --group-query-attention --swiglu --disable-bias-linear --add-qkv-bias"
            "\n   --normalization RMSNorm --position-embedding-type rope --untie-embeddings-and-output-weights\n)\n")


def out_dir() -> Path:
    """$OUT on the GPU machine (results come back from there), else a local folder."""
    p = Path(os.environ.get("SLIME_GPU_TEST_OUT") or os.environ.get("OUT") or ROOT / "runs" / "gpu-tests")
    p.mkdir(parents=True, exist_ok=True)
    return p


def record(name: str, value) -> None:
    """Append a measured figure to results.json (what docs/benchmarks.md quotes)."""
    path = out_dir() / "gpu_test_results.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[name] = value
    path.write_text(json.dumps(data, indent=1))
    print(f"[result] {name} = {value}", flush=True)


def run_tool(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    # A tool is a fresh single-process job: drop the rendezvous variables this pytest process set
    # for its own process group (init_parallel's setdefault), or the child binds the same
    # MASTER_PORT and fails with EADDRINUSE.
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    r = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    print(r.stdout[-3000:], r.stderr[-3000:], sep="\n")
    return r
