# shellcheck shell=bash
# shellcheck disable=SC2034  # MODEL_ARGS is read by the script that sources this file.
# GLM-4-9B (zai-org/GLM-4-9B-0414): dense, GQA 32/2, rotary on half the head dim (interleaved).
# Numbers: docs reference models.md; `slime-lab check` compares them with the checkpoint's config.json.
MODEL_ARGS=(
   --num-layers 40
   --hidden-size 4096
   --ffn-hidden-size 13696
   --num-attention-heads 32
   --group-query-attention
   --num-query-groups 2
   --kv-channels 128
   --swiglu
   --disable-bias-linear
   --add-qkv-bias
   --normalization RMSNorm
   --norm-epsilon 1e-5
   --post-self-attn-layernorm
   --post-mlp-layernorm
   --use-rotary-position-embeddings
   --rotary-base 10000
   --rotary-percent 0.5
   --rotary-interleaved
   --untie-embeddings-and-output-weights
   --vocab-size 151552
)
