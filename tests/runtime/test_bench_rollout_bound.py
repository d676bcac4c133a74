"""The rollout bench's memory-bandwidth bound (bench/bench_rollout.py): the bytes it says a decode
step reads are the engine's own weights and the part of its KV cache the step attends, and the
bench prints the bound and the engine's share of it beside each figure."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import bench_rollout  # noqa: E402 - the bench script, imported as a module

pytestmark = pytest.mark.timeout(300)


def test_the_bound_counts_the_engines_weights_and_the_cache_a_step_reads():
    from slime.inference.decoder import SlotDecoder

    model = bench_rollout.build("smoke", torch.device("cpu"), torch.float32)
    batch, context = 3, 40
    dec = SlotDecoder(model, use_graphs=False)
    dec.ensure(batch, context)
    attended = sum(t[:batch, :, :context].numel() * t.element_size() for t in dec.k + dec.v)
    weights = sum(t.numel() * t.element_size() for t in {id(p): p for p in model.parameters()}.values())
    got = bench_rollout.decode_step_bytes(model, batch, context)
    assert got["kv"] == attended and got["weights"] == weights
    bound = bench_rollout.bandwidth_bound(model, batch, 24, 31, tb_s=2.0)  # mean context 24 + 16 = 40
    assert bound["bytes_per_step"] == attended + weights
    assert bound["tok_s"] == pytest.approx(batch * 2.0e12 / (attended + weights))


@pytest.mark.parametrize("name, tb_s", [("NVIDIA H200", 4.8), ("NVIDIA H100 80GB HBM3", 3.35),
                                        ("NVIDIA H100 PCIe", 2.0), ("NVIDIA GeForce RTX 4090", None)])
def test_the_bandwidth_is_the_devices_published_peak_or_none(name, tb_s):
    assert bench_rollout.device_bandwidth_tb_s(name) == tb_s


def test_the_bench_prints_the_bound_and_the_engines_share_of_it(tmp_path):
    out = tmp_path / "rollout.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_rollout.py"), "--shapes", "smoke", "--batches", "2",
                        "--new-tokens", "4", "--prompt-len", "8", "--no-hf", "--bandwidth-tb-s", "0.05",
                        "--out", str(out)], capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    (row,) = json.loads(out.read_text())["runs"]
    assert row["bandwidth_bound"]["tb_s"] == 0.05 and row["bandwidth_bound"]["tok_s"] > 0
    assert row["engine_share_of_bound"] == pytest.approx(row["engine_tok_s"] / row["bandwidth_bound"]["tok_s"])
    assert "bound tok/s" in p.stdout and "%" in p.stdout.splitlines()[-1]


@pytest.mark.parametrize("value", ["0", "-3", "nan", "fast"])
def test_a_bandwidth_that_is_not_a_positive_number_is_refused_naming_the_flag(value, capsys):
    with pytest.raises(SystemExit) as exc:
        bench_rollout.main(["--shapes", "smoke", "--bandwidth-tb-s", value])
    assert exc.value.code == 2 and "--bandwidth-tb-s" in capsys.readouterr().err
