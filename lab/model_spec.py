"""Read a `scripts/models/*.sh` model spec (its bash array `MODEL_ARGS`) into a typed `ModelSpec`.

The spec files are the one home of model dimensions. They are parsed here WITHOUT running bash: the
text between `MODEL_ARGS=(` and the closing `)` is tokenized with `shlex` (comments and quotes as
bash treats them), so reading a spec is safe and fast, and the result is cached per file version.

Parameter counts are computed from the dimensions (weights of embeddings, attention, MLP/experts,
router, norms); they exclude the MTP draft layer and the GDN-specific projections of hybrid models,
whose dimensions live in config.json (a hybrid model's GDN layers are counted as attention-sized).
"""
from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

REPO_ROOT = Path(__file__).resolve().parent.parent
MODELS_DIR = REPO_ROOT / "scripts" / "models"


class ModelSpecError(ValueError):
    """A spec file is missing, has no MODEL_ARGS array, or has a value that is not a number."""


class ModelSpec(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str = Field(description="Spec file name without .sh, e.g. glm4-9B.")
    layers: int
    hidden: int
    heads: int
    kv_groups: int = Field(description="Query groups (GQA); equals heads without GQA.")
    kv_channels: int = Field(description="Head dimension of (non-MLA) attention.")
    ffn: int = Field(description="FFN hidden size of dense layers.")
    vocab: int
    tied_embeddings: bool
    norm_eps: float
    rope_base: float
    rotary_percent: float = 1.0
    qkv_bias: bool = False
    qk_layernorm: bool = False
    attention_output_gate: bool = False
    # MoE
    experts: int = 0
    topk: int = 0
    moe_ffn: int = 0
    shared_ffn: int = 0
    moe_layer_pattern: tuple[int, ...] = Field((), description="1 = MoE layer, 0 = dense, per layer; empty for dense models.")
    router_groups: int = 0
    router_group_topk: int = 0
    # MLA
    mla: bool = False
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_head_dim: int = 0
    qk_pos_emb_head_dim: int = 0
    v_head_dim: int = 0
    # DSA
    dsa: bool = False
    index_n_heads: int = 0
    index_head_dim: int = 0
    index_topk_freq: int = 1
    index_skip_topk_offset: int = 1
    allgather_cp: bool = False
    # hybrid / MTP
    hybrid: bool = Field(False, description="Hybrid linear (Gated DeltaNet) + full attention; pattern from config.json.")
    mtp_layers: int = Field(0, description="MTP layers in the checkpoint (an EAGLE draft head).")
    args: dict[str, Any] = Field(default_factory=dict, description="Every flag of MODEL_ARGS (True for switches).")
    _memo: dict[str, Any] = PrivateAttr(default_factory=dict)  # derived numbers, computed once per spec

    def _cached(self, key: str, fn: Any) -> Any:
        if key not in self._memo:
            self._memo[key] = fn()
        return self._memo[key]

    # --- derived ---------------------------------------------------------------------------------

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        return self._cached("moe_layers", lambda: sum(self.moe_layer_pattern) if self.is_moe else 0)

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    def dsa_computes_index(self, layer: int) -> bool:
        """Whether 0-based `layer` computes the DSA index top-k (others reuse the last one)."""
        if not self.dsa:
            return True
        off, freq = self.index_skip_topk_offset, max(self.index_topk_freq, 1)
        return layer < off - 1 or (layer - off + 1) % freq == 0

    def _attention_params(self) -> int:
        h = self.hidden
        if self.mla:
            qk = self.qk_head_dim + self.qk_pos_emb_head_dim
            q = h * self.q_lora_rank + self.q_lora_rank * self.heads * qk if self.q_lora_rank else h * self.heads * qk
            kv = h * (self.kv_lora_rank + self.qk_pos_emb_head_dim) + self.kv_lora_rank * self.heads * (self.qk_head_dim + self.v_head_dim)
            o = self.heads * self.v_head_dim * h
            idx = 0
            if self.dsa:
                idx = (self.q_lora_rank or h) * self.index_n_heads * self.index_head_dim + h * self.index_head_dim + h * self.index_n_heads
            return q + kv + o + idx
        d = self.kv_channels
        q = h * self.heads * d * (2 if self.attention_output_gate else 1)
        kv = 2 * h * self.kv_groups * d
        o = self.heads * d * h
        bias = (self.heads + 2 * self.kv_groups) * d if self.qkv_bias else 0
        return q + kv + o + bias

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden * self.moe_ffn

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    def _layer_params(self, active: bool) -> int:
        attn = self._attention_params() + 2 * self.hidden
        dense_mlp = 3 * self.hidden * self.ffn
        total = self.dense_layers * (attn + dense_mlp)
        if self.is_moe:
            routed = self.topk if active else self.experts
            moe = routed * self.expert_params + 3 * self.hidden * self.shared_ffn + self.hidden * self.experts
            total += self.moe_layers * (attn + moe)
        return total

    @property
    def total_params(self) -> int:
        """All weights (embeddings included, MTP layer excluded)."""
        return self._cached("total", lambda: self._layer_params(active=False) + self.embedding_params + self.hidden)

    @property
    def active_params(self) -> int:
        """Weights used per token, excluding embeddings (the convention of "A37B", "A3B" ...)."""
        return self._cached("active", lambda: self._layer_params(active=True))

    def summary(self) -> str:
        return self._cached("summary", self._summary)

    def _summary(self) -> str:
        parts = [f"{self.layers} layers", f"hidden {self.hidden}"]
        if self.mla:
            parts.append(f"MLA {self.heads} heads (q-lora {self.q_lora_rank}, kv-lora {self.kv_lora_rank})")
        else:
            parts.append(f"{self.heads} heads / {self.kv_groups} KV groups")
        if self.is_moe:
            parts.append(f"{self.dense_layers} dense + {self.moe_layers} MoE layers, {self.experts} experts top-{self.topk}")
        else:
            parts.append(f"FFN {self.ffn}")
        if self.dsa:
            parts.append(f"DSA index every {self.index_topk_freq} layers (offset {self.index_skip_topk_offset})")
        if self.hybrid:
            parts.append("Gated DeltaNet + gated attention (pattern from config.json)")
        parts.append(f"≈{self.total_params / 1e9:.1f}B params, {self.active_params / 1e9:.1f}B active")
        return ", ".join(parts)


# --- parsing -------------------------------------------------------------------------------------

def parse_model_args(text: str) -> list[str]:
    """Tokens of the `MODEL_ARGS=( ... )` array, read by the runtime's own spec reader (torch-free),
    so that the lab and the trainer can never read a spec differently."""
    from slime.backends.megatron.model_args import ModelArgsError, model_args_from_text

    try:
        return model_args_from_text(text, "MODEL_ARGS")
    except (ModelArgsError, ValueError) as exc:
        raise ModelSpecError(str(exc)) from exc


def args_to_dict(tokens: list[str]) -> dict[str, Any]:
    """`--flag value` pairs into a dict keyed by the flag's dashed name; a bare flag is True.
    The runtime's own flag reader does the work, so a spec means the same to the lab and the trainer."""
    from slime.backends.megatron.model_args import ModelArgsError, flags_from_argv

    try:
        flags = flags_from_argv(tokens)
    except ModelArgsError as exc:
        raise ModelSpecError(f"MODEL_ARGS: {exc}") from exc
    return {key.replace("_", "-"): value for key, value in flags.items()}


_FREQ_TERM = re.compile(r"^\[([01](?:\s*,\s*[01])*)\]\s*\*\s*(\d+)$")


def parse_moe_layer_freq(value: Any, layers: int) -> tuple[int, ...]:
    """Megatron's --moe-layer-freq: an int k (every k-th layer MoE), a list, or "[0]*3+[1]*89"."""
    s = str(value).replace(" ", "")
    if s.isdigit():
        k = int(s)
        return tuple(1 if i % k == 0 else 0 for i in range(layers))
    pattern: list[int] = []
    if s.startswith("[") and s.endswith("]") and "*" not in s:
        pattern = [int(x) for x in s[1:-1].split(",") if x]
    else:
        for term in s.split("+"):
            m = _FREQ_TERM.match(term)
            if not m:
                raise ModelSpecError(f"--moe-layer-freq: cannot read {value!r}")
            pattern += [int(x) for x in m.group(1).split(",")] * int(m.group(2))
    if len(pattern) != layers:
        raise ModelSpecError(f"--moe-layer-freq {value!r} describes {len(pattern)} layers, --num-layers is {layers}")
    return tuple(pattern)


def _int(args: dict[str, Any], key: str, default: int = 0) -> int:
    v = args.get(key)
    if v is None:
        return default
    try:
        return int(v)
    except (TypeError, ValueError) as exc:
        raise ModelSpecError(f"--{key} must be an integer, got {v!r}") from exc


def _float(args: dict[str, Any], key: str, default: float) -> float:
    v = args.get(key)
    if v is None:
        return default
    try:
        return float(v)
    except (TypeError, ValueError) as exc:
        raise ModelSpecError(f"--{key} must be a number, got {v!r}") from exc


def spec_from_text(text: str, name: str = "spec") -> ModelSpec:
    args = args_to_dict(parse_model_args(text))
    for required in ("num-layers", "hidden-size", "num-attention-heads", "vocab-size"):
        if required not in args:
            raise ModelSpecError(f"{name}: MODEL_ARGS lacks --{required}")
    layers = _int(args, "num-layers")
    hidden = _int(args, "hidden-size")
    heads = _int(args, "num-attention-heads")
    experts = _int(args, "num-experts")
    pattern: tuple[int, ...] = ()
    if experts:
        pattern = parse_moe_layer_freq(args.get("moe-layer-freq", 1), layers)
    return ModelSpec(
        name=name,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_groups=_int(args, "num-query-groups", heads) if "group-query-attention" in args else heads,
        kv_channels=_int(args, "kv-channels", hidden // heads),
        ffn=_int(args, "ffn-hidden-size", 4 * hidden),
        vocab=_int(args, "vocab-size"),
        tied_embeddings="untie-embeddings-and-output-weights" not in args,
        norm_eps=_float(args, "norm-epsilon", 1e-5),
        rope_base=_float(args, "rotary-base", 10000.0),
        rotary_percent=_float(args, "rotary-percent", 1.0),
        qkv_bias="add-qkv-bias" in args,
        qk_layernorm="qk-layernorm" in args,
        attention_output_gate="attention-output-gate" in args,
        experts=experts,
        topk=_int(args, "moe-router-topk"),
        moe_ffn=_int(args, "moe-ffn-hidden-size"),
        shared_ffn=_int(args, "moe-shared-expert-intermediate-size"),
        moe_layer_pattern=pattern,
        router_groups=_int(args, "moe-router-num-groups"),
        router_group_topk=_int(args, "moe-router-group-topk"),
        mla="multi-latent-attention" in args,
        q_lora_rank=_int(args, "q-lora-rank"),
        kv_lora_rank=_int(args, "kv-lora-rank"),
        qk_head_dim=_int(args, "qk-head-dim"),
        qk_pos_emb_head_dim=_int(args, "qk-pos-emb-head-dim"),
        v_head_dim=_int(args, "v-head-dim"),
        dsa="enable-dsa-indexer" in args,
        index_n_heads=_int(args, "index-n-heads"),
        index_head_dim=_int(args, "index-head-dim"),
        index_topk_freq=_int(args, "index-topk-freq", 1),
        index_skip_topk_offset=_int(args, "index-skip-topk-offset", 1),
        allgather_cp="allgather-cp" in args,
        hybrid="hybrid-linear-attention" in args,
        mtp_layers=_int(args, "mtp-num-layers"),
        args=args,
    )


@lru_cache(maxsize=64)
def _load_cached(path: str, mtime_ns: int) -> ModelSpec:
    p = Path(path)
    return spec_from_text(p.read_text(encoding="utf-8"), name=p.stem)


@lru_cache(maxsize=256)
def _resolve(path: str) -> str:
    p = Path(path)
    return str(p if p.is_absolute() else REPO_ROOT / p)


def load_model_spec(path: str | Path) -> ModelSpec:
    """The spec at `path` (absolute, or relative to the repository root, e.g. scripts/models/glm4-9B.sh).

    Cached per (file, modification time): an edited spec is re-read, an unchanged one costs a stat.
    """
    p = _resolve(str(path))
    try:
        mtime = os.stat(p).st_mtime_ns
    except FileNotFoundError as exc:
        raise ModelSpecError(f"model spec not found: {p}") from exc
    try:
        return _load_cached(p, mtime)
    except ModelSpecError as exc:
        raise ModelSpecError(f"{p}: {exc}") from exc


def spec_for_recipe(recipe_name: str) -> ModelSpec:
    from lab.recipes import get_recipe

    return load_model_spec(get_recipe(recipe_name).model_spec)


# --- config.json comparison (PAR-7) ---------------------------------------------------------------

def _flatten_config(config: dict[str, Any]) -> dict[str, Any]:
    cfg = dict(config)
    for nested in ("text_config", "language_config"):
        if isinstance(config.get(nested), dict):
            cfg = {**cfg, **config[nested]}
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if "rope_theta" not in cfg and isinstance(rope, dict) and "rope_theta" in rope:
        cfg["rope_theta"] = rope["rope_theta"]
    return cfg


def compare_with_hf_config(spec: ModelSpec, config_json: dict[str, Any]) -> list[str]:
    """Fields where a checkpoint's config.json and the model spec disagree, one sentence each.

    Compared (PAR-7): hidden size, heads, layers, FFN, MoE FFN, shared-expert FFN, tied embeddings,
    norm epsilon, rope base; plus KV groups (non-MLA) and vocabulary size. A key absent from the
    config is not compared.
    """
    cfg = _flatten_config(config_json)
    diffs: list[str] = []

    def cmp(key: str, theirs: Any, ours: Any, label: str) -> None:
        if theirs is None:
            return
        if isinstance(ours, float) or isinstance(theirs, float):
            same = abs(float(theirs) - float(ours)) <= 1e-9 * max(abs(float(ours)), 1.0)
        else:
            same = theirs == ours
        if not same:
            diffs.append(f"{label} ({key}): config.json {theirs!r}, model spec {spec.name} {ours!r}")

    cmp("hidden_size", cfg.get("hidden_size"), spec.hidden, "hidden size")
    cmp("num_attention_heads", cfg.get("num_attention_heads"), spec.heads, "attention heads")
    cmp("num_hidden_layers", cfg.get("num_hidden_layers", cfg.get("num_layers")), spec.layers, "layers")
    cmp("intermediate_size", cfg.get("intermediate_size", cfg.get("ffn_hidden_size")), spec.ffn, "FFN")
    if spec.is_moe or "moe_intermediate_size" in cfg:
        cmp("moe_intermediate_size", cfg.get("moe_intermediate_size"), spec.moe_ffn, "MoE FFN")
        shared = cfg.get("shared_expert_intermediate_size")
        if shared is None and cfg.get("n_shared_experts") is not None and cfg.get("moe_intermediate_size") is not None:
            shared = int(cfg["n_shared_experts"]) * int(cfg["moe_intermediate_size"])
        cmp("shared_expert_intermediate_size", shared, spec.shared_ffn, "shared-expert FFN")
        cmp("n_routed_experts", cfg.get("n_routed_experts", cfg.get("num_experts")), spec.experts, "experts")
    if "tie_word_embeddings" in cfg:
        cmp("tie_word_embeddings", bool(cfg["tie_word_embeddings"]), spec.tied_embeddings, "tied embeddings")
    cmp("rms_norm_eps", cfg.get("rms_norm_eps", cfg.get("layernorm_epsilon", cfg.get("layer_norm_epsilon"))), spec.norm_eps, "norm epsilon")
    cmp("rope_theta", cfg.get("rope_theta"), spec.rope_base, "rope base")
    if not spec.mla:
        cmp("num_key_value_heads", cfg.get("num_key_value_heads", cfg.get("multi_query_group_num")), spec.kv_groups, "KV groups")
    cmp("vocab_size", cfg.get("vocab_size", cfg.get("padded_vocab_size")), spec.vocab, "vocabulary size")
    return diffs
