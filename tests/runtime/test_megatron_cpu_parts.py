"""The CPU-testable parts of the Megatron backend: spec parsing -> TransformerConfig kwargs,
config.json refusal, HF <-> Megatron layouts, FP8 block dequantisation.

megatron-core itself (Python >= 3.12, CUDA for its model code) is only needed by the tests that
say so; they skip cleanly elsewhere. The GPU tests live in tests/gpu/.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from slime.backends.megatron import hf_mapping as hm
from slime.backends.megatron.model_args import (
    ConfigMismatchError,
    ModelArgsError,
    check_hf_config,
    flags_from_argv,
    gpt_model_kwargs,
    hf_config_mismatches,
    layer_spec_kwargs,
    load_flags,
    optimizer_kwargs,
    padded_vocab_size,
    parallel_kwargs,
    parse_layer_pattern,
    read_model_args,
    recompute_kwargs,
    transformer_config_kwargs,
)
from tests.refusal_codes import raised

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "scripts" / "models").glob("*.sh"))
TINY = ["--num-layers", "4", "--hidden-size", "128", "--ffn-hidden-size", "256", "--num-attention-heads", "8",
        "--group-query-attention", "--num-query-groups", "2", "--kv-channels", "16", "--swiglu",
        "--disable-bias-linear", "--add-qkv-bias", "--normalization", "RMSNorm", "--norm-epsilon", "1e-6",
        "--position-embedding-type", "rope", "--rotary-base", "10000", "--untie-embeddings-and-output-weights",
        "--vocab-size", "1000"]


def _tiny_hf_config() -> dict:
    return {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 128,
            "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
            "head_dim": 16, "rms_norm_eps": 1e-6, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
            "tie_word_embeddings": False, "vocab_size": 1000}


# --- spec files ---------------------------------------------------------------------------------


def test_every_spec_file_parses():
    assert len(SPECS) >= 7, f"expected the 7 spec files, saw {len(SPECS)}: {SPECS}"
    for path in SPECS:
        flags = flags_from_argv(read_model_args(path))
        assert int(flags["num_layers"]) > 0 and int(flags["hidden_size"]) > 0, path


def test_runtime_parser_and_spec_reader_agree():
    """cfg.megatron (filled by slime.args from ${MODEL_ARGS[@]}) equals the spec file read here."""
    from slime.args import _split_passthrough

    argv = read_model_args(ROOT / "scripts" / "models" / "tiny-cpu.sh")
    _, megatron, _ = _split_passthrough(argv)
    assert megatron == flags_from_argv(argv)


def test_read_model_args_comments_quotes_and_refusals(tmp_path):
    p = tmp_path / "m.sh"
    p.write_text('X=1\nMODEL_ARGS=(\n  --num-layers 2   # two\n  # whole comment line\n'
                 '  --moe-layer-freq "[0]*1+[1]*1"\n)\nOTHER=(--x)\n')
    assert read_model_args(p) == ["--num-layers", "2", "--moe-layer-freq", "[0]*1+[1]*1"]
    p.write_text("MODEL_ARGS=(\n --num-layers $N\n)\n")
    with pytest.raises(ModelArgsError) as e:
        read_model_args(p)
    assert raised(e.value, "model_spec.shell_variable", token="$N")
    p.write_text("NOPE=(1)\n")
    with pytest.raises(ModelArgsError) as e:
        read_model_args(p)
    assert raised(e.value, "model_spec.no_array")


def test_dense_spec_to_transformer_config_kwargs():
    kw = transformer_config_kwargs(flags_from_argv(TINY), {"tensor_model_parallel_size": "2", "sequence_parallel": True,
                                                          "recompute_granularity": "full", "recompute_num_layers": "2"})
    assert kw["num_layers"] == 4 and kw["hidden_size"] == 128 and kw["ffn_hidden_size"] == 256
    assert kw["num_attention_heads"] == 8 and kw["num_query_groups"] == 2 and kw["kv_channels"] == 16
    assert kw["normalization"] == "RMSNorm" and kw["layernorm_epsilon"] == 1e-6
    assert kw["gated_linear_unit"] is True and kw["activation_func"] == "silu"
    assert kw["add_bias_linear"] is False and kw["add_qkv_bias"] is True
    assert kw["attention_dropout"] == 0.0 and kw["hidden_dropout"] == 0.0
    assert kw["bf16"] is True and kw["params_dtype"] == "bfloat16"
    assert kw["tensor_model_parallel_size"] == 2 and kw["sequence_parallel"] is True
    assert kw["recompute_granularity"] == "full" and kw["recompute_method"] == "uniform"
    assert kw["recompute_num_layers"] == 2
    assert "num_moe_experts" not in kw and "q_lora_rank" not in kw
    m = gpt_model_kwargs(flags_from_argv(TINY), tp=1)
    assert m == {"vocab_size": 1024, "max_sequence_length": 4096, "position_embedding_type": "rope",
                 "rotary_percent": 1.0, "rotary_base": 10000, "share_embeddings_and_output_weights": False}
    assert layer_spec_kwargs(flags_from_argv(TINY))["normalization"] == "RMSNorm"


def test_moe_and_mla_specs_map_to_config_fields():
    flags = load_flags(ROOT / "scripts" / "models" / "deepseek-v3.sh")
    kw = transformer_config_kwargs(flags, {"expert_model_parallel_size": "8", "pipeline_model_parallel_size": "4",
                                           "decoder_last_pipeline_num_layers": "13"})
    assert kw["num_moe_experts"] == 256 and kw["moe_router_topk"] == 8
    assert kw["moe_layer_freq"] == [0] * 3 + [1] * 58
    assert kw["moe_ffn_hidden_size"] == 2048 and kw["moe_shared_expert_intermediate_size"] == 2048
    assert kw["moe_router_score_function"] == "sigmoid" and kw["moe_router_enable_expert_bias"] is True
    assert kw["moe_router_num_groups"] == 8 and kw["moe_router_group_topk"] == 4
    assert kw["moe_grouped_gemm"] is True and kw["moe_token_dispatcher_type"] == "alltoall"
    assert kw["q_lora_rank"] == 1536 and kw["kv_lora_rank"] == 512
    assert (kw["qk_head_dim"], kw["qk_pos_emb_head_dim"], kw["v_head_dim"]) == (128, 64, 128)
    assert kw["rope_type"] == "yarn" and kw["rotary_scaling_factor"] == 40.0
    assert kw["expert_model_parallel_size"] == 8 and kw["num_layers_in_last_pipeline_stage"] == 13
    assert kw["mtp_num_layers"] == 1 and kw["qk_layernorm"] is True
    assert gpt_model_kwargs(flags)["position_embedding_type"] == "none"  # MLA ropes inside attention
    spec = layer_spec_kwargs(flags)
    assert spec["multi_latent_attention"] is True and spec["num_experts"] == 256
    hm.require_mapped(flags)  # MoE + MLA + MTP are mapped


def test_specs_with_layers_not_built_yet_are_refused_by_name():
    transformer_config_kwargs(load_flags(ROOT / "scripts" / "models" / "glm4-9B.sh"))  # sandwich norms: built
    flags = load_flags(ROOT / "scripts" / "models" / "qwen3.5-27B.sh")
    with pytest.raises(ModelArgsError) as e:
        transformer_config_kwargs({**flags, "hybrid_linear_attention": "mamba2"})
    assert raised(e.value, "megatron.spec.cannot_build")
    assert "--hybrid-linear-attention mamba2" in str(e.value.args[0].params["reasons"])  # named by its flag


def test_qwen3_5_spec_gives_megatrons_gated_delta_net_fields():
    """The hybrid pattern reaches megatron-core as a per-layer list (1 = Gated DeltaNet, every 4th
    layer full attention), with the GDN dimensions and the attention output gate."""
    flags = load_flags(ROOT / "scripts" / "models" / "qwen3.5-27B.sh")
    hm.require_mapped(flags)
    kw = transformer_config_kwargs(flags)
    assert kw["experimental_attention_variant"] == "gated_delta_net"
    assert kw["linear_attention_freq"] == [1, 1, 1, 0] * 16
    assert (kw["linear_conv_kernel_dim"], kw["linear_key_head_dim"], kw["linear_value_head_dim"]) == (4, 128, 128)
    assert (kw["linear_num_key_heads"], kw["linear_num_value_heads"]) == (16, 48)
    assert kw["attention_output_gate"] is True and kw["qk_layernorm"] is True
    assert kw["layernorm_zero_centered_gamma"] is True and kw["add_qkv_bias"] is False
    assert kw["num_query_groups"] == 4 and kw["kv_channels"] == 256
    g = gpt_model_kwargs(flags)
    assert g["position_embedding_type"] == "rope" and g["rotary_percent"] == 0.25 and g["rotary_base"] == 10_000_000
    assert g["share_embeddings_and_output_weights"] is False


def test_config_kwargs_are_real_megatron_fields():
    pytest.importorskip("megatron.core")
    import dataclasses

    from megatron.core.transformer import MLATransformerConfig, TransformerConfig

    dense = {f.name for f in dataclasses.fields(TransformerConfig)}
    mla = {f.name for f in dataclasses.fields(MLATransformerConfig)}
    for path in SPECS:
        try:
            kw = transformer_config_kwargs(load_flags(path))
        except ModelArgsError:
            continue
        fields = mla if kw.get("q_lora_rank") is not None or "kv_lora_rank" in kw else dense
        assert set(kw) <= fields, (path.name, sorted(set(kw) - fields))


def test_layer_pattern_parsing():
    assert parse_layer_pattern("[0]*3+[1]*5", 8) == [0, 0, 0, 1, 1, 1, 1, 1]
    assert parse_layer_pattern("[0,1]*2", 4) == [0, 1, 0, 1]
    assert parse_layer_pattern("2", 4) == 2
    with pytest.raises(ModelArgsError) as e:
        parse_layer_pattern("[1]*3", 4)
    assert raised(e.value, "model_spec.pattern_layers", count=3, layers=4)
    with pytest.raises(ModelArgsError) as e:
        parse_layer_pattern("__import__('os')", 4)
    assert raised(e.value, "model_spec.pattern_terms")


def test_parallel_optimizer_and_recompute_flags():
    assert parallel_kwargs({"sequence_parallel": True})["sequence_parallel"] is False  # no TP: off
    p = parallel_kwargs({"tensor_model_parallel_size": "4", "pipeline_model_parallel_size": "2",
                         "context_parallel_size": "2", "expert_model_parallel_size": "8",
                         "expert_tensor_parallel_size": "1", "sequence_parallel": True})
    assert (p["tensor_model_parallel_size"], p["pipeline_model_parallel_size"], p["context_parallel_size"],
            p["expert_model_parallel_size"], p["expert_tensor_parallel_size"]) == (4, 2, 2, 8, 1)

    class Optim:
        lr, weight_decay, adam_beta1, adam_beta2, adam_eps, clip_grad = 1e-6, 0.1, 0.9, 0.98, 1e-8, 1.0

    o = optimizer_kwargs({"optimizer_cpu_offload": True}, Optim)
    assert o["optimizer_cpu_offload"] and o["use_distributed_optimizer"] and not o["use_precision_aware_optimizer"]
    assert o["optimizer_offload_fraction"] == 1.0 and o["lr"] == 1e-6 and o["adam_beta2"] == 0.98
    o = optimizer_kwargs({}, Optim)  # the distributed optimizer is the default
    assert o["use_distributed_optimizer"] and not o["optimizer_cpu_offload"] and o["optimizer_offload_fraction"] == 0.0
    assert not optimizer_kwargs({"use_distributed_optimizer": False}, Optim)["use_distributed_optimizer"]
    assert recompute_kwargs({}) == {}
    assert recompute_kwargs({"recompute_granularity": "selective"}) == {"recompute_granularity": "selective"}
    with pytest.raises(ModelArgsError):
        recompute_kwargs({"recompute_granularity": "some"})
    assert padded_vocab_size({"vocab_size": "151936"}, tp=1) == 151936
    assert padded_vocab_size({"vocab_size": "1000"}, tp=4) == 1024
    assert padded_vocab_size({"vocab_size": "1000", "make_vocab_size_divisible_by": "1"}, tp=1) == 1000


# --- config.json agreement ---------------------------------------------------------------------


def test_matching_config_passes_and_mismatch_names_every_field(tmp_path):
    flags = flags_from_argv(TINY)
    assert hf_config_mismatches(flags, _tiny_hf_config()) == []
    assert hf_config_mismatches(flags, {**_tiny_hf_config(), "rope_theta": 10000.0}) == []  # transformers 4 form
    bad = {**_tiny_hf_config(), "num_hidden_layers": 6, "num_key_value_heads": 4, "tie_word_embeddings": True,
           "rope_parameters": {"rope_theta": 1e6}}
    lines = hf_config_mismatches(flags, bad)
    text = "\n".join(lines)
    for needle in ("num_hidden_layers = 6", "--num-layers 4", "num_key_value_heads = 4", "--num-query-groups 2",
                   "tie_word_embeddings", "rope_theta = 1000000.0"):
        assert needle in text, (needle, text)
    assert len(lines) == 4
    llama = {**_tiny_hf_config(), "model_type": "llama", "attention_bias": False}
    assert any("QKV bias" in x for x in hf_config_mismatches(flags, llama))
    (tmp_path / "config.json").write_text(json.dumps(bad))
    with pytest.raises(ConfigMismatchError) as e:
        check_hf_config(flags, tmp_path)
    assert raised(e.value, "model_spec.config_differs", count=4)


def test_conversion_cli_refuses_before_any_weight_moves(tmp_path):
    """The tool exits 2 naming the fields; the output dir is never created (no torch needed)."""
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({**_tiny_hf_config(), "hidden_size": 256}))
    (hf / "model.safetensors").write_bytes(b"not even a safetensors file: must never be opened")
    spec = tmp_path / "spec.sh"
    spec.write_text("MODEL_ARGS=(\n" + " ".join(TINY) + "\n)\n")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "convert_hf_to_torch_dist_megatron.py"),
                        "--model-args", str(spec), "--hf-checkpoint", str(hf), "--save", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "hidden_size = 256 in config.json" in r.stderr and "--hidden-size 128" in r.stderr
    assert not out.exists()


def test_conversion_layout_that_does_not_fit_the_ranks_is_refused_before_torchrun(tmp_path):
    """``--tp``/``--pp``/``--ep`` must divide the ranks; the tool exits 2 naming the flag, before
    torchrun starts, in both directions."""
    from slime.backends.megatron.convert import conversion_layout

    flags = flags_from_argv(TINY)
    assert conversion_layout(flags, tp=2, ep=2, world=4) == {
        "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1, "expert_model_parallel_size": 2,
        "expert_tensor_parallel_size": 1}
    assert conversion_layout(flags, tp=2, world=8)["pipeline_model_parallel_size"] == 4  # the rest become stages
    with pytest.raises(ValueError, match="--pp 4 --ep 2: TP x PP must divide"):
        conversion_layout(flags, tp=1, pp=4, ep=2, world=4)
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(_tiny_hf_config()))
    spec = tmp_path / "spec.sh"
    spec.write_text("MODEL_ARGS=(\n" + " ".join(TINY) + "\n)\n")
    for tool, args in (("convert_hf_to_torch_dist_megatron.py", ["--hf-checkpoint", str(hf)]),
                       ("convert_torch_dist_to_hf.py", ["--load", str(tmp_path / "td")])):
        r = subprocess.run([sys.executable, str(ROOT / "tools" / tool), "--model-args", str(spec), *args,
                            "--save", str(tmp_path / "out"), "--nproc-per-node", "2", "--tp", "3"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (tool, r.stderr)
        assert "--tp 3 does not divide the 2 conversion ranks" in r.stderr and "launching" not in r.stdout
        assert not (tmp_path / "out").exists()


# --- HF <-> Megatron layouts --------------------------------------------------------------------


def _dims(**kw) -> hm.Dims:
    base = dict(num_layers=2, hidden=32, heads=8, groups=2, head_dim=4, vocab=50, qkv_bias=True, tied=False)
    base.update(kw)
    return hm.Dims(**base)


def test_qkv_fusion_layout_and_inverse():
    d = _dims()
    q = torch.arange(d.heads * d.head_dim * 3, dtype=torch.float).reshape(d.heads * d.head_dim, 3)
    k = -torch.arange(d.groups * d.head_dim * 3, dtype=torch.float).reshape(d.groups * d.head_dim, 3) - 1
    v = k - 1000
    fused = hm.fuse_qkv(q, k, v, d)
    assert fused.shape == ((d.heads + 2 * d.groups) * d.head_dim, 3)
    block = (d.q_per_group + 2) * d.head_dim  # group g: its 4 q heads, then k_g, then v_g
    qn = d.q_per_group * d.head_dim
    for g in range(d.groups):
        rows = fused[g * block:(g + 1) * block]
        assert torch.equal(rows[:qn], q[g * qn:(g + 1) * qn])
        assert torch.equal(rows[qn:qn + d.head_dim], k[g * d.head_dim:(g + 1) * d.head_dim])
        assert torch.equal(rows[qn + d.head_dim:], v[g * d.head_dim:(g + 1) * d.head_dim])
    for a, b in zip(hm.split_qkv(fused, d), (q, k, v)):
        assert torch.equal(a, b)
    bias = hm.fuse_qkv(q[:, 0], k[:, 0], v[:, 0], d)  # 1-D biases follow the same order
    assert torch.equal(bias, fused[:, 0])


def test_tp_shards_merge_back_and_split_whole_groups():
    d = _dims()
    for name, shape in (("decoder.layers.0.self_attention.linear_qkv.weight", (64, 32)),
                        ("decoder.layers.0.mlp.linear_fc1.weight", (40, 32)),
                        ("decoder.layers.0.self_attention.linear_proj.weight", (32, 32)),
                        ("decoder.layers.0.mlp.linear_fc2.weight", (32, 20)),
                        ("embedding.word_embeddings.weight", (64, 32)),
                        ("decoder.layers.0.input_layernorm.weight", (32,))):
        full = torch.randn(shape)
        shards = [hm.shard_for_tp(name, full, 2, r) for r in range(2)]
        assert torch.equal(hm.merge_tp(name, shards), full), name
    fc1 = torch.cat([torch.zeros(20, 4), torch.ones(20, 4)])  # gate rows 0, up rows 1
    s0 = hm.shard_for_tp("x.linear_fc1.weight", fc1, 2, 0)
    assert torch.equal(s0, torch.cat([torch.zeros(10, 4), torch.ones(10, 4)]))  # half gate, half up
    qkv = hm.fuse_qkv(torch.randn(32, 5), torch.randn(8, 5), torch.randn(8, 5), d)
    s1 = hm.shard_for_tp("x.linear_qkv.weight", qkv, 2, 1)
    assert torch.equal(s1, qkv[24:])  # rank 1 holds query group 1 whole (48 rows = 2 x (4q + k + v) x 4)
    assert all(len(x) == 16 for x in hm.split_qkv(s1, d, groups=1)[:1])


def test_glm5_spec_gives_megatrons_dsa_fields():
    """GLM-5's indexer reaches megatron-core's DSA variant as the published model computes it:
    ReLU scores, interleaved rope, no Hadamard rotation, LayerNorm eps 1e-6 on the key, the
    index shared every 4th layer from offset 3 (same formula, 1-based in megatron-core)."""
    flags = load_flags(ROOT / "scripts" / "models" / "glm5.2-744B-A40B.sh")
    hm.require_mapped(flags)
    kw = transformer_config_kwargs(flags)
    assert kw["experimental_attention_variant"] == "dsa" and kw["dsa_kernel_backend"] == "none"
    assert (kw["dsa_indexer_n_heads"], kw["dsa_indexer_head_dim"], kw["dsa_indexer_topk"]) == (32, 128, 2048)
    assert (kw["dsa_indexer_topk_freq"], kw["dsa_indexer_skip_topk_offset"]) == (4, 3)
    assert kw["dsa_indexer_rope_interleaved"] and kw["dsa_indexer_scoring_relu"]
    assert not kw["dsa_indexer_rotate_activation"] and kw["dsa_indexer_k_norm_epsilon"] == 1e-6
    d = hm.dims_from_flags(flags)

    def megatron_skips(n, off, freq):  # megatron-core's is_dsa_skip_topk_layer (1-based layer numbers)
        return (max(n - max(off, 1), 0) % freq) != 0

    assert d.dsa_pattern == tuple(int(not megatron_skips(i + 1, 3, 4)) for i in range(78))
    assert d.dsa_pattern[:11] == (1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1)


def _hybrid_dims():
    flags = flags_from_argv(("--num-layers 4 --hidden-size 32 --ffn-hidden-size 20 --num-attention-heads 4 "
                             "--group-query-attention --num-query-groups 2 --kv-channels 8 --disable-bias-linear "
                             "--attention-output-gate --qk-layernorm --vocab-size 64 --linear-attention-freq 4 "
                             "--hybrid-linear-attention gated_delta_net --linear-conv-kernel-dim 4 "
                             "--linear-key-head-dim 4 --linear-value-head-dim 6 --linear-num-key-heads 2 "
                             "--linear-num-value-heads 4").split())
    return hm.dims_from_flags(flags)


def test_gated_attention_q_proj_keeps_query_and_gate_rows_per_head():
    d = _hybrid_dims()
    heads, hd = d.heads, d.head_dim
    # HF q_proj: per head [query rows, gate rows]; mark query rows 1xx, gate rows 2xx by head
    q = torch.stack([torch.stack([torch.full((hd,), 100.0 + h), torch.full((hd,), 200.0 + h)]) for h in range(heads)])
    q = q.reshape(heads * 2 * hd, 1)
    k, v = torch.full((d.groups * hd, 1), 300.0), torch.full((d.groups * hd, 1), 400.0)
    qkv = hm.fuse_qkv(q, k, v, d)
    per_group = qkv.reshape(d.groups, -1)
    # group 0 = [q heads 0,1 | gate heads 0,1 | k | v] (megatron-core's gated layout)
    want = torch.cat([torch.full((hd,), x) for x in (100.0, 101.0, 200.0, 201.0, 300.0, 400.0)])
    assert torch.equal(per_group[0], want)
    back = hm.split_qkv(qkv, d)
    assert torch.equal(back[0], q) and torch.equal(back[1], k) and torch.equal(back[2], v)
    s1 = hm.shard_for_tp("decoder.layers.3.self_attention.linear_qkv.weight", qkv, 2, 1, d)
    assert torch.equal(hm.split_qkv(s1, d, groups=1)[0], q[2 * 2 * hd:])  # rank 1: heads 2 and 3 whole


def test_gated_delta_net_in_proj_is_split_section_by_section_over_tp():
    d = _hybrid_dims()
    assert d.is_linear_layer(0) and not d.is_linear_layer(3)
    sections = d.in_proj_sections  # q 8, k 8, v 24, z 24, beta 4, alpha 4
    assert sections == (8, 8, 24, 24, 4, 4)
    full = torch.cat([torch.full((n, 3), float(i)) for i, n in enumerate(sections)])
    name = "decoder.layers.0.self_attention.in_proj.weight"
    shards = [hm.shard_for_tp(name, full, 2, r, d) for r in range(2)]
    want = torch.cat([torch.full((n // 2, 3), float(i)) for i, n in enumerate(sections)])
    assert all(torch.equal(s, want) for s in shards)  # every rank: half of each section, in order
    assert torch.equal(hm.merge_tp(name, shards, d), full)
    conv = torch.randn(40, 1, 4)
    cname = "decoder.layers.0.self_attention.conv1d.weight"
    cs = [hm.shard_for_tp(cname, conv, 2, r, d) for r in range(2)]
    assert torch.equal(cs[0][:4], conv[:4]) and torch.equal(cs[0][4:8], conv[8:12])  # q half, k half
    assert torch.equal(hm.merge_tp(cname, cs, d), conv)
    for n in ("A_log", "dt_bias"):
        assert hm.tp_axis(f"decoder.layers.0.self_attention.{n}") == 0
    assert hm.tp_axis("decoder.layers.0.self_attention.out_proj.weight") == 1
    assert hm.tp_axis("decoder.layers.0.self_attention.out_norm.weight") is None
    # HF side: the four projections are the sections' concatenation, and come back apart
    parts = {"in_proj_qkv": torch.randn(40, 32), "in_proj_z": torch.randn(24, 32), "in_proj_b": torch.randn(4, 32),
             "in_proj_a": torch.randn(4, 32)}
    get = {f"model.language_model.layers.0.linear_attn.{k}.weight": t for k, t in parts.items()}.__getitem__
    fused = hm.hf_to_mcore(name, get, d)
    assert fused.shape == (72, 32)
    for hf_name, t in hm.mcore_to_hf(name, fused, d):
        assert torch.equal(t, get(hf_name))


def test_hf_megatron_round_trip_over_every_name():
    d = _dims()
    padded = 64
    hf_sd = {}
    for name in hm.iter_hf_names(d):
        if "embed" in name or "lm_head" in name:
            shape = (d.vocab, d.hidden)
        elif name.endswith(("q_proj.weight", "o_proj.weight")):
            shape = (d.heads * d.head_dim, d.hidden)
        elif name.endswith(("k_proj.weight", "v_proj.weight")):
            shape = (d.groups * d.head_dim, d.hidden)
        elif name.endswith("q_proj.bias"):
            shape = (d.heads * d.head_dim,)
        elif name.endswith(("k_proj.bias", "v_proj.bias")):
            shape = (d.groups * d.head_dim,)
        elif name.endswith(("gate_proj.weight", "up_proj.weight")):
            shape = (20, d.hidden)
        elif name.endswith("down_proj.weight"):
            shape = (d.hidden, 20)
        else:
            shape = (d.hidden,)
        hf_sd[name] = torch.randn(shape)
    mcore_names = ["embedding.word_embeddings.weight", "decoder.final_layernorm.weight", "output_layer.weight"]
    for i in range(d.num_layers):
        mcore_names += [f"decoder.layers.{i}.{x}" for x in (
            "input_layernorm.weight", "self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias",
            "self_attention.linear_proj.weight", "pre_mlp_layernorm.weight", "mlp.linear_fc1.weight",
            "mlp.linear_fc2.weight")]
    back = {}
    for n in mcore_names:
        t = hm.hf_to_mcore(n, hf_sd.__getitem__, d, padded)
        if "word_embeddings" in n or "output_layer" in n:
            assert t.shape[0] == padded and torch.all(t[d.vocab:] == 0)
        back.update(dict(hm.mcore_to_hf(f"module.module.{n}", t, d)))
    assert set(back) == set(hf_sd)
    assert all(torch.equal(back[k], hf_sd[k]) for k in hf_sd)
    tied = _dims(tied=True)
    assert "lm_head.weight" not in set(hm.iter_hf_names(tied))
    t = hm.hf_to_mcore("output_layer.weight", hf_sd.__getitem__, tied)
    assert torch.equal(t, hf_sd["model.embed_tokens.weight"])


# --- FP8 block-wise -> BF16 ---------------------------------------------------------------------


def _fp8_tool():
    spec = importlib.util.spec_from_file_location("fp8_cast_bf16", ROOT / "tools" / "fp8_cast_bf16.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_block_dequant_matches_a_loop_with_partial_edge_blocks():
    tool = _fp8_tool()
    torch.manual_seed(0)
    w = (torch.randn(200, 300) * 4).to(torch.float8_e4m3fn)
    s = torch.rand(2, 3) + 0.5
    out = tool.block_dequant(w, s)
    ref = torch.empty(200, 300)
    col_block = torch.arange(300) // 128
    for i in range(200):
        ref[i] = w[i].float() * s[i // 128][col_block]
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, ref.to(torch.bfloat16))
    with pytest.raises(ValueError, match="expected \\(2, 3\\)"):
        tool.block_dequant(w, torch.ones(1, 3))


def test_fp8_checkpoint_dir_conversion(tmp_path):
    from safetensors.torch import load_file, save_file

    tool = _fp8_tool()
    src, dst = tmp_path / "fp8", tmp_path / "bf16"
    src.mkdir()
    w = (torch.randn(130, 260)).to(torch.float8_e4m3fn)
    s = torch.rand(2, 3) + 0.5
    norm = torch.randn(130).to(torch.bfloat16)
    save_file({"a.weight": w, "n.weight": norm}, str(src / "model-1.safetensors"))
    save_file({"a.weight_scale_inv": s}, str(src / "model-2.safetensors"))  # scale in another shard
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a.weight": "model-1.safetensors", "n.weight": "model-1.safetensors",
        "a.weight_scale_inv": "model-2.safetensors"}}))
    (src / "config.json").write_text(json.dumps({"model_type": "deepseek_v3", "quantization_config": {
        "quant_method": "fp8", "weight_block_size": [128, 128]}}))
    (src / "tokenizer.json").write_text("{}")
    stats = tool.convert_dir(src, dst, log=lambda m: None)
    assert stats == {"dequantized": 1, "copied": 1, "scales_dropped": 1}
    out = {**load_file(str(dst / "model-1.safetensors")), **load_file(str(dst / "model-2.safetensors"))}
    assert set(out) == {"a.weight", "n.weight"}
    assert torch.equal(out["a.weight"], tool.block_dequant(w, s))
    assert torch.equal(out["n.weight"], norm)
    cfg = json.loads((dst / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["torch_dtype"] == "bfloat16"
    index = json.loads((dst / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(index) == {"a.weight", "n.weight"} and (dst / "tokenizer.json").exists()
