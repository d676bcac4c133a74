# shellcheck shell=bash
# shellcheck disable=SC2034  # MODEL_ARGS is read by the script that sources this file.
# GLM-5.2 744B-A40B architecture, reused for GLM-5.3 (zai-org/GLM-5.3): 78 layers = 3 dense + 75 MoE,
# MLA with DeepSeek-style sparse attention (DSA).
# DSA cross-layer index sharing: layer i (0-based) computes the index top-k when
#   i < offset - 1  or  (i - offset + 1) % freq == 0      (freq 4, offset 3: layers 0, 1, 2, 6, 10, ...)
# and every other layer reuses the last computed index. A pipeline stage must start on a computing
# layer (the lab checks this; the recipe's 14/16 first/last split over 8 stages does).
# DSA with context parallelism uses the all-gather CP layout, hence --allgather-cp.
# Weights are published in FP8; `experiment.sh prepare` converts them to BF16 first.
MODEL_ARGS=(
   --num-layers 78
   --hidden-size 6144
   --ffn-hidden-size 12288
   --num-attention-heads 64
   --swiglu
   --disable-bias-linear
   --qk-layernorm
   --normalization RMSNorm
   --norm-epsilon 1e-5
   --position-embedding-type rope
   --rotary-base 8000000
   --untie-embeddings-and-output-weights
   --vocab-size 154880

   # MLA
   --multi-latent-attention
   --q-lora-rank 2048
   --kv-lora-rank 512
   --qk-head-dim 192
   --qk-pos-emb-head-dim 64
   --v-head-dim 256

   # DSA (sparse attention indexer) with cross-layer index sharing
   --enable-dsa-indexer
   --index-n-heads 32
   --index-head-dim 128
   --index-topk 2048
   --index-topk-freq 4
   --index-skip-topk-offset 3
   --allgather-cp

   # MoE: first 3 layers dense, the other 75 MoE
   --num-experts 256
   --moe-router-topk 8
   --moe-ffn-hidden-size 2048
   --moe-shared-expert-intermediate-size 2048
   --moe-layer-freq "[0]*3+[1]*75"
   --moe-router-score-function sigmoid
   --moe-router-enable-expert-bias
   --moe-router-topk-scaling-factor 2.5
   --moe-grouped-gemm
   --moe-token-dispatcher-type alltoall
   --mtp-num-layers 1
)
