# shellcheck shell=bash
# shellcheck disable=SC2034  # MODEL_ARGS is read by the script that sources this file.
# Qwen3.5-27B architecture (qwen3_5), reused for Qwen3.8-27B: hybrid dense model, Gated DeltaNet
# linear-attention layers interleaved with gated full-attention layers (attention output gate).
# The per-layer pattern (layer_types / full_attention_interval) and the GDN dimensions
# (linear_num_key_heads, linear_num_value_heads, linear_key_head_dim, linear_value_head_dim,
# linear_conv_kernel_dim) are NOT repeated here: the model bridge reads them from the checkpoint's
# config.json, so one source describes them. Needs flash-linear-attention (FLA) kernels.
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
   --mtp-num-layers 1
)
