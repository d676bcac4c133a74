#!/usr/bin/env python3
"""Tiny random-initialised reference checkpoints of the six seeded architecture families.

Each family is built from the configuration and model class transformers ships for it (no hub,
no download), keeping every structural feature of the real model at toy sizes: dense and MoE
layers both present, group-limited routing and YaRN where the real model has them, the DSA
indexer with cross-layer index sharing, the hybrid Gated DeltaNet / full-attention layer pattern,
the composite vision-language layout of Qwen3.5, and the MTP layer (transformers does not build
it, so its tensors are added under the names the published checkpoints use). Next to the
safetensors goes a matching model spec (``spec.sh``), so the fixtures check the code paths while
the real dimensions stay in ``scripts/models/``.

    python tools/reference_models.py --out /tmp/refs [--family glm4_moe ...] [--dtype bfloat16]

Tests generate them at test time (tests/runtime/test_reference_families.py); nothing big is
committed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VOCAB = 256
COMMON = ["--swiglu", "--disable-bias-linear", "--normalization", "RMSNorm",
          "--untie-embeddings-and-output-weights", f"--vocab-size {VOCAB}"]

# family -> (transformers config class, config kwargs, the real spec file it shrinks, spec flags)
FAMILIES: dict[str, dict[str, Any]] = {
    "glm4": {
        "real": "glm4-9B.sh",
        "config": ("Glm4Config", dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
                                      attention_bias=True, tie_word_embeddings=False,
                                      rope_parameters={"rope_theta": 10000.0, "rope_type": "default",
                                                       "partial_rotary_factor": 0.5})),
        "spec": ["--num-layers 2", "--hidden-size 64", "--ffn-hidden-size 128", "--num-attention-heads 4",
                 "--group-query-attention", "--num-query-groups 2", "--kv-channels 16", "--add-qkv-bias",
                 "--norm-epsilon 1e-5", "--post-self-attn-layernorm", "--post-mlp-layernorm",
                 "--use-rotary-position-embeddings", "--rotary-base 10000", "--rotary-percent 0.5",
                 "--rotary-interleaved"],
    },
    "glm4_moe": {
        "real": "glm4.5-355B-A32B.sh",
        "config": ("Glm4MoeConfig", dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
                                         attention_bias=True, use_qk_norm=True, tie_word_embeddings=False,
                                         moe_intermediate_size=32, num_experts_per_tok=2, n_shared_experts=1,
                                         n_routed_experts=8, routed_scaling_factor=2.5, n_group=1, topk_group=1,
                                         first_k_dense_replace=1, norm_topk_prob=True, num_nextn_predict_layers=1,
                                         rope_parameters={"rope_theta": 1000000.0, "rope_type": "default",
                                                          "partial_rotary_factor": 0.5})),
        "spec": ["--num-layers 3", "--hidden-size 64", "--ffn-hidden-size 128", "--num-attention-heads 4",
                 "--group-query-attention", "--num-query-groups 2", "--kv-channels 16", "--add-qkv-bias",
                 "--qk-layernorm", "--norm-epsilon 1e-5", "--use-rotary-position-embeddings",
                 "--rotary-base 1000000", "--rotary-percent 0.5", "--num-experts 8", "--moe-router-topk 2",
                 "--moe-ffn-hidden-size 32", "--moe-shared-expert-intermediate-size 32",
                 '--moe-layer-freq "[0]*1+[1]*2"', "--moe-router-score-function sigmoid",
                 "--moe-router-enable-expert-bias", "--moe-router-topk-scaling-factor 2.5", "--mtp-num-layers 1"],
    },
    "glm4_moe_lite": {
        "real": "glm4.7-30B-A3B.sh",
        "config": ("Glm4MoeLiteConfig", dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                             moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
                                             num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
                                             routed_scaling_factor=1.8, kv_lora_rank=16, q_lora_rank=32,
                                             qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                                             num_experts_per_tok=2, rms_norm_eps=1e-5, attention_bias=False,
                                             tie_word_embeddings=False, num_nextn_predict_layers=1,
                                             first_k_dense_replace=1,
                                             rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"})),
        "spec": ["--num-layers 3", "--hidden-size 64", "--ffn-hidden-size 128", "--num-attention-heads 4",
                 "--qk-layernorm", "--norm-epsilon 1e-5", "--position-embedding-type rope", "--rotary-base 1000000",
                 "--multi-latent-attention", "--q-lora-rank 32", "--kv-lora-rank 16", "--qk-head-dim 16",
                 "--qk-pos-emb-head-dim 8", "--v-head-dim 16", "--num-experts 8", "--moe-router-topk 2",
                 "--moe-ffn-hidden-size 32", "--moe-shared-expert-intermediate-size 32",
                 '--moe-layer-freq "[0]*1+[1]*2"', "--moe-router-score-function sigmoid",
                 "--moe-router-enable-expert-bias", "--moe-router-topk-scaling-factor 1.8", "--mtp-num-layers 1"],
    },
    "deepseek_v3": {
        "real": "deepseek-v3.sh",
        "config": ("DeepseekV3Config", dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                            moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
                                            num_key_value_heads=4, n_shared_experts=1, n_routed_experts=16,
                                            routed_scaling_factor=2.5, kv_lora_rank=16, q_lora_rank=32,
                                            qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_group=4,
                                            topk_group=2, num_experts_per_tok=4, first_k_dense_replace=1,
                                            rms_norm_eps=1e-6, tie_word_embeddings=False, num_nextn_predict_layers=1,
                                            max_position_embeddings=4096,
                                            rope_parameters={"rope_theta": 10000.0, "rope_type": "yarn", "factor": 40.0,
                                                             "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32.0,
                                                             "beta_slow": 1.0,
                                                             "original_max_position_embeddings": 4096})),
        "spec": ["--num-layers 3", "--hidden-size 64", "--ffn-hidden-size 128", "--num-attention-heads 4",
                 "--qk-layernorm", "--norm-epsilon 1e-6", "--position-embedding-type rope", "--rotary-base 10000",
                 "--rotary-scaling-factor 40", "--mscale 1.0", "--mscale-all-dim 1.0",
                 "--multi-latent-attention", "--q-lora-rank 32", "--kv-lora-rank 16", "--qk-head-dim 16",
                 "--qk-pos-emb-head-dim 8", "--v-head-dim 16", "--num-experts 16", "--moe-router-topk 4",
                 "--moe-ffn-hidden-size 32", "--moe-shared-expert-intermediate-size 32",
                 '--moe-layer-freq "[0]*1+[1]*2"', "--moe-router-score-function sigmoid",
                 "--moe-router-enable-expert-bias", "--moe-router-topk-scaling-factor 2.5",
                 "--moe-router-num-groups 4", "--moe-router-group-topk 2", "--mtp-num-layers 1"],
    },
    "glm_moe_dsa": {
        "real": "glm5.2-744B-A40B.sh",
        # index sharing every 2nd layer from offset 2 (layers 0, 1, 3 compute; 2 and 4 reuse): the
        # real freq-4 / offset-3 pattern needs 7+ layers, the same code path at 5. 16 indexer heads
        # (the real model has 32): with few heads a key's ReLU'd score is exactly 0 for every head
        # often enough that tied keys make the top-k depend on tie order (packing, kernel).
        "config": ("GlmMoeDsaConfig", dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                           moe_intermediate_size=32, num_hidden_layers=5, num_attention_heads=4,
                                           num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
                                           routed_scaling_factor=2.5, kv_lora_rank=16, q_lora_rank=32,
                                           qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                                           num_experts_per_tok=2, first_k_dense_replace=1, rms_norm_eps=1e-5,
                                           tie_word_embeddings=False, index_topk=8, index_head_dim=16,
                                           index_n_heads=16, index_topk_freq=2, index_skip_topk_offset=2,
                                           num_nextn_predict_layers=1,
                                           rope_parameters={"rope_theta": 8000000.0, "rope_type": "default"})),
        "spec": ["--num-layers 5", "--hidden-size 64", "--ffn-hidden-size 128", "--num-attention-heads 4",
                 "--qk-layernorm", "--norm-epsilon 1e-5", "--position-embedding-type rope", "--rotary-base 8000000",
                 "--multi-latent-attention", "--q-lora-rank 32", "--kv-lora-rank 16", "--qk-head-dim 16",
                 "--qk-pos-emb-head-dim 8", "--v-head-dim 16", "--enable-dsa-indexer", "--index-n-heads 16",
                 "--index-head-dim 16", "--index-topk 8", "--index-topk-freq 2", "--index-skip-topk-offset 2",
                 "--num-experts 8", "--moe-router-topk 2", "--moe-ffn-hidden-size 32",
                 "--moe-shared-expert-intermediate-size 32", '--moe-layer-freq "[0]*1+[1]*4"',
                 "--moe-router-score-function sigmoid", "--moe-router-enable-expert-bias",
                 "--moe-router-topk-scaling-factor 2.5", "--mtp-num-layers 1"],
    },
    "qwen3_5": {
        "real": "qwen3.5-27B.sh",
        "config": ("Qwen3_5Config", dict(
            text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                             linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                             linear_num_key_heads=2, linear_num_value_heads=4, tie_word_embeddings=False,
                             mtp_num_hidden_layers=1, attn_output_gate=True,
                             rope_parameters={"rope_theta": 10000000.0, "rope_type": "default",
                                              "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0],
                                              "mrope_interleaved": True}),
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                               patch_size=4, num_position_embeddings=16),
            tie_word_embeddings=False)),
        "spec": ["--num-layers 4", "--hidden-size 64", "--ffn-hidden-size 128", "--num-attention-heads 4",
                 "--group-query-attention", "--num-query-groups 2", "--kv-channels 16", "--qk-layernorm",
                 "--attention-output-gate", "--apply-layernorm-1p", "--norm-epsilon 1e-6",
                 "--position-embedding-type rope", "--rotary-base 10000000", "--rotary-percent 0.25",
                 "--hybrid-linear-attention gated_delta_net", "--linear-attention-freq 4",
                 "--linear-conv-kernel-dim 4", "--linear-key-head-dim 16", "--linear-value-head-dim 16",
                 "--linear-num-key-heads 2", "--linear-num-value-heads 4", "--mtp-num-layers 1"],
    },
}


# Second shapes of a family (name -> base family, config changes, spec changes): a check written on
# one fixture must also hold where head counts, layer counts and index frequency differ. glm_moe_dsa:b
# has the real model's index-sharing pattern (every 4th layer from offset 3) at 7 layers, 8 attention
# heads, 32 indexer heads picking 16 keys, 16 experts with 4 per token.
VARIANTS: dict[str, tuple[str, dict[str, Any], dict[str, str | None]]] = {
    "glm_moe_dsa:b": ("glm_moe_dsa",
                      dict(hidden_size=96, num_hidden_layers=7, num_attention_heads=8, num_key_value_heads=8,
                           index_n_heads=32, index_topk=16, index_topk_freq=4, index_skip_topk_offset=3,
                           n_routed_experts=16, num_experts_per_tok=4),
                      {"--hidden-size": "96", "--num-layers": "7", "--num-attention-heads": "8",
                       "--index-n-heads": "32", "--index-topk": "16", "--index-topk-freq": "4",
                       "--index-skip-topk-offset": "3", "--num-experts": "16", "--moe-router-topk": "4",
                       "--moe-layer-freq": '"[0]*1+[1]*6"'}),
    # four layers, so that PP 2 has a MoE layer on each stage (the model-parallel Ray tests)
    "glm4_moe:4l": ("glm4_moe", dict(num_hidden_layers=4),
                    {"--num-layers": "4", "--moe-layer-freq": '"[0]*1+[1]*3"'}),
    # MLA without experts or MTP: two dense layers (a flag mapped to None is dropped from the spec)
    "deepseek_v3:dense": ("deepseek_v3", dict(num_hidden_layers=2, first_k_dense_replace=2, n_routed_experts=0,
                                              num_nextn_predict_layers=0),
                          {"--num-layers": "2", "--num-experts": None, "--moe-router-topk": None,
                           "--moe-ffn-hidden-size": None, "--moe-shared-expert-intermediate-size": None,
                           "--moe-layer-freq": None, "--moe-router-score-function": None,
                           "--moe-router-enable-expert-bias": None, "--moe-router-topk-scaling-factor": None,
                           "--moe-router-num-groups": None, "--moe-router-group-topk": None,
                           "--mtp-num-layers": None}),
}


def entry(family: str) -> dict[str, Any]:
    """A family's table entry, or a variant's: its base family's with the variant's changes."""
    if family in FAMILIES:
        return FAMILIES[family]
    base, config_over, spec_over = VARIANTS[family]
    e = FAMILIES[base]
    cls_name, kw = e["config"]
    spec = [ln for ln in e["spec"] if ln.split()[0] not in spec_over]
    return {**e, "config": (cls_name, {**kw, **config_over}),
            "spec": spec + [f"{k} {v}" for k, v in spec_over.items() if v is not None]}

def spec_text(family: str, overrides: dict[str, str] | None = None, drop: tuple[str, ...] = ()) -> str:
    """The MODEL_ARGS file of a family's tiny reference (``overrides``: flag -> new value, for
    deliberate mismatches; ``drop``: flags left out)."""
    lines = [ln for ln in [*entry(family)["spec"], *COMMON] if ln.split()[0] not in drop]
    for flag, value in (overrides or {}).items():
        lines = [ln for ln in lines if ln.split()[0] != flag] + [f"{flag} {value}".strip()]
    body = "\n".join(f"   {ln}" for ln in lines)
    return ("# shellcheck shell=bash\n# shellcheck disable=SC2034\n"
            f"# Tiny reference of the {family} family (tools/reference_models.py); real sizes: "
            f"scripts/models/{entry(family)['real']}\nMODEL_ARGS=(\n{body}\n)\n")


def make_config(family: str, text_overrides: dict[str, Any] | None = None):
    """The family's transformers config; ``text_overrides`` change the language model's fields
    (the text config of a composite model)."""
    import transformers

    cls_name, kw = entry(family)["config"]
    kw = dict(kw)
    if "text_config" in kw:
        kw["text_config"] = {"pad_token_id": 0, **kw["text_config"], **(text_overrides or {})}
    else:
        kw.setdefault("pad_token_id", 0)
        kw.update(text_overrides or {})
    return getattr(transformers, cls_name)(**kw)


def has_mtp(family: str) -> bool:
    return any(s.startswith("--mtp-num-layers") for s in entry(family)["spec"])


def _mtp_tensors(family: str, sd: dict, cfg) -> dict:
    """The MTP layer's tensors under the published names (transformers does not build it).

    DeepSeek-V3 / GLM-4.x / GLM-5: ``model.layers.{L}.`` = a full decoder layer (the last layer's
    shapes) plus ``enorm``, ``hnorm``, ``eh_proj``, ``shared_head.norm`` and, as the published
    checkpoints store them, copies of the shared ``embed_tokens`` and ``lm_head`` (``embed_tokens``,
    ``shared_head.head``). Qwen3.5: ``mtp.`` =
    ``fc``, ``pre_fc_norm_embedding``, ``pre_fc_norm_hidden``, one full-attention layer, ``norm``.
    """
    import torch

    g = torch.Generator().manual_seed(7)

    def like(t):
        return (torch.randn(t.shape, generator=g) * 0.05).to(t.dtype)

    out = {}
    if family == "qwen3_5":
        tc = cfg.text_config
        h = tc.hidden_size
        full = next(i for i, t in enumerate(tc.layer_types) if t == "full_attention")
        src = f"model.language_model.layers.{full}."
        for k, t in sd.items():
            if k.startswith(src):
                out["mtp.layers.0." + k[len(src):]] = like(t)
        ref = sd["model.language_model.norm.weight"]
        out["mtp.fc.weight"] = (torch.randn(h, 2 * h, generator=g) * 0.05).to(ref.dtype)
        for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            out[f"mtp.{n}.weight"] = like(ref)
        return out
    L = cfg.num_hidden_layers
    src = f"model.layers.{L - 1}."
    for k, t in sd.items():
        if k.startswith(src):
            out[f"model.layers.{L}." + k[len(src):]] = like(t)
    ref = sd["model.norm.weight"]
    h = ref.shape[0]
    for n in ("enorm", "hnorm", "shared_head.norm"):
        out[f"model.layers.{L}.{n}.weight"] = like(ref)
    out[f"model.layers.{L}.eh_proj.weight"] = (torch.randn(h, 2 * h, generator=g) * 0.05).to(ref.dtype)
    out[f"model.layers.{L}.embed_tokens.weight"] = sd["model.embed_tokens.weight"].clone()
    out[f"model.layers.{L}.shared_head.head.weight"] = sd["lm_head.weight"].clone()
    return out


def mtp_reference_log_probs(family: str, hf: str | Path, ids, dtype: str = "float32", device: str = "cpu"):
    """(log-probs of the main head [1, S, V], of the MTP head [1, S-1, V]) for ``ids`` [1, S].

    transformers builds these models without their MTP layer, so the MTP head is its published
    formula on transformers' own parts of the family (decoder layer, norm class, rotary embedding,
    output head), loaded with the MTP layer's weights, eager attention::

        h'_i = eh_proj(cat(enorm(embed(t_{i+1})), hnorm(h_i)))   h_i: the final (normed) hidden state
        logits_i = lm_head(head_norm(decoder_layer(h'_i)))        predicts t_{i+2}
    """
    import torch
    import transformers
    from safetensors.torch import load_file

    dt = getattr(torch, dtype)
    cls = transformers.Qwen3_5ForConditionalGeneration if family == "qwen3_5" else transformers.AutoModelForCausalLM
    model = cls.from_pretrained(hf, dtype=dt, attn_implementation="eager").to(device).eval()
    sd: dict = {}
    for f in Path(hf).glob("*.safetensors"):
        sd.update({k: v.to(device, dt) for k, v in load_file(str(f)).items()})
    composite = family == "qwen3_5"
    lm = model.model.language_model if composite else model.model
    cfg = lm.config
    L, H = cfg.num_hidden_layers, cfg.hidden_size
    if composite:  # Qwen3.5: mtp.{fc, pre_fc_norm_embedding, pre_fc_norm_hidden, layers.0, norm}
        own = {"eh_proj": "mtp.fc.weight", "enorm": "mtp.pre_fc_norm_embedding.weight",
               "hnorm": "mtp.pre_fc_norm_hidden.weight", "head_norm": "mtp.norm.weight"}
        prefix = "mtp.layers.0."
        layer = type(lm.layers[-1])(cfg, layer_idx=cfg.layer_types.index("full_attention")).to(device, dt).eval()
        layer.load_state_dict({k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}, strict=True)
    else:  # DeepSeek-V3 / GLM-4.x: model.layers.{L}.{enorm, hnorm, eh_proj, shared_head.norm} + a decoder layer
        prefix = f"model.layers.{L}."
        own = {k: prefix + v for k, v in (("eh_proj", "eh_proj.weight"), ("enorm", "enorm.weight"),
                                          ("hnorm", "hnorm.weight"), ("head_norm", "shared_head.norm.weight"))}
        # the same checkpoint read with L + 1 layers: transformers loads (and fuses) layer L's experts itself
        # (per-layer lists in the config grow by the last layer's entry: the MTP layer copies its kind)
        per_layer = {k: v + v[-1:] for k in ("mlp_layer_types", "layer_types")
                     if isinstance(v := getattr(cfg, k, None), list) and len(v) == L}
        longer = cls.from_pretrained(hf, dtype=dt, attn_implementation="eager", num_hidden_layers=L + 1, **per_layer)
        layer = longer.model.layers[L].to(device).eval()
        loaded = dict(layer.named_parameters()) | dict(layer.named_buffers())
        for k in ("input_layernorm.weight", "mlp.gate.e_score_correction_bias", "self_attn.o_proj.weight"):
            if prefix + k in sd and not torch.equal(loaded[k].to(dt), sd[prefix + k]):
                raise RuntimeError(f"{prefix + k} did not load into the reference layer")

    def norm(key):
        n = type(lm.norm)(H, eps=cfg.rms_norm_eps).to(device, dt)
        n.load_state_dict({"weight": sd[own[key]]})
        return n

    ids = ids.to(device)
    with torch.no_grad():
        main = model(input_ids=ids).logits
        h = lm(input_ids=ids).last_hidden_state  # after the final norm, as megatron-core hands it to MTP
        x = torch.cat([norm("enorm")(lm.embed_tokens(ids[:, 1:])), norm("hnorm")(h[:, :-1])], -1)
        x = torch.nn.functional.linear(x, sd[own["eh_proj"]])
        n = x.shape[1]
        pos = torch.arange(n, device=device)[None]
        rope = lm.rotary_emb(x, pos.view(1, 1, -1).expand(3, 1, -1) if composite else pos)
        mask = torch.full((n, n), torch.finfo(dt).min, device=device, dtype=dt).triu(1)[None, None]
        y = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=rope)
        y = y[0] if isinstance(y, tuple) else y
        mtp = model.lm_head(norm("head_norm")(y))
    return torch.log_softmax(main.float(), -1), torch.log_softmax(mtp.float(), -1)


def build(family: str, out: str | Path, dtype: str = "bfloat16", seed: int = 0,
          text_overrides: dict[str, Any] | None = None, mtp: bool = True, spec: bool = True,
          hf_dir: str | Path | None = None) -> tuple[Path, Path]:
    """Write ``out/hf`` (config.json + model.safetensors) and ``out/spec.sh``; returns both paths.
    ``text_overrides``: language-model config changes (tools/tiny/prepare.py's twins: the tiny
    tokenizer's vocabulary and special tokens); ``mtp`` False: no MTP layer (its config count is
    the caller's to zero); ``spec`` False: no spec.sh (the twin's spec is in scripts/models/);
    ``hf_dir``: the checkpoint's directory instead of ``out/hf``."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    out = Path(out)
    hf = Path(hf_dir) if hf_dir is not None else out / "hf"
    cfg = make_config(family, text_overrides)
    torch.manual_seed(seed)
    if family == "qwen3_5":
        model = transformers.Qwen3_5ForConditionalGeneration(cfg)
    else:
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # norms, biases and router biases off their init so none is trivial
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith("bias") or "correction_bias" in n or n.endswith(("A_log", "dt_bias")):
                p.add_(torch.randn_like(p) * 0.1)
        for n, b in model.named_buffers():
            if "correction_bias" in n:
                b.add_(torch.rand_like(b) * 0.1)
    model.to(getattr(torch, dtype))
    for n, b in model.named_buffers():  # published checkpoints keep the router's expert bias in fp32
        if "correction_bias" in n:
            b.data = b.data.float()
    model.save_pretrained(hf)
    files = sorted(hf.glob("*.safetensors"))
    sd: dict = {}
    for f in files:
        sd.update(load_file(str(f)))
    if mtp and has_mtp(family):
        sd.update(_mtp_tensors(family, sd, cfg))
        for f in files:
            f.unlink()
        (hf / "model.safetensors.index.json").unlink(missing_ok=True)
        save_file({k: v.contiguous() for k, v in sd.items()}, str(hf / "model.safetensors"), metadata={"format": "pt"})
    spec_path = out / "spec.sh"
    if spec:
        spec_path.write_text(spec_text(family))
    return hf, spec_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="tiny reference checkpoints of the six seeded families")
    ap.add_argument("--out", required=True)
    ap.add_argument("--family", action="append", choices=sorted(FAMILIES))
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    a = ap.parse_args(argv)
    for fam in a.family or sorted(FAMILIES):
        hf, spec = build(fam, Path(a.out) / fam, a.dtype)
        n = len(json.loads((hf / "config.json").read_text()))
        print(f"{fam}: {hf} ({n} config keys), {spec}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
