# shellcheck shell=bash
# shellcheck disable=SC2034  # MODEL_ARGS is read by the script that sources this file.
# DeepSeek-V3 architecture, used for DeepSeek-R1 (deepseek-ai/DeepSeek-R1): 671B-A37B MoE with MLA;
# 61 layers = 3 dense + 58 MoE; group-limited routing (8 groups, top-4 groups); YaRN rope.
# Weights are published in FP8; `experiment.sh prepare` converts them to BF16 first.
# The checkpoint carries one MTP layer (usable as the EAGLE draft).
MODEL_ARGS=(
   --num-layers 61
   --hidden-size 7168
   --ffn-hidden-size 18432
   --num-attention-heads 128
   --swiglu
   --disable-bias-linear
   --qk-layernorm
   --normalization RMSNorm
   --norm-epsilon 1e-6
   --position-embedding-type rope
   --rotary-base 10000
   --rotary-scaling-factor 40
   --mscale 1.0
   --mscale-all-dim 1.0
   --untie-embeddings-and-output-weights
   --vocab-size 129280

   # MLA
   --multi-latent-attention
   --q-lora-rank 1536
   --kv-lora-rank 512
   --qk-head-dim 128
   --qk-pos-emb-head-dim 64
   --v-head-dim 128

   # MoE: first 3 layers dense, the other 58 MoE
   --num-experts 256
   --moe-router-topk 8
   --moe-ffn-hidden-size 2048
   --moe-shared-expert-intermediate-size 2048
   --moe-layer-freq "[0]*3+[1]*58"
   --moe-router-score-function sigmoid
   --moe-router-enable-expert-bias
   --moe-router-topk-scaling-factor 2.5
   --moe-router-num-groups 8
   --moe-router-group-topk 4
   --moe-grouped-gemm
   --moe-token-dispatcher-type alltoall
   --mtp-num-layers 1
)
