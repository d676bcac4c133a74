# shellcheck shell=bash
# shellcheck disable=SC2034  # MODEL_ARGS is read by the script that sources this file.
# Tiny CPU model (this project's own): a Qwen2-shaped causal LM that `experiment.sh prepare` builds
# locally with random weights (tools/tiny/prepare.py), for a correctness run on a laptop CPU.
# Dimensions match the Qwen2Config that tools/tiny/prepare.py builds (hidden 64, FFN 128, 2 layers,
# 4 heads / 2 KV groups, untied, rope base 1e4, RMSNorm eps 1e-6). The vocabulary is the tiny
# character tokenizer's: 4 specials + 10 digits = 14 tokens; prepare's tokenizer MUST have exactly
# --vocab-size tokens, and `check` compares this file with the generated config.json.
MODEL_ARGS=(
   --num-layers 2
   --hidden-size 64
   --ffn-hidden-size 128
   --num-attention-heads 4
   --group-query-attention
   --num-query-groups 2
   --kv-channels 16
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
