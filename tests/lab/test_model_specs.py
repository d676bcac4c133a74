"""Model specs (scripts/models/*.sh) match models.md and parse without running bash."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from lab.core.model_spec import (
    MODELS_DIR,
    ModelSpecError,
    compare_with_hf_config,
    load_model_spec,
    spec_from_text,
)
from lab.core.recipes import all_recipes
from slime.model_spec import expand_layer_pattern
from tests.refusal_codes import raised

# (file, layers, hidden, heads, kv groups, ffn, experts, topk, moe ffn, dense layers, vocab) from models.md
MODELS_MD = [
    ("glm4-9B", 40, 4096, 32, 2, 13696, 0, 0, 0, 40, 151552),
    ("glm4.7-30B-A3B", 47, 2048, 20, 20, 10240, 64, 4, 1536, 1, 154880),
    ("glm4.5-355B-A32B", 92, 5120, 96, 8, 12288, 160, 8, 1536, 3, 151552),
    ("glm5.2-744B-A40B", 78, 6144, 64, 64, 12288, 256, 8, 2048, 3, 154880),
    ("qwen3.5-27B", 64, 5120, 24, 4, 17408, 0, 0, 0, 64, 248320),
    ("deepseek-v3", 61, 7168, 128, 128, 18432, 256, 8, 2048, 3, 129280),
    ("tiny-cpu", 2, 64, 4, 2, 128, 0, 0, 0, 2, 14),
    # the family twins (tools/tiny/prepare.py --family; tests/runtime/test_family_twins.py ties them to it)
    ("tiny-glm4", 2, 64, 4, 2, 128, 0, 0, 0, 2, 14),
    ("tiny-glm4-moe", 3, 64, 4, 2, 128, 8, 2, 32, 1, 14),
    ("tiny-glm4-moe-lite", 3, 64, 4, 4, 128, 8, 2, 32, 1, 14),
    ("tiny-deepseek-v3", 3, 64, 4, 4, 128, 16, 4, 32, 1, 14),
    ("tiny-glm-moe-dsa", 5, 64, 4, 4, 128, 8, 2, 32, 1, 14),
    ("tiny-qwen3-5", 4, 64, 4, 2, 128, 0, 0, 0, 4, 14),
]
# published sizes (total, active) in billions
PUBLISHED = {
    "glm4-9B": (9, None),
    "glm4.7-30B-A3B": (30, 3),
    "glm4.5-355B-A32B": (355, 32),
    "glm5.2-744B-A40B": (744, 40),
    "qwen3.5-27B": (27, None),
    "deepseek-v3": (671, 37),
}


def test_every_spec_file_is_covered():
    files = sorted(p.stem for p in MODELS_DIR.glob("*.sh"))
    assert len(files) == 13
    assert files == sorted(row[0] for row in MODELS_MD)


@pytest.mark.parametrize("row", MODELS_MD, ids=[r[0] for r in MODELS_MD])
def test_spec_dimensions_match_models_md(row):
    name, layers, hidden, heads, kv, ffn, experts, topk, moe_ffn, dense, vocab = row
    s = load_model_spec(MODELS_DIR / f"{name}.sh")
    assert (s.layers, s.hidden, s.heads, s.kv_groups, s.ffn) == (layers, hidden, heads, kv, ffn)
    assert (s.experts, s.topk, s.moe_ffn, s.dense_layers, s.vocab) == (experts, topk, moe_ffn, dense, vocab)
    if experts:
        assert s.shared_ffn == moe_ffn  # one shared expert of the expert FFN size


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_counts_within_ten_percent_of_published(name):
    s = load_model_spec(MODELS_DIR / f"{name}.sh")
    total, active = PUBLISHED[name]
    assert abs(s.total_params / 1e9 - total) / total < 0.10
    if active:
        assert abs(s.active_params / 1e9 - active) / active < 0.10


def test_mla_dims_of_deepseek_and_glm5():
    ds = load_model_spec(MODELS_DIR / "deepseek-v3.sh")
    assert (ds.q_lora_rank, ds.kv_lora_rank, ds.qk_head_dim, ds.qk_pos_emb_head_dim, ds.v_head_dim) == (1536, 512, 128, 64, 128)
    assert (ds.router_groups, ds.router_group_topk) == (8, 4)
    g5 = load_model_spec(MODELS_DIR / "glm5.2-744B-A40B.sh")
    assert (g5.q_lora_rank, g5.kv_lora_rank, g5.qk_head_dim, g5.qk_pos_emb_head_dim, g5.v_head_dim) == (2048, 512, 192, 64, 256)
    assert g5.rope_base == 8e6


def test_glm5_dsa_index_sharing_every_fourth_layer_offset_three():
    s = load_model_spec(MODELS_DIR / "glm5.2-744B-A40B.sh")
    assert s.dsa and s.allgather_cp
    computing = [i for i in range(s.layers) if s.dsa_computes_index(i)]
    assert computing[:6] == [0, 1, 2, 6, 10, 14]
    # the reference pipeline layout (first 14, last 16, 8 stages of 8 in between) starts on computing layers
    assert all(s.dsa_computes_index(start) for start in [0, 14, 22, 30, 38, 46, 54, 62])


def test_only_moe_checkpoints_with_mtp_have_an_mtp_layer():
    assert load_model_spec(MODELS_DIR / "glm4-9B.sh").mtp_layers == 0
    for name in ("deepseek-v3", "glm4.5-355B-A32B", "glm4.7-30B-A3B", "glm5.2-744B-A40B", "qwen3.5-27B"):
        assert load_model_spec(MODELS_DIR / f"{name}.sh").mtp_layers == 1


def test_glm4_9b_flags_from_models_md():
    s = load_model_spec(MODELS_DIR / "glm4-9B.sh")
    assert s.qkv_bias and not s.tied_embeddings
    assert s.rotary_percent == 0.5 and s.rope_base == 1e4 and s.norm_eps == 1e-5


def test_hybrid_spec_marks_gdn_and_quarter_rotary():
    s = load_model_spec(MODELS_DIR / "qwen3.5-27B.sh")
    assert s.hybrid and s.attention_output_gate and s.rotary_percent == 0.25 and s.rope_base == 1e7


def test_every_recipe_points_at_an_existing_spec():
    recipes = all_recipes()
    assert len(recipes) == 14
    for r in recipes.values():
        load_model_spec(r.model_spec)


def test_parser_reads_quotes_comments_and_switches_without_bash():
    text = 'X=1\nMODEL_ARGS=(\n  --num-layers 4  # four\n  --hidden-size 8\n  --num-attention-heads 2\n  --vocab-size 10\n' \
           '  --num-experts 4 --moe-layer-freq "[0]*1+[1]*3"\n  --swiglu\n  --spec "a b" c\n)\necho "$(rm -rf /)"\n'
    s = spec_from_text(text, "t")
    assert s.layers == 4 and s.moe_layer_pattern == (0, 1, 1, 1)
    assert s.args["swiglu"] is True and s.args["spec"] == ["a b", "c"]


def test_parser_rejects_a_file_without_model_args():
    with pytest.raises(ModelSpecError) as e:
        spec_from_text("FOO=(--num-layers 2)\n")
    assert raised(e.value, "model_spec.no_array")


def test_moe_layer_freq_must_cover_every_layer():
    with pytest.raises(ModelSpecError) as e:
        expand_layer_pattern("[0]*1+[1]*2", 4, "--moe-layer-freq")
    assert raised(e.value, "model_spec.pattern_layers", flag="--moe-layer-freq", count=3, layers=4)
    assert expand_layer_pattern(2, 4, "--moe-layer-freq") == (1, 0, 1, 0)


def test_spec_parsing_is_cached():
    a = load_model_spec(MODELS_DIR / "deepseek-v3.sh")
    assert load_model_spec("scripts/models/deepseek-v3.sh") is a


def _hf_config_glm4_9b():
    return {"model_type": "glm4", "attention_bias": True, "partial_rotary_factor": 0.5, "head_dim": 128,
            "hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 40, "intermediate_size": 13696,
            "num_key_value_heads": 2, "tie_word_embeddings": False, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "vocab_size": 151552}


def test_compare_with_hf_config_accepts_the_matching_checkpoint():
    assert compare_with_hf_config(load_model_spec(MODELS_DIR / "glm4-9B.sh"), _hf_config_glm4_9b()) == []


def test_compare_with_hf_config_names_every_disagreeing_field():
    cfg = _hf_config_glm4_9b() | {"hidden_size": 5120, "tie_word_embeddings": True, "rope_theta": 1e6, "rms_norm_eps": 1e-6}
    diffs = compare_with_hf_config(load_model_spec(MODELS_DIR / "glm4-9B.sh"), cfg)
    joined = "\n".join(diffs)
    assert len(diffs) == 4
    for key in ("hidden_size", "tie_word_embeddings", "rope_theta", "rms_norm_eps"):
        assert key in joined


def test_compare_with_hf_config_checks_moe_and_shared_expert_ffn():
    spec = load_model_spec(MODELS_DIR / "deepseek-v3.sh")
    cfg = {"hidden_size": 7168, "num_attention_heads": 128, "num_hidden_layers": 61, "intermediate_size": 18432,
           "moe_intermediate_size": 2048, "n_shared_experts": 2, "n_routed_experts": 256, "rope_theta": 10000}
    diffs = compare_with_hf_config(spec, cfg)
    assert len(diffs) == 1 and "shared-expert FFN" in diffs[0]


def test_compare_reads_nested_text_config():
    spec = load_model_spec(MODELS_DIR / "qwen3.5-27B.sh")
    cfg = {"text_config": {"hidden_size": 5120, "num_attention_heads": 24, "num_hidden_layers": 64,
                           "intermediate_size": 17408, "num_key_value_heads": 4, "rope_parameters": {"rope_theta": 10000000}}}
    assert compare_with_hf_config(spec, cfg) == []


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_spec_files_are_shellcheck_clean():
    files = [str(p) for p in Path(MODELS_DIR).glob("*.sh")]
    res = subprocess.run(["shellcheck", *files], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout


def test_tiny_spec_vocab_matches_the_tiny_tokenizer_when_present():
    prepare = Path(MODELS_DIR).parent.parent / "tools" / "tiny" / "prepare.py"
    if not prepare.exists():
        pytest.skip("tools/tiny/prepare.py not written yet")
    import ast

    tree = ast.parse(prepare.read_text())
    def size(node):  # a list literal, or list("...") of characters
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "list":
            return len(ast.literal_eval(node.args[0]))
        return len(ast.literal_eval(node))

    consts = {t.targets[0].id: size(t.value) for t in tree.body
              if isinstance(t, ast.Assign) and isinstance(t.targets[0], ast.Name) and t.targets[0].id in ("SPECIALS", "CHARS")}
    tokens = consts["SPECIALS"] + consts["CHARS"]
    spec = load_model_spec(MODELS_DIR / "tiny-cpu.sh")
    assert spec.vocab == tokens  # the tiny tokenizer must have exactly --vocab-size tokens
    for field, value in (("hidden_size", spec.hidden), ("intermediate_size", spec.ffn), ("num_hidden_layers", spec.layers),
                         ("num_attention_heads", spec.heads), ("num_key_value_heads", spec.kv_groups)):
        assert f"{field}={value}" in prepare.read_text()


def test_glm5_counts_an_indexer_only_on_layers_that_compute_the_index():
    s = load_model_spec(MODELS_DIR / "glm5.2-744B-A40B.sh")
    assert s.dsa_indexer_layers == 21  # layers 0, 1, 2, then every 4th from 6
    from slime.model_spec import load_flags, spec_from_flags

    every_layer = spec_from_flags({**load_flags(MODELS_DIR / "glm5.2-744B-A40B.sh"), "index_topk_freq": "1"})
    saved = every_layer.total_params - s.total_params
    assert saved == (s.layers - 21) * s._indexer_params() and 0.4e9 < saved < 0.6e9


def test_recipe_kind_is_what_its_spec_says():
    for r in all_recipes().values():
        assert r.kind == load_model_spec(r.model_spec).kind
    assert {r.name: r.kind for r in all_recipes().values()}["qwen3.8-27b"] == "hybrid"


# Structural keys of the published config.json files, as public model cards and inference engines'
# configs quote them (docs/en/megatron.md names the sources); only the keys those quotes carry.
PUBLISHED_CONFIGS = {
    "glm4-9B": {"model_type": "glm4", "hidden_size": 4096, "intermediate_size": 13696, "num_hidden_layers": 40,
                "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "attention_bias": True,
                "partial_rotary_factor": 0.5, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
                "tie_word_embeddings": False, "vocab_size": 151552},
    "glm4.7-30B-A3B": {"model_type": "glm4_moe_lite", "vocab_size": 154880, "hidden_size": 2048,
                       "intermediate_size": 10240, "moe_intermediate_size": 1536, "num_hidden_layers": 47,
                       "num_attention_heads": 20, "num_key_value_heads": 20, "rms_norm_eps": 1e-5,
                       "attention_bias": False, "rope_theta": 1_000_000.0, "partial_rotary_factor": 1.0,
                       "q_lora_rank": 768, "kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64,
                       "v_head_dim": 256, "n_routed_experts": 64, "n_shared_experts": 1, "num_experts_per_tok": 4,
                       "norm_topk_prob": True, "routed_scaling_factor": 1.8, "n_group": 1, "topk_group": 1,
                       "topk_method": "noaux_tc", "first_k_dense_replace": 1, "num_nextn_predict_layers": 1,
                       "tie_word_embeddings": False},
    "glm4.5-355B-A32B": {"model_type": "glm4_moe", "attention_bias": True, "head_dim": 128, "hidden_size": 5120,
                         "partial_rotary_factor": 0.5, "intermediate_size": 12288, "moe_intermediate_size": 1536,
                         "norm_topk_prob": True, "num_attention_heads": 96, "n_group": 1, "topk_group": 1,
                         "n_routed_experts": 160, "n_shared_experts": 1, "routed_scaling_factor": 2.5,
                         "num_experts_per_tok": 8, "first_k_dense_replace": 3, "num_hidden_layers": 92,
                         "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 1000000,
                         "num_nextn_predict_layers": 1, "tie_word_embeddings": False, "use_qk_norm": True,
                         "vocab_size": 151552},
    "glm5.2-744B-A40B": {"model_type": "glm_moe_dsa", "index_topk": 2048, "kv_lora_rank": 512, "n_routed_experts": 256,
                         "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 64,
                         "num_experts_per_tok": 8, "num_nextn_predict_layers": 1, "q_lora_rank": 2048,
                         "rms_norm_eps": 1e-5, "rope_parameters": {"rope_theta": 8000000, "rope_type": "default"},
                         "scoring_func": "sigmoid", "tie_word_embeddings": False, "topk_method": "noaux_tc",
                         "hidden_size": 6144, "num_hidden_layers": 78, "first_k_dense_replace": 3},
    "qwen3.5-27B": {"model_type": "qwen3_5", "tie_word_embeddings": False, "text_config": {
        "model_type": "qwen3_5_text", "attn_output_gate": True, "full_attention_interval": 4, "head_dim": 256,
        "hidden_size": 5120, "intermediate_size": 17408, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
        "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_value_head_dim": 128,
        "mtp_num_hidden_layers": 1, "num_attention_heads": 24, "num_hidden_layers": 64, "num_key_value_heads": 4,
        "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-6, "vocab_size": 248320, "attention_bias": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25}}},
    "deepseek-v3": {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
                    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
                    "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
                    "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
                    "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4,
                    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "norm_topk_prob": True,
                    "scoring_func": "sigmoid", "topk_method": "noaux_tc", "rms_norm_eps": 1e-6,
                    "rope_theta": 10000, "rope_scaling": {"type": "yarn", "factor": 40, "mscale": 1.0,
                                                          "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1,
                                                          "original_max_position_embeddings": 4096},
                    "num_nextn_predict_layers": 1, "tie_word_embeddings": False, "vocab_size": 129280},
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_CONFIGS))
def test_real_spec_agrees_with_the_published_config(name):
    assert compare_with_hf_config(load_model_spec(MODELS_DIR / f"{name}.sh"), PUBLISHED_CONFIGS[name]) == []


def test_the_old_glm47_flash_qkv_bias_would_be_refused():
    spec = spec_from_text((MODELS_DIR / "glm4.7-30B-A3B.sh").read_text().replace("--qk-layernorm", "--qk-layernorm --add-qkv-bias"))
    diffs = compare_with_hf_config(spec, PUBLISHED_CONFIGS["glm4.7-30B-A3B"])
    assert len(diffs) == 1 and "QKV bias" in diffs[0] and "attention_bias" in diffs[0]
