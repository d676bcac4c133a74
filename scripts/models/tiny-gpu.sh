# shellcheck shell=bash
# shellcheck disable=SC2034  # MODEL_ARGS is read by the script that sources this file.
# Tiny GPU model (this project's own): a Qwen2-shaped causal LM that `experiment.sh prepare` builds
# locally with random weights (tools/tiny/prepare.py --model-spec reads THIS file, so the spec and
# config.json agree by construction), for the Megatron-on-Ray loop on one GPU. Same character
# tokenizer and toy task as tiny-cpu (4 specials + 10 digits = 14 tokens); wider and deeper.
MODEL_ARGS=(
   --num-layers 4
   --hidden-size 256
   --ffn-hidden-size 1024
   --num-attention-heads 4
   --group-query-attention
   --num-query-groups 2
   --kv-channels 64
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
