"""What one GPU holds at its peak, in bytes, from a model spec and a layout: the arithmetic behind
the lab's memory estimate (lab/rules/memory.py) and bench/compare_memory.py.

Torch-free. Dimensions come from slime.model_spec.ModelSpec only (never a second copy of a model
fact). The figures model what `torch.cuda.max_memory_allocated` sees; the CUDA context and the
allocator's cached-but-free blocks are outside it (lab/rules/memory.py lists them as exclusions).

Megatron training peak (bf16 params, local layer spec, flash/SDPA attention, no dropout: how
slime.backends.megatron builds a model):
- weights bf16, 2 B/param; main gradients fp32, 4 B/param (the trainer sets
  `grad_reduce_in_fp32`); Adam 12 B/param (fp32 master copy + two moments), divided by the
  data-parallel size under the distributed optimizer, in host memory with CPU Adam;
- activations: the tensors autograd keeps per token and layer (`layer_activation_bytes`). Under
  full recomputation only each layer's input is kept, plus one layer rebuilt during backward.
  Selective recomputation only drops the attention score matrix, which flash attention never
  materialises, so it saves nothing here. The 1F1B schedule keeps PP micro-batches in flight on
  the first stage;
- logits: the output layer's bf16 logits over every token, then for the rows the loss reads
  (response tokens) a bf16 copy and `LOGIT_FP32_COPIES` fp32 tensors of vocabulary width at
  once (slime.training.loss.gather_log_probs: the scaled logits logsumexp keeps for backward, and
  in backward `scaled - lse` and its exp before the first is freed);
- `CUBLAS_WORKSPACE_BYTES`: the cuBLAS workspace torch takes from its caching allocator.

Embedded engine (slime.inference, the engine of the tiny recipes): bf16 weights, the
static KV slots its batcher allocates (a power of two of rows in flight × the context rounded up
to 256 positions × layers × KV heads × head dim × K and V × 2 B), one prefill chunk's widest
transient, the sampled rows' fp32 logits, and two cuBLAS workspaces (`ENGINE_CUBLAS_STREAMS`: torch
keeps one per stream, and the engine runs on the default stream and captures its CUDA graphs on one
side stream; before it reused that stream, every capture added one, which is most of what the
tiny-gpu estimate of 0.059 GiB missed against 0.114 measured). SGLang instead reserves
`mem_fraction_static` of the GPU up front; lab/rules/memory.py keeps that model for SGLang engines.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from slime.model_spec import ModelSpec

GIB = 1024**3
BF16, FP32 = 2, 4
ADAM_BYTES = 12  # fp32 master weight + exp_avg + exp_avg_sq
LOGIT_FP32_COPIES = 3  # vocabulary-wide fp32 tensors alive at once in the log-prob backward
# torch's cuBLAS workspace on Hopper-class GPUs (CUBLAS_WORKSPACE_CONFIG :4096:8 = 32 MiB), taken from
# the caching allocator, so max_memory_allocated counts it.
CUBLAS_WORKSPACE_BYTES = 32 * 1024**2
ENGINE_CUBLAS_STREAMS = 2  # the default stream + the CUDA-graph side stream (slime/inference/decoder.py)
KV_POSITION_ROUND = 256  # the embedded decoder grows its KV slots in steps of 256 positions on CUDA
PREFILL_CHUNK_TOKENS = 16384  # the embedded batcher's prefill budget per forward (batcher.prefill_tokens)


@dataclass(frozen=True)
class TrainLayout:
    """One training GPU's share: parallel sizes, tokens per micro-batch, recomputation, optimizer."""

    tokens: int  # tokens of one micro-batch on this GPU (--max-tokens-per-gpu)
    logit_rows: int | None = None  # tokens whose log-probs the loss reads; None = every token
    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1  # data-parallel size (dense parameters' optimizer shards)
    edp: int = 1  # expert data-parallel size (expert parameters' optimizer shards)
    recompute: Literal["none", "selective", "full"] = "none"
    cpu_adam: bool = False
    distributed_optimizer: bool = True


def _attention_bytes(s: ModelSpec) -> int:
    """Per token, one attention sub-layer: norm input and output, QKV output, the rotary q/k copies
    the attention kernel keeps, and the attention output (bf16)."""
    h = s.hidden
    if s.mla:
        qk = s.heads * (s.qk_head_dim + s.qk_pos_emb_head_dim)
        v = s.heads * s.v_head_dim
        down = (2 * s.q_lora_rank if s.q_lora_rank else 0) + 2 * (s.kv_lora_rank + s.qk_pos_emb_head_dim)
        return BF16 * (2 * h + down + (qk + qk + v) + 2 * qk + v)
    q, kv = s.heads * s.kv_channels, s.kv_groups * s.kv_channels
    qk_norm = 2 * (q + kv) if s.qk_layernorm else 0
    return BF16 * (2 * h + (q + 2 * kv) + (q + kv) + q + qk_norm)


def _mlp_bytes(s: ModelSpec, moe: bool) -> int:
    """Per token, one MLP sub-layer: norm input and output, then per FFN of width f: fc1 output
    (2f with SwiGLU), the gate's activation (f) and the product fc2 reads (f); MoE layers do that for
    each of the top-k routed copies of a token (plus its permuted input) and for the shared expert."""
    h = s.hidden
    swiglu = bool(s.args.get("swiglu"))

    def ffn(f: int) -> int:
        return BF16 * ((2 * f + f + f) if swiglu else (f + f))

    if not moe:
        return BF16 * 2 * h + ffn(s.ffn)
    routed = s.topk * (BF16 * h + ffn(s.moe_ffn))
    shared = ffn(s.shared_ffn) if s.shared_ffn else 0
    router = 2 * FP32 * s.experts  # router logits and their softmax/sigmoid, fp32
    return BF16 * 2 * h + routed + shared + router


def layer_activation_bytes(s: ModelSpec, moe: bool = False) -> int:
    """Bytes autograd keeps per token for one layer (no recomputation, TP 1)."""
    return _attention_bytes(s) + _mlp_bytes(s, moe)


def _layer_kinds(s: ModelSpec) -> list[bool]:
    """MoE flag of each layer (the spec's layer pattern; all dense for dense models)."""
    if s.moe_layer_pattern:
        return [bool(x) for x in s.moe_layer_pattern]
    return [False] * s.layers


def training_parts(s: ModelSpec, lay: TrainLayout) -> dict[str, float]:
    """Bytes per GPU of the worst pipeline stage, by part: weights, gradients, adam, activations,
    logits, workspace. With PP > 1 the first stage's activations and the last stage's logits are
    summed (an upper bound: no stage holds both)."""
    expert_total = s.moe_layers * s.experts * s.expert_params
    dense_total = s.total_params - expert_total
    dense_shard = dense_total / (lay.tp * lay.pp)
    expert_shard = expert_total / (lay.ep * lay.pp)  # expert TP is 1
    params = dense_shard + expert_shard
    if lay.distributed_optimizer:
        adam = ADAM_BYTES * (dense_shard / max(lay.dp, 1) + expert_shard / max(lay.edp, 1))
    else:
        adam = ADAM_BYTES * params

    kinds = _layer_kinds(s)
    stage = -(-len(kinds) // lay.pp)
    first = kinds[:stage]
    full = [layer_activation_bytes(s, m) / lay.tp for m in first]  # sequence parallel shards all of it
    in_flight = lay.pp  # 1F1B: the first stage holds PP micro-batches before its first backward
    if lay.recompute == "full":
        per_token = len(first) * BF16 * s.hidden / lay.tp * in_flight + max(full)
    else:
        per_token = sum(full) * in_flight
    acts = per_token * lay.tokens

    rows = lay.tokens if lay.logit_rows is None else lay.logit_rows
    vocab = s.vocab / lay.tp
    logits = lay.tokens * vocab * BF16 + rows * vocab * (BF16 + LOGIT_FP32_COPIES * FP32)
    return {
        "weights": BF16 * params,
        "gradients": FP32 * params,
        "adam": 0.0 if lay.cpu_adam else adam,
        "activations": acts,
        "logits": logits,
        "workspace": float(CUBLAS_WORKSPACE_BYTES),
    }


def optimizer_bytes(s: ModelSpec, lay: TrainLayout) -> float:
    """Adam state per training GPU wherever it lives (host memory with CPU Adam)."""
    return training_parts(s, TrainLayout(**{**lay.__dict__, "cpu_adam": False}))["adam"]


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def embedded_engine_parts(s: ModelSpec, rows: int, context: int) -> dict[str, float]:
    """Bytes on the GPU of one embedded engine serving `rows` requests at once of up to `context`
    tokens (prompt + response): weights, kv_cache, prefill, logits, workspace."""
    slots = _pow2(max(rows, 1))
    positions = -(-max(context, 1) // KV_POSITION_ROUND) * KV_POSITION_ROUND
    kv = slots * positions * s.layers * s.kv_groups * s.kv_channels * 2 * BF16
    chunk = min(PREFILL_CHUNK_TOKENS, slots * positions)
    widest = max(s.ffn, s.moe_ffn * max(s.topk, 1), s.hidden)
    prefill = chunk * BF16 * (2 * widest + 2 * s.hidden)  # fc1 output and the residual stream
    logits = slots * s.vocab * 2 * FP32  # the sampled rows' fp32 logits and probabilities
    return {
        "weights": BF16 * s.total_params,
        "kv_cache": float(kv),
        "prefill": float(prefill),
        "logits": float(logits),
        "workspace": float(ENGINE_CUBLAS_STREAMS * CUBLAS_WORKSPACE_BYTES),
    }
