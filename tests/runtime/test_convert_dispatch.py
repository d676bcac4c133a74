"""`tools/convert_hf_to_torch_dist.py --backend megatron` refuses a checkpoint whose config.json
disagrees with the model spec, naming the field, before any weight is read (runs on a CPU)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_megatron_conversion_refuses_a_spec_mismatch_before_moving_weights(tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 3, "hidden_size": 64,
        "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 14}))
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(REPO / "tools" / "convert_hf_to_torch_dist.py"), "--backend", "megatron",
                        "--hf-checkpoint", str(hf), "--save", str(out),
                        "--model-args", str(REPO / "scripts" / "models" / "tiny-cpu.sh")],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 2
    assert "num_hidden_layers = 3 in config.json, but the spec says --num-layers 2" in r.stderr
    assert "no weights were read" in r.stderr and not out.exists()
