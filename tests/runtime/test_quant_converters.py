"""tools/convert_hf_to_fp8.py and tools/convert_hf_to_int4.py on a tiny random Qwen2 (CPU, a few seconds).

The model has hidden 256 and intermediate 320, so FP8 128x128 blocks include partial edge blocks
(gate/up_proj: 320 rows -> 3 row blocks, the last 64 rows; down_proj: 320 cols) and INT4 groups of
64 divide every input dim. It is saved in ~1 MB shards so the sharded path (index json) is exercised.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from safetensors import safe_open

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import convert_hf_to_fp8 as fp8conv
import convert_hf_to_int4 as int4conv
import fp8_cast_bf16

QUANTIZED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FP8_REL_BOUND = 0.07  # e4m3 keeps 3 mantissa bits: rounding error <= 2**-4 = 6.25 % of |w| <= 6.25 % of block amax


def _load(d: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            out.update({k: h.get_tensor(k) for k in h.keys()})
    return out


def _quiet(_msg: str) -> None:
    pass


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=256, intermediate_size=320, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=512, max_position_embeddings=256, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():  # non-uniform magnitudes across rows/cols so per-block scales differ
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(torch.logspace(-1, 1, p.shape[0]).to(p.dtype).unsqueeze(1))
    d = tmp_path_factory.mktemp("tiny_qwen2_bf16")
    model.save_pretrained(d, max_shard_size="1MB", safe_serialization=True)
    (d / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "WordLevel"}}')
    (d / "tokenizer_config.json").write_text('{"model_max_length": 256}')
    assert (d / fp8conv.INDEX).is_file(), "fixture should be sharded"
    return d


@pytest.fixture(scope="module")
def fp8_dir(tiny_hf, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("fp8") / "out"
    assert fp8conv.main(["--model-dir", str(tiny_hf), "--save-dir", str(d), "--strategy", "block",
                         "--block-size", "128", "128"]) == 0
    return d


def test_fp8_layout_config_and_side_files(tiny_hf, fp8_dir):
    cfg = json.loads((fp8_dir / "config.json").read_text())
    assert cfg["quantization_config"] == {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                          "weight_block_size": [128, 128]}
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (fp8_dir / f).read_bytes() == (tiny_hf / f).read_bytes()
    index = json.loads((fp8_dir / fp8conv.INDEX).read_text())
    shards = sorted(p.name for p in fp8_dir.glob("*.safetensors"))
    assert len(shards) > 1 and sorted(set(index["weight_map"].values())) == shards
    src, out = _load(tiny_hf), _load(fp8_dir)
    assert set(index["weight_map"]) == set(out)
    n_q = 0
    for name, w in src.items():
        if any(p in name for p in QUANTIZED) and name.endswith(".weight"):
            n_q += 1
            assert out[name].dtype == torch.float8_e4m3fn and out[name].shape == w.shape
            s = out[name + "_scale_inv"]
            assert s.dtype == torch.float32 and tuple(s.shape) == (-(-w.shape[0] // 128), -(-w.shape[1] // 128))
            assert index["weight_map"][name] == index["weight_map"][name + "_scale_inv"]
        else:  # embeddings, norms, biases, lm_head: byte-identical
            assert out[name].dtype == w.dtype and torch.equal(out[name].view(torch.uint8), w.view(torch.uint8)), name
            assert name + "_scale_inv" not in out
    assert n_q == 2 * len(QUANTIZED)
    assert "lm_head.weight" in src and out["lm_head.weight"].dtype == torch.bfloat16
    assert out["model.layers.0.mlp.gate_proj.weight"].shape == (320, 256)  # partial row block exercised


def test_fp8_round_trip_through_fp8_cast_bf16(tiny_hf, fp8_dir, tmp_path):
    back = tmp_path / "bf16"
    fp8_cast_bf16.convert_dir(fp8_dir, back, log=_quiet)
    assert "quantization_config" not in json.loads((back / "config.json").read_text())
    src, rt = _load(tiny_hf), _load(back)
    assert set(src) == set(rt)
    worst = 0.0
    for name, w in src.items():
        if not (any(p in name for p in QUANTIZED) and name.endswith(".weight")):
            assert torch.equal(rt[name].view(torch.uint8), w.view(torch.uint8)), name
            continue
        wf, rf = w.float(), rt[name].float()
        m, n = wf.shape
        for i in range(0, m, 128):
            for j in range(0, n, 128):
                blk, rblk = wf[i:i + 128, j:j + 128], rf[i:i + 128, j:j + 128]
                rel = ((rblk - blk).abs().max() / blk.abs().max()).item()
                worst = max(worst, rel)
                assert rel <= FP8_REL_BOUND, f"{name} block ({i},{j}): {rel:.4f}"
        # and element-wise: e4m3 relative rounding (2**-4) + bf16 output rounding, plus a subnormal floor
        assert ((rf - wf).abs() <= 0.0625 * wf.abs() * 1.01 + 2 ** -6 * wf.abs().max() / 448).all(), name
    assert 0 < worst <= FP8_REL_BOUND
    print(f"worst FP8 block max error / block max|w| = {worst:.4f}")


def test_fp8_refuses_quantized_input_and_bad_dirs(tmp_path, tiny_hf, fp8_dir, capsys):
    assert fp8conv.main(["--model-dir", str(fp8_dir), "--save-dir", str(tmp_path / "again")]) == 2
    assert "already quantized" in capsys.readouterr().err
    empty = tmp_path / "no_config"
    empty.mkdir()
    assert fp8conv.main(["--model-dir", str(empty), "--save-dir", str(tmp_path / "o")]) == 2
    assert str(empty / "config.json") in capsys.readouterr().err
    # a finished conversion is not silently overwritten
    assert fp8conv.main(["--model-dir", str(tiny_hf), "--save-dir", str(fp8_dir)]) == 2
    assert "already holds a checkpoint" in capsys.readouterr().err


def test_bad_model_dir_message_names_the_path(tmp_path):
    missing = tmp_path / "does" / "not" / "exist"
    for tool in ("convert_hf_to_fp8.py", "convert_hf_to_int4.py"):
        r = subprocess.run([sys.executable, str(REPO / "tools" / tool), "--model-dir", str(missing),
                            "--save-dir", str(tmp_path / "out")], capture_output=True, text=True, timeout=60,
                           check=False)
        assert r.returncode == 2, r.stderr
        assert str(missing) in r.stderr and "does not exist" in r.stderr
        assert "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_int4_pack_unpack_exact_and_nibble_order():
    g = torch.Generator().manual_seed(1)
    q = torch.randint(-8, 8, (37, 203), generator=g, dtype=torch.int8)  # cols not a multiple of 8: padding
    packed = int4conv.pack_int4(q)
    assert packed.dtype == torch.int32 and packed.shape == (37, 26)
    assert torch.equal(int4conv.unpack_int4(packed, q.shape), q)
    # compressed-tensors order: stored q + 8, column 8k + j in bits 4j..4j+3 of word k
    row = torch.tensor([[-8, -7, 0, 1, 2, 3, 6, 7]], dtype=torch.int8)
    expect = sum((v + 8) << (4 * j) for j, v in enumerate(row[0].tolist()))
    assert int(int4conv.pack_int4(row)[0, 0]) == expect - 2 ** 32  # top nibble 15 -> negative int32


@pytest.mark.parametrize("group", [64, 128])
def test_int4_layout_config_and_half_step_error(tiny_hf, tmp_path, group):
    out_dir = tmp_path / f"int4_g{group}"
    logs: list[str] = []
    int4conv.convert(tiny_hf, out_dir, group_size=group, log=logs.append)
    assert any("shard 1/" in m for m in logs)
    qc = json.loads((out_dir / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "pack-quantized"
    wq = qc["config_groups"]["group_0"]["weights"]
    assert (wq["num_bits"], wq["type"], wq["symmetric"], wq["strategy"], wq["group_size"]) == (4, "int", True,
                                                                                               "group", group)
    assert "lm_head" in qc["ignore"]
    assert (out_dir / "tokenizer.json").is_file() and (out_dir / fp8conv.INDEX).is_file()
    src, out = _load(tiny_hf), _load(out_dir)
    index = json.loads((out_dir / fp8conv.INDEX).read_text())["weight_map"]
    assert set(index) == set(out)
    n_q = 0
    for name, w in src.items():
        prefix = name[: -len(".weight")]
        if prefix + ".weight_packed" not in out:
            assert torch.equal(out[name].view(torch.uint8), w.view(torch.uint8)), name
            if any(p in name for p in QUANTIZED) and name.endswith(".weight"):
                assert w.shape[1] % group and prefix in qc["ignore"]  # only down_proj (in=320) with group 128
            continue
        n_q += 1
        assert name not in out
        packed, scale, shape = (out[prefix + s] for s in (".weight_packed", ".weight_scale", ".weight_shape"))
        assert packed.dtype == torch.int32 and packed.shape == (w.shape[0], w.shape[1] // 8)
        assert scale.dtype == w.dtype and scale.shape == (w.shape[0], w.shape[1] // group)
        assert shape.dtype == torch.int64 and shape.tolist() == list(w.shape)
        deq = int4conv.dequantize(packed, scale, shape)
        step = scale.float().repeat_interleave(group, dim=1)
        err = (deq - w.float()).abs()
        assert (err <= 0.5 * step * (1 + 1e-6)).all(), f"{name}: {(err / step).max():.4f} steps"
        q = int4conv.unpack_int4(packed, shape)
        assert int(q.min()) >= -8 and int(q.max()) <= 7
        assert torch.equal(int4conv.pack_int4(q), packed)
    assert n_q == 2 * len(QUANTIZED) - (2 if group == 128 else 0)
