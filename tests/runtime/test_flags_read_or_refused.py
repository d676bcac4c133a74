"""Every flag the parser accepts is read by the runtime or refused before start, naming it.

Three walks: (1) every argparse destination goes into the Config (nothing dropped at parse time);
(2) every Config field is read somewhere in the runtime (nothing stored and forgotten); (3) every
Megatron pass-through flag, given to the embedded backend, is read (LR schedule), compared with
config.json (model spec) or refused by the capability table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path

import pytest

import slime.config as config_mod
from slime.args import MEGATRON_FLAGS, build_config, parse_args, validate
from slime.backends.embedded import capabilities as caps
from slime.flags import FLAGS
from tests.refusal_codes import codes, has

REPO = Path(__file__).resolve().parents[2]
BASE = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "1", "--rm-type", "math"]


class _Recording(argparse.Namespace):
    def __getattribute__(self, name):
        if not name.startswith("_"):
            object.__getattribute__(self, "_seen").add(name)
        return object.__getattribute__(self, name)


# Read by the entry points before parsing (train.py / train_async.py hand --dry-run to slime.dry_run).
ENTRY_POINT_DESTS = ("help", "dry_run")


def test_every_parsed_flag_goes_into_the_config():
    ns = _Recording()
    object.__setattr__(ns, "_seen", set())
    for flag in FLAGS:
        if flag.dest not in ENTRY_POINT_DESTS:
            setattr(ns, flag.dest, flag.default)
    object.__getattribute__(ns, "_seen").clear()
    build_config(ns, {}, {})
    seen = object.__getattribute__(ns, "_seen")
    dropped = sorted(f.name for f in FLAGS if f.dest not in ENTRY_POINT_DESTS and f.dest not in seen)
    assert not dropped, f"parsed but never put into the Config: {dropped}"


def _runtime_sources() -> str:
    files = list((REPO / "slime").rglob("*.py"))  # config.py too: its properties read fields
    files += [REPO / "train.py", REPO / "train_async.py"]
    return "\n".join(p.read_text() for p in files)


def test_every_config_field_is_read_by_the_runtime():
    src = _runtime_sources()
    unread = []
    for name, cls in vars(config_mod).items():
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)) or name == "Config":
            continue
        for f in dataclasses.fields(cls):
            # an attribute read (not the parser's `ns.x`), or a getattr by name
            if not re.search(rf"(?<!\bns)\.{f.name}\b", src) and f'"{f.name}"' not in src:
                unread.append(f"{name}.{f.name}")
    assert not unread, f"stored in the Config and never read: {unread}"


# A config.json that contradicts every model-spec flag below.
CONTRARY = {"model_type": "llama", "num_hidden_layers": 3, "hidden_size": 96, "intermediate_size": 200,
            "num_attention_heads": 6, "num_key_value_heads": 6, "head_dim": 16, "vocab_size": 50,
            "rms_norm_eps": 1e-5, "rope_theta": 5000.0, "tie_word_embeddings": True, "attention_bias": False,
            "hidden_act": "gelu", "mlp_bias": True, "max_position_embeddings": 8, "n_routed_experts": 4,
            "num_experts_per_tok": 2, "moe_intermediate_size": 64, "q_lora_rank": 8, "kv_lora_rank": 8,
            "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8}
PLAIN = {"model_type": "llama", "num_attention_heads": 4, "hidden_size": 64}  # no rope, no MLA
SPEC_VALUES = {"normalization": "LayerNorm", "position_embedding_type": "rope", "max_position_embeddings": "64",
               "moe_router_topk": "3"}
ON_PLAIN = ("multi_latent_attention", "position_embedding_type", "use_rotary_position_embeddings")
NEEDS = {"moe_router_topk": ["--num-experts", "4"], "moe_ffn_hidden_size": ["--num-experts", "4"],
         **{k: ["--multi-latent-attention"] for k in ("q_lora_rank", "kv_lora_rank", "qk_head_dim",
                                                       "qk_pos_emb_head_dim", "v_head_dim")}}


@pytest.fixture(scope="module")
def contrary_checkpoint(tmp_path_factory):
    d = tmp_path_factory.mktemp("contrary")
    (d / "config.json").write_text(json.dumps(CONTRARY))
    (d / "plain").mkdir()
    (d / "plain" / "config.json").write_text(json.dumps(PLAIN))
    return d


def _switch(flag: str) -> bool:
    return flag[2:].replace("-", "_") in {"group_query_attention", "swiglu", "untie_embeddings_and_output_weights",
                                          "add_qkv_bias", "multi_latent_attention", "disable_bias_linear",
                                          "use_rotary_position_embeddings"}


def _flag_argv(flag: str) -> list[str]:
    key = flag[2:].replace("-", "_")
    if key in ("rope_theta",):
        return [flag]
    if _switch(flag):
        return [flag]
    return [flag, SPEC_VALUES.get(key, "2")]


WALKED = sorted(MEGATRON_FLAGS | {"--moe-aux-loss-coeff", "--mtp-num-layers", "--fp8-format", "--index-topk"})


@pytest.mark.parametrize("flag", WALKED)
def test_every_megatron_flag_is_read_checked_or_refused_by_the_embedded_backend(flag, contrary_checkpoint):
    key = flag[2:].replace("-", "_")
    ckpt = contrary_checkpoint / "plain" if key in ON_PLAIN else contrary_checkpoint
    argv = [*BASE, "--hf-checkpoint", str(ckpt), *NEEDS.get(key, []), *_flag_argv(flag)]
    if key in caps.EMBEDDED_READS_LR:
        value, expected = {"lr_decay_style": ("cosine", "cosine"), "lr_warmup_fraction": ("0.5", 0.5),
                           "min_lr": ("1e-7", 1e-7)}.get(key, ("2", 2))
        assert getattr(parse_args([*BASE, flag, value]).optim, key) == expected, key
        return
    errors = "\n".join(validate(parse_args(argv)))
    if key == "optimizer":  # adam is read (AdamW); anything else is refused
        assert has(validate(parse_args(argv)), "embedded.trainer_optimizer", optimizer="2")
        assert "--optimizer" not in "\n".join(validate(parse_args([*BASE, "--optimizer", "adam"])))
        return
    if key in caps.EMBEDDED_CHECKS_SPEC:  # compared with config.json: the contrary value is named
        assert re.search(rf"config\.json.*spec .*{flag}\b", errors), (flag, errors)
        return
    assert flag in errors, f"{flag} is neither read nor refused by the embedded backend:\n{errors}"


def test_the_tiny_model_spec_passes_its_own_checkpoint(tiny):
    from slime.backends.megatron.model_args import read_model_args

    spec = read_model_args(REPO / "scripts" / "models" / "tiny-cpu.sh")
    cfg = parse_args([*BASE, "--hf-checkpoint", str(tiny["model"]), *spec])
    assert not [e for e in validate(cfg) if "config.json" in e or "Megatron option" in e]


def test_offload_without_colocate_is_refused_by_the_embedded_backend():
    errors = codes(validate(parse_args([*BASE, "--offload"])))
    assert "embedded.trainer_offload" in errors and "embedded.engine_offload" in errors
    assert "--offload" not in " ".join(validate(parse_args([*BASE, "--colocate", "--offload"])))
