"""The one home of model facts: a ``scripts/models/*.sh`` spec read into a typed :class:`ModelSpec`,
and its field-by-field comparison with a checkpoint's ``config.json``.

Torch-free, bash-free and dependency-free (the GPU image has neither pydantic nor the lab), so the lab, the converters, ``experiment.sh check`` and
both trainers read a spec the same way and refuse the same mismatches before any weight is read:

- the text between ``MODEL_ARGS=(`` and its ``)`` is tokenized with shlex (comments and quotes as
  bash treats them; a ``$variable`` is refused: spec files are literal);
- flags use the key convention of ``slime.args`` (``--num-query-groups 2`` -> ``num_query_groups:
  "2"``, a switch -> ``True``), so ``cfg.megatron`` and a spec file read here give the same dict;
- :func:`compare_with_config` returns one :class:`Mismatch` per structural field that differs
  (dimensions, MoE routing, MLA, DSA indexer, linear attention, MTP, norms, rotary, biases).

Run as a module to compare a spec with a config.json (what ``experiment.sh check`` calls)::

    python -m slime.model_spec SPEC.sh CONFIG.json   # exit 0 agree, 1 differ, 3 could not compare
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Sequence, overload

from slime.refusals import Refusal, declare, message_of

REPO_ROOT = Path(__file__).resolve().parent.parent
MODELS_DIR = REPO_ROOT / "scripts" / "models"


class ModelSpecError(ValueError):
    """A spec file is missing, malformed, or has a value that is not what its flag takes."""


_R = declare("model_spec", {
    "no_array": ("path",),
    "shell_variable": ("path", "token"),
    "not_closed": ("path",),
    "stray_value": ("token",),
    "not_integer": ("flag", "value"),
    "not_number": ("flag", "value"),
    "pattern_terms": ("flag", "text"),
    "pattern_layers": ("flag", "text", "count", "layers"),
    "lacks": ("name", "flags"),
    "not_found": ("path",),
    "in_file": ("path", "error"),
    "mismatch": ("field", "config_key", "config", "flag", "spec"),
    "config_missing": ("path",),
    "config_differs": ("path", "count", "fields"),
    "could_not_compare": ("error",),
})


# --- reading MODEL_ARGS -------------------------------------------------------------------------

_ARRAY_RE = re.compile(r"^\s*MODEL_ARGS=\(", re.M)


def model_args_from_text(text: str, path: str = "spec") -> list[str]:
    """The tokens of the ``MODEL_ARGS=( ... )`` array (comments dropped)."""
    m = _ARRAY_RE.search(text)
    if not m:
        raise ModelSpecError(_R("no_array", path=str(path)))
    lexer = shlex.shlex(text[m.end():], posix=True, punctuation_chars="()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    tokens: list[str] = []
    for tok in lexer:
        if tok == ")":
            return tokens
        if "$" in tok:
            raise ModelSpecError(_R("shell_variable", path=str(path), token=tok))
        tokens.append(tok)
    raise ModelSpecError(_R("not_closed", path=str(path)))


def read_model_args(path: str | Path) -> list[str]:
    return model_args_from_text(Path(path).read_text(encoding="utf-8"), str(path))


def flags_from_argv(argv: Sequence[str]) -> dict[str, Any]:
    """``['--num-layers', '2', '--swiglu', '--spec', 'mod', 'fn']`` ->
    ``{'num_layers': '2', 'swiglu': True, 'spec': ['mod', 'fn']}``: a bare flag is True, one value a
    string, several values (Megatron's nargs flags such as --spec) a list."""
    flags: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        tok = argv[i]
        if not tok.startswith("--"):
            raise ModelSpecError(_R("stray_value", token=tok))
        name, eq, val = tok[2:].partition("=")
        key = name.replace("-", "_")
        i += 1
        if eq:
            flags[key] = val
            continue
        values = []
        while i < len(argv) and not argv[i].startswith("--"):
            values.append(argv[i])
            i += 1
        flags[key] = True if not values else values[0] if len(values) == 1 else values
    return flags


def load_flags(spec: str | Path | Sequence[str] | Mapping[str, Any]) -> dict[str, Any]:
    """A spec file path, an argv list or an already-parsed flag dict -> flag dict."""
    if isinstance(spec, Mapping):
        return dict(spec)
    if isinstance(spec, (str, Path)):
        return flags_from_argv(read_model_args(spec))
    return flags_from_argv(list(spec))


def _plain(v: Any) -> Any:
    """A flag value as a refusal parameter (JSON-friendly: strings and numbers as they are)."""
    return v if isinstance(v, (str, int, float, bool)) or v is None else str(v)


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


@overload
def flag_int(flags: Mapping[str, Any], key: str) -> int | None: ...
@overload
def flag_int(flags: Mapping[str, Any], key: str, default: int) -> int: ...
def flag_int(flags: Mapping[str, Any], key: str, default: int | None = None) -> int | None:
    v = flags.get(key)
    if v is None or v is False:
        return default
    try:
        return int(v)
    except (TypeError, ValueError):
        raise ModelSpecError(_R("not_integer", flag=_flag(key), value=_plain(v))) from None


@overload
def flag_float(flags: Mapping[str, Any], key: str) -> float | None: ...
@overload
def flag_float(flags: Mapping[str, Any], key: str, default: float) -> float: ...
def flag_float(flags: Mapping[str, Any], key: str, default: float | None = None) -> float | None:
    v = flags.get(key)
    if v is None or v is False:
        return default
    try:
        return float(v)
    except (TypeError, ValueError):
        raise ModelSpecError(_R("not_number", flag=_flag(key), value=_plain(v))) from None


def flag_bool(flags: Mapping[str, Any], key: str) -> bool:
    v = flags.get(key, False)
    if isinstance(v, str):
        return v.lower() not in ("0", "false", "no", "")
    return bool(v)


def parse_layer_pattern(value: Any, num_layers: int, flag: str = "--moe-layer-freq") -> list[int] | int:
    """``--moe-layer-freq`` / ``--linear-attention-freq``: an int k, or ``"[0]*3+[1]*58"`` / a list.

    Evaluated without ``eval``: ``[a, b]*n`` terms joined by ``+``. An int is returned as is (its
    meaning differs per flag: :func:`expand_layer_pattern`).
    """
    if isinstance(value, int):
        return value
    text = str(value).strip().strip("'\"")
    if re.fullmatch(r"\d+", text):
        return int(text)
    out: list[int] = []
    for term in text.split("+"):
        m = re.fullmatch(r"\s*\(?\s*(\[[^\]]*\])\s*(?:\*\s*(\d+))?\s*\)?\s*", term)
        if not m:
            raise ModelSpecError(_R("pattern_terms", flag=flag, text=text))
        items = ast.literal_eval(m.group(1))
        out.extend([int(x) for x in items] * int(m.group(2) or 1))
    if len(out) != num_layers:
        raise ModelSpecError(_R("pattern_layers", flag=flag, text=text, count=len(out), layers=num_layers))
    return out


def expand_layer_pattern(value: Any, num_layers: int, flag: str) -> tuple[int, ...]:
    """Per-layer 0/1 pattern. ``--moe-layer-freq k``: every k-th layer (from 0) is MoE;
    ``--linear-attention-freq k``: every k-th layer (1-based) is full attention, the others linear
    (megatron-core's meanings)."""
    p = parse_layer_pattern(value, num_layers, flag)
    if isinstance(p, list):
        return tuple(p)
    k = max(p, 1)
    if flag == "--linear-attention-freq":
        return tuple(0 if (i + 1) % k == 0 else 1 for i in range(num_layers))
    return tuple(1 if i % k == 0 else 0 for i in range(num_layers))


# --- the typed spec -----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Everything structural a spec file says, typed (derived numbers are cached properties)."""

    name: str  # spec file name without .sh, e.g. glm4-9B
    layers: int
    hidden: int
    heads: int
    kv_groups: int  # query groups (GQA); equals heads without GQA
    kv_channels: int  # head dim of (non-MLA) attention
    ffn: int
    vocab: int
    tied_embeddings: bool
    norm_eps: float
    norm_1p: bool = False
    post_norms: bool = False
    rope_base: float
    rotary_percent: float = 1.0
    rotary_interleaved: bool = False
    rope_scaling_factor: float = 0.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    qkv_bias: bool = False
    qk_layernorm: bool = False
    attention_output_gate: bool = False
    # MoE
    experts: int = 0
    topk: int = 0
    moe_ffn: int = 0
    shared_ffn: int = 0
    moe_layer_pattern: tuple[int, ...] = ()  # 1 = MoE layer, 0 = dense; empty for dense models
    router_groups: int = 0
    router_group_topk: int = 0
    topk_scaling: float = 1.0
    score_function: str = "softmax"
    expert_bias: bool = False
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
    index_topk: int = 0
    index_topk_freq: int = 1
    index_skip_topk_offset: int = 1
    allgather_cp: bool = False
    # hybrid linear attention (Gated DeltaNet)
    hybrid: bool = False
    linear_layer_pattern: tuple[int, ...] = ()  # 1 = linear-attention layer, 0 = full attention
    linear_conv_kernel_dim: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    mtp_layers: int = 0
    args: dict[str, Any] = field(default_factory=dict, compare=False)  # every flag, dashed names
    _memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def _cached(self, key: str, fn: Any) -> Any:
        if key not in self._memo:
            self._memo[key] = fn()
        return self._memo[key]

    # --- derived ---------------------------------------------------------------------------------

    @property
    def kind(self) -> Literal["dense", "moe", "hybrid"]:
        """What the lab's rules branch on: hybrid linear/full attention, MoE, or dense."""
        return "hybrid" if self.hybrid else "moe" if self.is_moe else "dense"

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        return self._cached("moe_layers", lambda: sum(self.moe_layer_pattern) if self.is_moe else 0)

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    @property
    def first_dense_layers(self) -> int:
        """Leading dense layers (HF's ``first_k_dense_replace``)."""
        n = 0
        for x in (self.moe_layer_pattern if self.is_moe else ()):
            if x:
                break
            n += 1
        return n if self.is_moe else self.layers

    def dsa_computes_index(self, layer: int) -> bool:
        """Whether 0-based ``layer`` computes the DSA index top-k (others reuse the last one)."""
        if not self.dsa:
            return True
        off, freq = max(self.index_skip_topk_offset, 1), max(self.index_topk_freq, 1)
        return max(layer - off + 1, 0) % freq == 0

    @property
    def dsa_indexer_layers(self) -> int:
        return sum(self.dsa_computes_index(i) for i in range(self.layers)) if self.dsa else 0

    @property
    def linear_layers(self) -> int:
        return sum(self.linear_layer_pattern)

    def _mla_params(self) -> int:
        h = self.hidden
        qk = self.qk_head_dim + self.qk_pos_emb_head_dim
        q = h * self.q_lora_rank + self.q_lora_rank * self.heads * qk if self.q_lora_rank else h * self.heads * qk
        kv = h * (self.kv_lora_rank + self.qk_pos_emb_head_dim) + self.kv_lora_rank * self.heads * (self.qk_head_dim + self.v_head_dim)
        norms = (self.q_lora_rank + self.kv_lora_rank) if self.qk_layernorm else 0
        return q + kv + self.heads * self.v_head_dim * h + norms

    def _indexer_params(self) -> int:
        """One DSA indexer: q from the q latent, one shared key head (+ its norm), head weights."""
        h, d = self.hidden, self.index_head_dim
        return (self.q_lora_rank or h) * self.index_n_heads * d + h * d + 2 * d + h * self.index_n_heads

    def _gqa_params(self) -> int:
        h, d = self.hidden, self.kv_channels
        q = h * self.heads * d * (2 if self.attention_output_gate else 1)
        kv = 2 * h * self.kv_groups * d
        bias = (self.heads + 2 * self.kv_groups) * d if self.qkv_bias else 0
        norms = 2 * d if self.qk_layernorm else 0
        return q + kv + self.heads * d * h + bias + norms

    def _gdn_params(self) -> int:
        """One Gated DeltaNet layer (qkvz and ba projections, depthwise conv, A/dt, gated norm, out)."""
        h = self.hidden
        kd = self.linear_num_key_heads * self.linear_key_head_dim
        vd = self.linear_num_value_heads * self.linear_value_head_dim
        qkvz = h * (2 * kd + 2 * vd)
        ba = h * 2 * self.linear_num_value_heads
        conv = (2 * kd + vd) * self.linear_conv_kernel_dim
        return qkvz + ba + conv + 2 * self.linear_num_value_heads + self.linear_value_head_dim + vd * h

    def _attention_total(self) -> int:
        if self.mla:
            return self.layers * self._mla_params() + self.dsa_indexer_layers * self._indexer_params()
        if self.hybrid and self.linear_layer_pattern:
            return (self.layers - self.linear_layers) * self._gqa_params() + self.linear_layers * self._gdn_params()
        return self.layers * self._gqa_params()

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden * self.moe_ffn

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    def _layer_params(self, active: bool) -> int:
        norms = (4 if self.post_norms else 2) * self.hidden
        total = self._attention_total() + self.layers * norms + self.dense_layers * 3 * self.hidden * self.ffn
        if self.is_moe:
            routed = self.topk if active else self.experts
            moe = routed * self.expert_params + 3 * self.hidden * self.shared_ffn + self.hidden * self.experts
            total += self.moe_layers * moe
        return total

    @property
    def total_params(self) -> int:
        """All weights (embeddings included, MTP layer excluded). With DSA index sharing only the
        layers that compute the index top-k carry an indexer."""
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
            parts.append(f"Gated DeltaNet + gated attention ({self.linear_layers} linear / "
                         f"{self.layers - self.linear_layers} full)")
        parts.append(f"≈{self.total_params / 1e9:.1f}B params, {self.active_params / 1e9:.1f}B active")
        return ", ".join(parts)


def spec_from_flags(flags: Mapping[str, Any], name: str = "spec") -> ModelSpec:
    """Flag dict (underscore keys, as :func:`flags_from_argv` gives) -> :class:`ModelSpec`."""
    required = {k: flag_int(flags, k) for k in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size")}
    missing = [_flag(k) for k, v in required.items() if v is None]
    if missing:
        raise ModelSpecError(_R("lacks", name=name, flags=", ".join(missing)))
    layers, hidden, heads, vocab = (v or 0 for v in required.values())  # none is None (checked above)
    experts = flag_int(flags, "num_experts", 0)
    gqa = flag_bool(flags, "group_query_attention") or "num_query_groups" in flags
    hybrid = "hybrid_linear_attention" in flags or "linear_attention_freq" in flags
    lin: tuple[int, ...] = ()
    if hybrid and "linear_attention_freq" in flags:
        lin = expand_layer_pattern(flags["linear_attention_freq"], layers, "--linear-attention-freq")
    return ModelSpec(
        name=name, layers=layers, hidden=hidden, heads=heads,
        kv_groups=flag_int(flags, "num_query_groups", heads) if gqa else heads,
        kv_channels=flag_int(flags, "kv_channels", hidden // heads),
        ffn=flag_int(flags, "ffn_hidden_size", 4 * hidden),
        vocab=vocab,
        tied_embeddings=not flag_bool(flags, "untie_embeddings_and_output_weights"),
        norm_eps=flag_float(flags, "norm_epsilon", 1e-5),
        norm_1p=flag_bool(flags, "apply_layernorm_1p"),
        post_norms=flag_bool(flags, "post_self_attn_layernorm") or flag_bool(flags, "post_mlp_layernorm"),
        rope_base=flag_float(flags, "rotary_base", 10000.0),
        rotary_percent=flag_float(flags, "rotary_percent", 1.0),
        rotary_interleaved=flag_bool(flags, "rotary_interleaved"),
        rope_scaling_factor=flag_float(flags, "rotary_scaling_factor", 0.0),
        mscale=flag_float(flags, "mscale", 1.0),
        mscale_all_dim=flag_float(flags, "mscale_all_dim", 0.0),
        qkv_bias=flag_bool(flags, "add_qkv_bias") or not flag_bool(flags, "disable_bias_linear"),
        qk_layernorm=flag_bool(flags, "qk_layernorm"),
        attention_output_gate=flag_bool(flags, "attention_output_gate"),
        experts=experts,
        topk=flag_int(flags, "moe_router_topk", 0),
        moe_ffn=flag_int(flags, "moe_ffn_hidden_size", 0),
        shared_ffn=flag_int(flags, "moe_shared_expert_intermediate_size", 0),
        moe_layer_pattern=expand_layer_pattern(flags.get("moe_layer_freq", 1), layers, "--moe-layer-freq") if experts else (),
        router_groups=flag_int(flags, "moe_router_num_groups", 0),
        router_group_topk=flag_int(flags, "moe_router_group_topk", 0),
        topk_scaling=flag_float(flags, "moe_router_topk_scaling_factor", 1.0),
        score_function=str(flags.get("moe_router_score_function", "softmax")),
        expert_bias=flag_bool(flags, "moe_router_enable_expert_bias"),
        mla=flag_bool(flags, "multi_latent_attention"),
        q_lora_rank=flag_int(flags, "q_lora_rank", 0),
        kv_lora_rank=flag_int(flags, "kv_lora_rank", 0),
        qk_head_dim=flag_int(flags, "qk_head_dim", 0),
        qk_pos_emb_head_dim=flag_int(flags, "qk_pos_emb_head_dim", 0),
        v_head_dim=flag_int(flags, "v_head_dim", 0),
        dsa=flag_bool(flags, "enable_dsa_indexer"),
        index_n_heads=flag_int(flags, "index_n_heads", 0),
        index_head_dim=flag_int(flags, "index_head_dim", 0),
        index_topk=flag_int(flags, "index_topk", 0),
        index_topk_freq=flag_int(flags, "index_topk_freq", 1),
        index_skip_topk_offset=flag_int(flags, "index_skip_topk_offset", 1),
        allgather_cp=flag_bool(flags, "allgather_cp"),
        hybrid=hybrid,
        linear_layer_pattern=lin,
        linear_conv_kernel_dim=flag_int(flags, "linear_conv_kernel_dim", 0),
        linear_key_head_dim=flag_int(flags, "linear_key_head_dim", 0),
        linear_value_head_dim=flag_int(flags, "linear_value_head_dim", 0),
        linear_num_key_heads=flag_int(flags, "linear_num_key_heads", 0),
        linear_num_value_heads=flag_int(flags, "linear_num_value_heads", 0),
        mtp_layers=flag_int(flags, "mtp_num_layers", 0),
        args={k.replace("_", "-"): v for k, v in flags.items()},
    )


def spec_from_text(text: str, name: str = "spec") -> ModelSpec:
    return spec_from_flags(flags_from_argv(model_args_from_text(text, name)), name)


@lru_cache(maxsize=64)
def _load_cached(path: str, mtime_ns: int) -> ModelSpec:
    p = Path(path)
    return spec_from_text(p.read_text(encoding="utf-8"), name=p.stem)


def load_model_spec(path: str | Path) -> ModelSpec:
    """The spec at ``path`` (absolute, or relative to the repository root).

    Cached per (file, modification time): an edited spec is re-read, an unchanged one costs a stat.
    """
    given = Path(path)
    p = str(given if given.is_absolute() else REPO_ROOT / given)
    try:
        mtime = os.stat(p).st_mtime_ns
    except FileNotFoundError as exc:
        raise ModelSpecError(_R("not_found", path=p)) from exc
    try:
        return _load_cached(p, mtime)
    except ModelSpecError as exc:
        raise ModelSpecError(_R("in_file", path=p, error=message_of(exc))) from exc


def as_spec(spec: ModelSpec | str | Path | Sequence[str] | Mapping[str, Any]) -> ModelSpec:
    if isinstance(spec, ModelSpec):
        return spec
    if isinstance(spec, (str, Path)):
        return load_model_spec(spec)
    return spec_from_flags(load_flags(spec))


# --- config.json comparison ---------------------------------------------------------------------

MLA_TYPES = ("deepseek_v3", "deepseek_v2", "glm4_moe_lite", "glm_moe_dsa", "kimi_k2")


@dataclass(frozen=True)
class Mismatch:
    """One field where config.json and the spec disagree."""

    field: str       # what it is, in words
    key: str         # config.json key (or the family fact)
    config: Any      # what config.json says
    flag: str        # the spec flag that says otherwise
    spec: Any        # what the spec says

    def __str__(self) -> str:
        return self.refusal

    @property
    def refusal(self) -> Refusal:
        """This difference as a refusal with its code (values shown as Python literals)."""
        return _R("mismatch", field=self.field, config_key=self.key, config=repr(self.config), flag=self.flag,
                  spec=repr(self.spec))


def flatten_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A composite (vision-language) config's ``text_config`` over the top level, rope keys lifted."""
    cfg = dict(config)
    for nested in ("text_config", "language_config"):
        if isinstance(config.get(nested), Mapping):
            cfg = {**cfg, **config[nested]}
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if isinstance(rope, Mapping):
        for k in ("rope_theta", "partial_rotary_factor"):
            if cfg.get(k) is None and rope.get(k) is not None:
                cfg[k] = rope[k]
        if rope.get("rope_type", rope.get("type")) == "yarn":
            cfg.setdefault("_yarn", dict(rope))
    return cfg


def _first(cfg: Mapping[str, Any], *keys: str) -> tuple[str, Any]:
    for k in keys:
        if cfg.get(k) is not None:
            return k, cfg[k]
    return keys[0], None


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) == bool(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    return a == b


def config_moe_pattern(cfg: Mapping[str, Any], layers: int) -> tuple[int, ...] | None:
    """Per-layer MoE pattern a config.json describes (``mlp_layer_types`` / ``first_k_dense_replace``)."""
    types = cfg.get("mlp_layer_types")
    if isinstance(types, list):
        return tuple(1 if t == "sparse" else 0 for t in types)
    k = cfg.get("first_k_dense_replace")
    if k is None:
        return None
    freq = int(cfg.get("moe_layer_freq") or 1)
    return tuple(1 if i >= int(k) and (i - int(k)) % freq == 0 else 0 for i in range(layers))


def config_indexer_pattern(cfg: Mapping[str, Any], layers: int) -> tuple[int, ...] | None:
    """Per-layer "computes its own DSA index" pattern (``indexer_types``, ``index_topk_pattern`` or
    ``index_topk_freq`` + ``index_skip_topk_offset``, as transformers' glm_moe_dsa reads them)."""
    types = cfg.get("indexer_types")
    if isinstance(types, list):
        return tuple(1 if t == "full" else 0 for t in types)
    pat = cfg.get("index_topk_pattern")
    if isinstance(pat, str):
        return tuple(1 if c == "F" else 0 for c in pat)
    if cfg.get("index_topk_freq") is None:
        return None
    freq = max(int(cfg["index_topk_freq"]), 1)
    off = int(cfg.get("index_skip_topk_offset", 2))
    return tuple(1 if max(i - off + 1, 0) % freq == 0 else 0 for i in range(layers))


def config_linear_pattern(cfg: Mapping[str, Any], layers: int) -> tuple[int, ...] | None:
    types = cfg.get("layer_types")
    if isinstance(types, list) and any(t == "linear_attention" for t in types):
        return tuple(1 if t == "linear_attention" else 0 for t in types)
    k = cfg.get("full_attention_interval")
    if k is None:
        return None
    return tuple(0 if (i + 1) % int(k) == 0 else 1 for i in range(layers))


def _pattern_text(p: Iterable[int]) -> str:
    """[0,0,0,1,1] -> "[0]*3+[1]*2" (how the spec files write patterns)."""
    out, prev, n = [], None, 0
    for x in list(p) + [None]:
        if x == prev:
            n += 1
            continue
        if prev is not None:
            out.append(f"[{prev}]*{n}")
        prev, n = x, 1
    return "+".join(out)


def compare_with_config(spec: ModelSpec | str | Path | Mapping[str, Any] | Sequence[str],
                        config_json: Mapping[str, Any]) -> list[Mismatch]:
    """Every structural field where config.json and the spec disagree (empty: they agree).

    A key absent from config.json is not compared (not every family has every key); facts that a
    family fixes in code rather than in config.json (GLM-4's sandwich norms, MLA's latent norms,
    Qwen3.5's (1+w) norms) are compared through ``model_type``.
    """
    s = as_spec(spec)
    cfg = flatten_config(config_json)
    model_type = str(cfg.get("model_type", ""))
    out: list[Mismatch] = []

    def cmp(field: str, keys: Sequence[str], flag: str, ours: Any, theirs: Any = None, found: bool | None = None) -> None:
        key, val = _first(cfg, *keys) if found is None else (keys[0], theirs)
        if val is None:
            return
        if not _same(val, ours):
            out.append(Mismatch(field, key, val, flag, ours))

    def fact(field: str, key: str, want: bool, flag: str, ours: bool) -> None:
        if want != ours:
            out.append(Mismatch(field, key, want, flag, "given" if ours else "absent"))

    cmp("layers", ("num_hidden_layers", "num_layers"), "--num-layers", s.layers)
    cmp("hidden size", ("hidden_size",), "--hidden-size", s.hidden)
    cmp("attention heads", ("num_attention_heads",), "--num-attention-heads", s.heads)
    cmp("vocabulary size", ("vocab_size", "padded_vocab_size"), "--vocab-size", s.vocab)
    cmp("norm epsilon", ("rms_norm_eps", "layernorm_epsilon", "layer_norm_epsilon"), "--norm-epsilon", s.norm_eps)
    cmp("rope base", ("rope_theta",), "--rotary-base", s.rope_base)
    if "tie_word_embeddings" in cfg:
        cmp("tied embeddings", ("tie_word_embeddings",), "--untie-embeddings-and-output-weights (absent = tied)",
            s.tied_embeddings)
    cmp("dense FFN", ("intermediate_size", "ffn_hidden_size"), "--ffn-hidden-size", s.ffn)
    if "partial_rotary_factor" in cfg:
        cmp("partial rotary", ("partial_rotary_factor",), "--rotary-percent", s.rotary_percent)
    if model_type == "qwen2":
        fact("QKV bias", "model_type qwen2 (always biased)", True, "--add-qkv-bias", s.qkv_bias)
    elif cfg.get("attention_bias") is not None:
        cmp("QKV bias", ("attention_bias",), "--add-qkv-bias", s.qkv_bias)
    if s.mla or model_type in MLA_TYPES:
        fact("multi-latent attention", f"model_type {model_type or '?'}", model_type in MLA_TYPES or not model_type,
             "--multi-latent-attention", s.mla)
        cmp("q LoRA rank", ("q_lora_rank",), "--q-lora-rank", s.q_lora_rank or None)
        cmp("kv LoRA rank", ("kv_lora_rank",), "--kv-lora-rank", s.kv_lora_rank)
        cmp("qk head dim (no rope)", ("qk_nope_head_dim",), "--qk-head-dim", s.qk_head_dim)
        cmp("qk rope head dim", ("qk_rope_head_dim",), "--qk-pos-emb-head-dim", s.qk_pos_emb_head_dim)
        cmp("v head dim", ("v_head_dim",), "--v-head-dim", s.v_head_dim)
        if model_type in MLA_TYPES:  # the latent q/kv norms exist in every MLA checkpoint
            fact("latent q/kv norms", f"model_type {model_type}", True, "--qk-layernorm", s.qk_layernorm)
        if cfg.get("rope_interleave") is False:  # megatron-core's MLA rope reads the interleaved layout
            out.append(Mismatch("rope layout", "rope_interleave", False, "--multi-latent-attention (interleaved rope)", True))
        yarn = cfg.get("_yarn")
        if yarn:
            cmp("YaRN factor", ("factor",), "--rotary-scaling-factor", s.rope_scaling_factor, yarn.get("factor"), True)
            cmp("YaRN mscale", ("mscale",), "--mscale", s.mscale, yarn.get("mscale"), True)
            cmp("YaRN mscale_all_dim", ("mscale_all_dim",), "--mscale-all-dim", s.mscale_all_dim, yarn.get("mscale_all_dim"), True)
        elif s.rope_scaling_factor and ("rope_scaling" in cfg or "rope_parameters" in cfg):
            out.append(Mismatch("YaRN factor", "rope_scaling", None, "--rotary-scaling-factor", s.rope_scaling_factor))
    else:
        cmp("KV groups", ("num_key_value_heads", "multi_query_group_num"), "--num-query-groups", s.kv_groups)
        if cfg.get("head_dim") is not None:
            cmp("head dim", ("head_dim",), "--kv-channels", s.kv_channels)
        elif model_type in ("llama", "qwen2", "mistral") and "hidden_size" in cfg and "num_attention_heads" in cfg:
            # these families default the head size to hidden / heads
            cmp("head dim", ("head_dim",), "--kv-channels", s.kv_channels,
                int(cfg["hidden_size"]) // int(cfg["num_attention_heads"]), True)
    if "use_qk_norm" in cfg:
        cmp("q/k norm", ("use_qk_norm",), "--qk-layernorm", s.qk_layernorm)
    if model_type.startswith("qwen3"):
        fact("q/k norm", f"model_type {model_type}", True, "--qk-layernorm", s.qk_layernorm)
    if model_type.startswith("qwen3_5") or model_type.startswith("qwen3_next"):
        fact("(1+w) RMSNorm", f"model_type {model_type}", True, "--apply-layernorm-1p", s.norm_1p)
    if "attn_output_gate" in cfg:
        cmp("attention output gate", ("attn_output_gate",), "--attention-output-gate", s.attention_output_gate)
    if model_type == "glm4":
        fact("sandwich norms", "model_type glm4", True, "--post-self-attn-layernorm --post-mlp-layernorm", s.post_norms)
    # MoE
    _, n_exp = _first(cfg, "n_routed_experts", "num_experts", "num_local_experts")
    if n_exp or s.is_moe:
        cmp("routed experts", ("n_routed_experts", "num_experts", "num_local_experts"), "--num-experts", s.experts)
        if s.is_moe:
            cmp("router top-k", ("num_experts_per_tok",), "--moe-router-topk", s.topk)
            cmp("expert FFN", ("moe_intermediate_size",), "--moe-ffn-hidden-size", s.moe_ffn)
            key, shared = _first(cfg, "shared_expert_intermediate_size")
            if shared is None and cfg.get("n_shared_experts") is not None and cfg.get("moe_intermediate_size") is not None:
                key, shared = "n_shared_experts × moe_intermediate_size", int(cfg["n_shared_experts"]) * int(cfg["moe_intermediate_size"])
            cmp("shared-expert FFN", (key,), "--moe-shared-expert-intermediate-size", s.shared_ffn, shared, True)
            pat = config_moe_pattern(cfg, s.layers)
            if pat is not None and pat != s.moe_layer_pattern:
                out.append(Mismatch("dense/MoE layer pattern",
                                    "first_k_dense_replace" if "mlp_layer_types" not in cfg else "mlp_layer_types",
                                    cfg.get("first_k_dense_replace", _pattern_text(pat)), "--moe-layer-freq",
                                    _pattern_text(s.moe_layer_pattern)))
            cmp("router scaling", ("routed_scaling_factor",), "--moe-router-topk-scaling-factor", s.topk_scaling)
            cmp("router groups", ("n_group",), "--moe-router-num-groups", s.router_groups or 1)
            cmp("router group top-k", ("topk_group",), "--moe-router-group-topk", s.router_group_topk or 1)
            if (cfg.get("n_group") or 1) > 1 and s.router_group_topk:
                # DeepSeek-style checkpoints score a group by its 2 best experts; megatron-core by its
                # top-k / group-top-k best: the spec must make those equal.
                per_group = s.topk // s.router_group_topk
                if per_group != 2:
                    out.append(Mismatch("experts scoring a group", "n_group (groups scored by their 2 best experts)",
                                        2, "--moe-router-topk / --moe-router-group-topk", per_group))
            cmp("router score function", ("scoring_func",), "--moe-router-score-function", s.score_function)
            if cfg.get("topk_method") is not None:
                cmp("router expert bias", ("topk_method",), "--moe-router-enable-expert-bias", s.expert_bias,
                    cfg["topk_method"] == "noaux_tc", True)
            elif model_type in ("glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "deepseek_v3"):
                fact("router expert bias", f"model_type {model_type} (e_score_correction_bias)", True,
                     "--moe-router-enable-expert-bias", s.expert_bias)
            if s.score_function == "sigmoid" and cfg.get("norm_topk_prob") is False:
                out.append(Mismatch("top-k normalisation", "norm_topk_prob", False,
                                    "--moe-router-score-function sigmoid (normalises the top-k)", True))
    # multi-token prediction
    key, mtp = _first(cfg, "num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers")
    cmp("MTP layers", (key,), "--mtp-num-layers", s.mtp_layers, mtp, True)
    # DSA indexer
    if s.dsa or cfg.get("index_topk") is not None or model_type == "glm_moe_dsa":
        fact("DSA indexer", f"model_type {model_type}", model_type == "glm_moe_dsa" or cfg.get("index_topk") is not None,
             "--enable-dsa-indexer", s.dsa)
        if s.dsa:
            cmp("indexer heads", ("index_n_heads",), "--index-n-heads", s.index_n_heads)
            cmp("indexer head dim", ("index_head_dim",), "--index-head-dim", s.index_head_dim)
            cmp("indexer top-k", ("index_topk",), "--index-topk", s.index_topk)
            pat = config_indexer_pattern(cfg, s.layers)
            ours = tuple(int(s.dsa_computes_index(i)) for i in range(s.layers))
            if pat is not None and pat != ours:
                out.append(Mismatch("index sharing pattern (1 = computes its own top-k)", "indexer_types",
                                    _pattern_text(pat), "--index-topk-freq/--index-skip-topk-offset", _pattern_text(ours)))
    # linear attention
    lin = config_linear_pattern(cfg, s.layers)
    hybrid_type = model_type.startswith(("qwen3_5", "qwen3_next"))
    if lin is not None or (s.hybrid and model_type and not hybrid_type):
        fact("hybrid linear attention", "layer_types", lin is not None, "--hybrid-linear-attention", s.hybrid)
        if lin is not None and s.linear_layer_pattern and lin != s.linear_layer_pattern:
            out.append(Mismatch("linear/full attention pattern (1 = linear)", "layer_types", _pattern_text(lin),
                                "--linear-attention-freq", _pattern_text(s.linear_layer_pattern)))
        if lin is not None and not s.linear_layer_pattern:
            out.append(Mismatch("linear/full attention pattern (1 = linear)", "layer_types", _pattern_text(lin),
                                "--linear-attention-freq", None))
        for key in ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
                    "linear_num_key_heads", "linear_num_value_heads"):
            if cfg.get(key) is not None:
                cmp(key.replace("_", " "), (key,), _flag(key), getattr(s, key) or None)
    return out


_FROM_CONFIG = {"num_layers": "num_hidden_layers", "hidden_size": "hidden_size",
                "num_attention_heads": "num_attention_heads", "vocab_size": "vocab_size"}


def flag_mismatches(flags: Mapping[str, Any], config_json: Mapping[str, Any]) -> list[Mismatch]:
    """Like :func:`compare_with_config` for a command line that may carry only some model flags
    (``train.py --hidden-size 128 ...``): with a whole spec every field is compared, otherwise only
    the fields whose flags were given."""
    cfg = flatten_config(config_json)
    full = all(k in flags for k in _FROM_CONFIG)
    if not full and not any(k.replace("_", "-") in _KNOWN_MODEL_FLAGS for k in flags):
        return []
    filled = {k: cfg[v] for k, v in _FROM_CONFIG.items() if k not in flags and cfg.get(v) is not None}
    try:
        found = compare_with_config(spec_from_flags({**filled, **flags}), config_json)
    except ModelSpecError:
        return []  # too little to build a spec from; nothing to compare
    given = {_flag(k) for k in flags}
    return [m for m in found if full or any(f in given for f in re.findall(r"--[a-z0-9-]+", m.flag))]


_KNOWN_MODEL_FLAGS = {"num-layers", "hidden-size", "ffn-hidden-size", "num-attention-heads", "num-query-groups",
                      "kv-channels", "vocab-size", "norm-epsilon", "rotary-base", "rotary-percent",
                      "untie-embeddings-and-output-weights", "add-qkv-bias", "qk-layernorm", "num-experts",
                      "multi-latent-attention"}


def compare_lines(spec: Any, config_json: Mapping[str, Any]) -> list[str]:
    return [str(m) for m in compare_with_config(spec, config_json)]


class ConfigMismatchError(ModelSpecError):
    """The checkpoint's config.json disagrees with the model spec (message names every field)."""

    def __init__(self, message: str, mismatches: Sequence[Mismatch] = ()):
        super().__init__(message)
        self.mismatches = list(mismatches)


def check_config_file(spec: Any, hf_dir: str | Path) -> dict[str, Any]:
    """Read ``hf_dir/config.json`` (or a config.json path) and raise :class:`ConfigMismatchError`
    naming every disagreeing field. Called before any weight is read or moved."""
    path = Path(hf_dir)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise ConfigMismatchError(_R("config_missing", path=str(path)))
    cfg = json.loads(path.read_text(encoding="utf-8"))
    bad = compare_with_config(spec, cfg)
    if bad:
        raise ConfigMismatchError(
            _R("config_differs", path=str(path.parent), count=len(bad), fields="\n  - ".join(map(str, bad))), bad)
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m slime.model_spec SPEC CONFIG``: print each difference; exit 0 same, 1 different,
    3 could not compare."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 2:
        print("usage: python -m slime.model_spec SPEC.sh CONFIG.json", file=sys.stderr)
        return 3
    try:
        spec = load_model_spec(argv[0])
        cfg = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
        diffs = compare_with_config(spec, cfg)
    except Exception as exc:  # say why, the caller decides
        print(_R("could_not_compare", error=message_of(exc)))
        return 3
    for d in diffs:
        print(d)
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
