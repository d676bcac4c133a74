# shellcheck shell=bash
# shellcheck disable=SC2034  # MODEL_ARGS is read by the script that sources this file.
# Qwen3.5-27B architecture (qwen3_5), reused for Qwen3.8-27B: hybrid dense model, Gated DeltaNet
# linear-attention layers interleaved with gated full-attention layers (attention output gate).
# Every 4th layer (1-based) is full attention, the other three Gated DeltaNet (config.json:
# full_attention_interval 4); GDN: 16 key heads, 48 value heads, head dims 128, conv kernel 4.
# `check` and the converters compare these with the checkpoint's config.json field by field.
# Needs flash-linear-attention (FLA) kernels.
# The checkpoint carries one MTP layer (usable as the EAGLE draft).
MODEL_ARGS=(
   --num-layers 64
   --hidden-size 5120
   --ffn-hidden-size 17408
   --num-attention-heads 24
   --group-query-attention
   --num-query-groups 4
   --kv-channels 256
   --swiglu
   --disable-bias-linear
   --qk-layernorm
   --attention-output-gate
   --normalization RMSNorm
   --apply-layernorm-1p
   --norm-epsilon 1e-6
   --position-embedding-type rope
   --rotary-base 10000000
   --rotary-percent 0.25
   --untie-embeddings-and-output-weights
   --vocab-size 248320
   --hybrid-linear-attention gated_delta_net
   --linear-attention-freq 4
   --linear-conv-kernel-dim 4
   --linear-key-head-dim 128
   --linear-value-head-dim 128
   --linear-num-key-heads 16
   --linear-num-value-heads 48
   --mtp-num-layers 1
)
