# shellcheck shell=bash
# shellcheck disable=SC2034  # MODEL_ARGS is read by the script that sources this file.
# GLM-4.5 355B-A32B architecture, reused for GLM-4.7 (zai-org/GLM-4.7): 92 layers = 3 dense + 89 MoE.
# The checkpoint carries one MTP layer (usable as the EAGLE draft).
MODEL_ARGS=(
   --num-layers 92
   --hidden-size 5120
   --ffn-hidden-size 12288
   --num-attention-heads 96
   --group-query-attention
   --num-query-groups 8
   --kv-channels 128
   --swiglu
   --disable-bias-linear
   --add-qkv-bias
   --qk-layernorm
   --normalization RMSNorm
   --norm-epsilon 1e-5
   --use-rotary-position-embeddings
   --rotary-base 1000000
   --rotary-percent 0.5
   --untie-embeddings-and-output-weights
   --vocab-size 151552

   # MoE: first 3 layers dense, the other 89 MoE
   --num-experts 160
   --moe-router-topk 8
   --moe-ffn-hidden-size 1536
   --moe-shared-expert-intermediate-size 1536
   --moe-layer-freq "[0]*3+[1]*89"
   --moe-router-score-function sigmoid
   --moe-router-enable-expert-bias
   --moe-router-topk-scaling-factor 2.5
   --moe-grouped-gemm
   --moe-token-dispatcher-type alltoall
   --mtp-num-layers 1
)
