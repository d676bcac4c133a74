# shellcheck shell=bash
# shellcheck disable=SC2034  # MODEL_ARGS is read by the script that sources this file.
# A benchmark shape, not a recipe: llama3.2-3b's transformer body (28 layers, hidden 3072, FFN 8192,
# 24 heads / 8 KV groups, head dim 128; bench/bench_megatron.py's "llama3.2-3b") on the tiny
# character vocabulary (14 tokens), so tools/tiny/prepare.py can build it locally and the tiny task
# runs through the GPU loop (tools/run_gpu_mfu_loop.sh). 3.2 B parameters.
MODEL_ARGS=(
   --num-layers 28
   --hidden-size 3072
   --ffn-hidden-size 8192
   --num-attention-heads 24
   --group-query-attention
   --num-query-groups 8
   --kv-channels 128
   --swiglu
   --disable-bias-linear
   --add-qkv-bias
   --normalization RMSNorm
   --norm-epsilon 1e-6
   --position-embedding-type rope
   --rotary-base 10000
   --untie-embeddings-and-output-weights
   --vocab-size 14
)
