"""The embedded engine's memory formula (lab/rules/memory_model.py) term by term, for tiny-gpu's model
serving one rollout of 32 prompts x 8 samples of 12 + 2 tokens (the case
tests/gpu/test_memory_estimate_gpu.py measures on the H200)."""

from __future__ import annotations

from pathlib import Path

from lab.rules.memory_model import (
    CUBLAS_WORKSPACE_BYTES,
    ENGINE_CUBLAS_STREAMS,
    GIB,
    PREFILL_CHUNK_TOKENS,
    embedded_engine_parts,
)
from slime.model_spec import load_model_spec

ROOT = Path(__file__).resolve().parents[2]


def test_the_engine_counts_one_cublas_workspace_per_stream_it_runs_on():
    spec = load_model_spec(ROOT / "scripts" / "models" / "tiny-cpu.sh")
    parts = embedded_engine_parts(spec, 256, 14)
    # the default stream and the one side stream every CUDA graph is warmed up and captured on
    assert ENGINE_CUBLAS_STREAMS == 2 and CUBLAS_WORKSPACE_BYTES == 32 * 2**20
    assert parts["workspace"] == 2 * 32 * 2**20
    # 256 rows -> 256 slots; 14 tokens -> 256 positions; 2 layers x 2 KV heads x 16 dims x K,V x bf16
    assert parts["kv_cache"] == 256 * 256 * 2 * 2 * 16 * 2 * 2
    assert parts["prefill"] == min(PREFILL_CHUNK_TOKENS, 256 * 256) * 2 * (2 * 128 + 2 * 64)
    assert parts["logits"] == 256 * 14 * 2 * 4
    total = sum(parts.values()) / GIB
    assert 0.088 < total < 0.092  # was 0.059 with one workspace; H200 measured 0.114 with one per capture
