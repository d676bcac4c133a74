# shellcheck shell=bash
# shellcheck disable=SC2034  # MODEL_ARGS is read by the script that sources this file.
# GLM-4.7-Flash (zai-org/GLM-4.7-Flash): 30B-A3B MoE with MLA; 47 layers = 1 dense + 46 MoE.
# The checkpoint carries one MTP layer (usable as the EAGLE draft). Its attention has no QKV bias
# (config.json: attention_bias false); --qk-layernorm is MLA's latent q/kv norms.
MODEL_ARGS=(
   --num-layers 47
   --hidden-size 2048
   --ffn-hidden-size 10240
   --num-attention-heads 20
   --swiglu
   --disable-bias-linear
   --qk-layernorm
   --normalization RMSNorm
   --norm-epsilon 1e-5
   --position-embedding-type rope
   --rotary-base 1000000
   --untie-embeddings-and-output-weights
   --vocab-size 154880

   # MLA
   --multi-latent-attention
   --q-lora-rank 768
   --kv-lora-rank 512
   --qk-head-dim 192
   --qk-pos-emb-head-dim 64
   --v-head-dim 256

   # MoE: first layer dense, the other 46 MoE
   --num-experts 64
   --moe-router-topk 4
   --moe-ffn-hidden-size 1536
   --moe-shared-expert-intermediate-size 1536
   --moe-layer-freq "[0]*1+[1]*46"
   --moe-router-score-function sigmoid
   --moe-router-enable-expert-bias
   --moe-router-topk-scaling-factor 1.8
   --moe-grouped-gemm
   --moe-token-dispatcher-type alltoall
   --mtp-num-layers 1
)
