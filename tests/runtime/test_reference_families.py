"""The six seeded architecture families on CPU: tiny reference checkpoints built from the
transformers classes (tools/reference_models.py) agree with their spec files on every structural
field, every deliberate mismatch is named field by field, and conversion refuses it before any
weight is read."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slime.model_spec import (
    ConfigMismatchError,
    check_config_file,
    compare_with_config,
    load_flags,
    load_model_spec,
    spec_from_flags,
)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import reference_models as rm  # noqa: E402

FAMILIES = sorted(rm.FAMILIES)


@pytest.fixture(scope="module")
def refs(tmp_path_factory):
    base = tmp_path_factory.mktemp("refs")
    return {f: rm.build(f, base / f) for f in FAMILIES}


def test_transformers_ships_every_family_class():
    import transformers

    for fam in FAMILIES:
        assert hasattr(transformers, rm.FAMILIES[fam]["config"][0]), fam


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_reference_agrees_with_its_spec_on_every_field(refs, family):
    hf, spec = refs[family]
    cfg = json.loads((hf / "config.json").read_text())
    assert compare_with_config(load_model_spec(spec), cfg) == []
    assert check_config_file(spec, hf)["model_type"] == cfg["model_type"]


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_reference_keeps_the_real_models_structure(refs, family):
    """Same switches as the real spec (MoE, MLA, DSA, hybrid, MTP, norms), smaller numbers."""
    tiny = load_model_spec(refs[family][1])
    real = load_model_spec(ROOT / "scripts" / "models" / rm.FAMILIES[family]["real"])
    for attr in ("kind", "mla", "dsa", "hybrid", "qk_layernorm", "post_norms", "norm_1p", "attention_output_gate",
                 "qkv_bias", "expert_bias", "score_function", "rotary_percent", "rope_base", "tied_embeddings"):
        assert getattr(tiny, attr) == getattr(real, attr), (family, attr)
    assert bool(tiny.mtp_layers) == bool(real.mtp_layers)
    assert bool(tiny.router_groups) == bool(real.router_groups)
    assert bool(tiny.rope_scaling_factor) == bool(real.rope_scaling_factor)
    if real.is_moe:
        assert 0 < tiny.dense_layers < tiny.layers  # dense and MoE layers both present
    if real.dsa:
        assert 0 < tiny.dsa_indexer_layers < tiny.layers  # some layers reuse the index
    if real.hybrid:
        assert 0 < tiny.linear_layers < tiny.layers


# (family, flag, wrong value, words the mismatch line must contain)
MISMATCHES = [
    ("glm4", "--norm-epsilon", "1.5625e-07", "norm epsilon"),
    ("glm4", "--rotary-percent", "1.0", "partial rotary"),
    ("glm4", "--num-query-groups", "4", "KV groups"),
    ("glm4", "--kv-channels", "8", "head dim"),
    ("glm4_moe", "--moe-router-topk", "4", "router top-k"),
    ("glm4_moe", "--moe-layer-freq", '"[0]*2+[1]*1"', "dense/MoE layer pattern"),
    ("glm4_moe", "--moe-router-topk-scaling-factor", "1.0", "router scaling"),
    ("glm4_moe", "--mtp-num-layers", "0", "MTP layers"),
    ("glm4_moe", "--moe-ffn-hidden-size", "16", "expert FFN"),
    ("glm4_moe", "--moe-shared-expert-intermediate-size", "64", "shared-expert FFN"),
    ("glm4_moe_lite", "--add-qkv-bias", "", "QKV bias"),
    ("glm4_moe_lite", "--q-lora-rank", "16", "q LoRA rank"),
    ("glm4_moe_lite", "--v-head-dim", "8", "v head dim"),
    ("deepseek_v3", "--moe-router-num-groups", "8", "router groups"),
    ("deepseek_v3", "--moe-router-group-topk", "1", "router group top-k"),
    ("deepseek_v3", "--rotary-scaling-factor", "4", "YaRN factor"),
    ("glm_moe_dsa", "--index-n-heads", "8", "indexer heads"),
    ("glm_moe_dsa", "--index-head-dim", "32", "indexer head dim"),
    ("glm_moe_dsa", "--index-topk", "16", "indexer top-k"),
    ("glm_moe_dsa", "--index-topk-freq", "1", "index sharing pattern"),
    ("qwen3_5", "--linear-attention-freq", "2", "linear/full attention pattern"),
    ("qwen3_5", "--linear-num-value-heads", "8", "linear num value heads"),
    ("qwen3_5", "--linear-key-head-dim", "8", "linear key head dim"),
    ("qwen3_5", "--rotary-percent", "0.5", "partial rotary"),
    ("qwen3_5", "--mtp-num-layers", "0", "MTP layers"),
]


@pytest.mark.parametrize("family,flag,value,words", MISMATCHES, ids=[f"{m[0]}{m[1]}" for m in MISMATCHES])
def test_each_structural_field_is_compared_and_named(refs, tmp_path, family, flag, value, words):
    hf, _ = refs[family]
    bad = tmp_path / "bad.sh"
    bad.write_text(rm.spec_text(family, {flag: value}))
    found = compare_with_config(load_model_spec(bad), json.loads((hf / "config.json").read_text()))
    assert found, (family, flag)
    assert any(words in str(m) for m in found), [str(m) for m in found]


@pytest.mark.parametrize("family,flag", [("glm4", "--post-self-attn-layernorm"), ("qwen3_5", "--apply-layernorm-1p"),
                                         ("deepseek_v3", "--qk-layernorm"), ("glm_moe_dsa", "--enable-dsa-indexer"),
                                         ("glm4_moe", "--moe-router-enable-expert-bias")])
def test_a_family_fact_missing_from_the_spec_is_named(refs, family, flag):
    hf, spec = refs[family]
    flags = {k: v for k, v in load_flags(spec).items() if k != flag[2:].replace("-", "_")}
    if flag == "--post-self-attn-layernorm":
        flags.pop("post_mlp_layernorm")
    found = compare_with_config(spec_from_flags(flags), json.loads((hf / "config.json").read_text()))
    assert any(flag in m.flag for m in found), [str(m) for m in found]


def test_composite_qwen3_5_config_is_read_through_its_text_config(refs):
    cfg = json.loads((refs["qwen3_5"][0] / "config.json").read_text())
    assert "text_config" in cfg and "num_hidden_layers" not in cfg
    assert compare_with_config(load_model_spec(refs["qwen3_5"][1]), cfg) == []


@pytest.mark.parametrize("family", FAMILIES)
def test_conversion_refuses_a_mismatch_before_reading_weights(refs, tmp_path, family):
    """Only config.json is copied; the weights file is garbage that must never be opened."""
    hf, _ = refs[family]
    ck = tmp_path / "hf"
    ck.mkdir()
    shutil.copy(hf / "config.json", ck / "config.json")
    (ck / "model.safetensors").write_bytes(b"not a safetensors file")
    bad = tmp_path / "bad.sh"
    bad.write_text(rm.spec_text(family, {"--hidden-size": "96"}))
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "convert_hf_to_torch_dist_megatron.py"),
                        "--model-args", str(bad), "--hf-checkpoint", str(ck), "--save", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "hidden size: hidden_size = 64 in config.json, but the spec says --hidden-size 96" in r.stderr
    assert "no weights were read" in r.stderr and not out.exists()
    with pytest.raises(ConfigMismatchError):
        check_config_file(bad, ck)


def test_check_cli_prints_one_line_per_field_and_exits_1(refs, tmp_path):
    hf, _ = refs["glm4_moe"]
    bad = tmp_path / "bad.sh"
    bad.write_text(rm.spec_text("glm4_moe", {"--moe-router-topk": "4", "--rotary-base": "10000"}))
    r = subprocess.run([sys.executable, "-m", "slime.model_spec", str(bad), str(hf / "config.json")],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 1
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 2 and any("router top-k" in x for x in lines) and any("rope base" in x for x in lines)
    ok = subprocess.run([sys.executable, "-m", "slime.model_spec", str(refs["glm4_moe"][1]), str(hf / "config.json")],
                        capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert ok.returncode == 0 and ok.stdout == ""


# --- HF <-> Megatron names and tensors (no megatron-core needed) -----------------------------------

MAPPED = ["deepseek_v3", "glm4", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "qwen3_5"]


def _reader(hf):
    from safetensors import safe_open

    h = safe_open(str(hf / "model.safetensors"), "pt")
    return h


@pytest.mark.parametrize("family", MAPPED)
def test_name_mapping_covers_every_hf_tensor_both_ways(refs, family):
    from slime.backends.megatron import hf_mapping as hm
    from slime.backends.megatron.model_args import padded_vocab_size

    hf, spec = refs[family]
    flags = load_flags(spec)
    d = hm.dims_from_flags(flags)
    h = _reader(hf)
    names = set(h.keys())
    carried = set(hm.carried_hf_names(names, d))
    assert hm.unmapped_hf_names(names, d) == []
    mapped = list(hm.iter_hf_names(d))
    assert len(mapped) == len(set(mapped))  # every HF tensor comes from exactly one megatron tensor
    assert set(mapped) | carried == names and not set(mapped) & carried
    if load_model_spec(spec).mtp_layers:  # the MTP layer is mapped where the MTP block is built, else carried
        mtp = {n for n in names if n.startswith("mtp.") or n.startswith(f"{d.hf_prefix}layers.{d.num_layers}.")}
        assert mtp and mtp <= (set(mapped) if d.mtp_built else carried)
        assert d.mtp_built == (family != "glm_moe_dsa")
    back = {}
    for n in hm.iter_mcore_names(d):
        t = hm.hf_to_mcore(n, h.get_tensor, d, padded_vocab_size(flags))
        for k, v in hm.mcore_to_hf(n, t, d):
            assert k not in back
            back[k] = v
    assert set(back) == set(mapped)
    assert all(torch_equal(back[k], h.get_tensor(k)) for k in back)


def torch_equal(a, b):
    import torch

    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))


def test_only_the_computing_dsa_layers_map_an_indexer(refs):
    """GLM-5's index sharing: a layer that reuses the previous top-k has no indexer weights, in the
    checkpoint and in the Megatron model alike."""
    from slime.backends.megatron import hf_mapping as hm

    hf, spec = refs["glm_moe_dsa"]
    d = hm.dims_from_flags(load_flags(spec))
    cfg = json.loads((hf / "config.json").read_text())
    assert d.dsa_pattern == tuple(int(t == "full") for t in cfg["indexer_types"]) == (1, 1, 0, 1, 0)
    with_indexer = {int(n.split(".")[2]) for n in _reader(hf).keys() if ".indexer." in n}
    assert with_indexer == {i for i, x in enumerate(d.dsa_pattern) if x}
    mcore = {int(n.split(".")[2]) for n in hm.iter_mcore_names(d) if ".indexer." in n}
    assert mcore == with_indexer


def test_composite_qwen3_5_carries_its_vision_tower_and_maps_its_mtp_layer(refs):
    from slime.backends.megatron import hf_mapping as hm

    hf, spec = refs["qwen3_5"]
    d = hm.dims_from_flags(load_flags(spec))
    names = set(_reader(hf).keys())
    carried = hm.carried_hf_names(names, d)
    assert carried and all(n.startswith("model.visual.") for n in carried)
    mapped = set(hm.iter_hf_names(d))
    assert {n for n in names if n.startswith("mtp.")} <= mapped
    assert all(n.startswith(("model.language_model.", "mtp.")) for n in names - set(carried) - {"lm_head.weight"})
