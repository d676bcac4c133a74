"""Build the tiny CPU recipe locally (no hub): a character tokenizer with a chat template, a
randomly initialised Qwen2-shaped causal LM, and a verifiable toy task with a held-out split.

Task: "answer the last digit of a 3-digit number" (environment.md: a 2-layer, hidden-64 model
learns it by GRPO on 2 cores). Prompts are the 1,000 numbers 000..999; a seeded 80/20 split
gives train.jsonl / eval.jsonl, so evaluation uses numbers the policy never trained on.

Reward: --rm-type math. The tiny model cannot be expected to emit a `</think>` before its answer,
and deepscaler scores every response without one 0 (all advantages 0, nothing learned). The
chat template's generation prompt ends with the assistant tag, the model answers one digit and
the end-of-turn token, and math grades the last number of the response against the label.

    python tools/tiny/prepare.py --model-dir /tmp/tiny/model --data-dir /tmp/tiny/data
    python tools/tiny/prepare.py --model-spec scripts/models/tiny-cpu.sh --model-dir ... --data-dir ...

With --model-spec the model's shape comes from that spec's MODEL_ARGS (read by the runtime's
torch-free reader), so the spec, the generated config.json and `check` agree by construction.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SPECIALS = ["<|pad|>", "<|end|>", "<|user|>", "<|assistant|>"]
CHARS = list("0123456789")
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}<|user|>{{ m['content'] }}"
    "{% else %}<|assistant|>{{ m['content'] }}<|end|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer(out: Path):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|pad|>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one char, one token
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|end|>",
                                   additional_special_tokens=["<|user|>", "<|assistant|>"])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


DEFAULT_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2)


def shape_from_spec(spec: str, vocab_size: int) -> dict:
    """Qwen2Config fields from a scripts/models/*.sh spec (the same flags the trainer builds from)."""
    from slime.backends.megatron.model_args import load_flags

    f = load_flags(spec)
    if int(f.get("vocab_size", vocab_size)) != vocab_size:
        raise SystemExit(f"{spec}: --vocab-size {f['vocab_size']} but the tiny tokenizer has {vocab_size} tokens")
    heads = int(f["num_attention_heads"])
    shape = dict(hidden_size=int(f["hidden_size"]), intermediate_size=int(f["ffn_hidden_size"]),
                 num_hidden_layers=int(f["num_layers"]), num_attention_heads=heads,
                 num_key_value_heads=int(f.get("num_query_groups", heads)),
                 rope_theta=float(f.get("rotary_base", 10000)), rms_norm_eps=float(f.get("norm_epsilon", 1e-6)))
    if "kv_channels" in f:
        shape["head_dim"] = int(f["kv_channels"])
    return shape


def build_model(out: Path, vocab_size: int, eos_id: int, pad_id: int, seed: int, shape: dict | None = None,
                max_positions: int = 64, device: str = "cpu", dtype: str = "float32") -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab_size, **(shape or DEFAULT_SHAPE),
                         max_position_embeddings=max_positions, tie_word_embeddings=False,
                         eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None)
    # A benchmark-sized model (billions of parameters) is initialised on the GPU in bf16: on the
    # CPU in fp32 that takes minutes. The tiny recipe keeps the CPU fp32 default (its seeded curve).
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(out)
    GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id).save_pretrained(out)


def build_data(out: Path, seed: int, eval_fraction: float = 0.2, digits: int = 3) -> tuple[int, int]:
    """1,000 prompts of `digits` digits; the label is the last digit. The default (3) is every number
    000..999; longer prompts (a throughput benchmark's long sequences) are seeded random strings."""
    if digits == 3:
        numbers = [f"{i:03d}" for i in range(1000)]
    else:
        rng = random.Random(seed + 1)
        numbers = ["".join(rng.choice(CHARS) for _ in range(digits)) for _ in range(1000)]
    random.Random(seed).shuffle(numbers)
    n_eval = int(len(numbers) * eval_fraction)
    splits = {"eval.jsonl": numbers[:n_eval], "train.jsonl": numbers[n_eval:]}
    out.mkdir(parents=True, exist_ok=True)
    for name, items in splits.items():
        with (out / name).open("w") as f:
            for x in items:
                f.write(json.dumps({"prompt": x, "label": x[-1]}) + "\n")
    return len(splits["train.jsonl"]), n_eval


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model-spec", help="a scripts/models/*.sh whose MODEL_ARGS give the model's shape "
                                         "(default: the tiny CPU shape)")
    ap.add_argument("--prompt-digits", type=int, default=3,
                    help="digits per prompt (default 3: the tiny task; longer for throughput benchmarks)")
    ap.add_argument("--device", default="cpu", help="where the random weights are initialised (cpu, cuda)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="saved weights' dtype")
    a = ap.parse_args(argv)
    model_dir = Path(a.model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(model_dir)
    shape = shape_from_spec(a.model_spec, len(tok)) if a.model_spec else None
    # room for the chat template's tags, the prompt and a short answer
    positions = 64 if a.prompt_digits <= 3 else 2 ** (a.prompt_digits + 64).bit_length()
    build_model(model_dir, len(tok), tok.eos_token_id, tok.pad_token_id, a.seed, shape, positions, a.device, a.dtype)
    n_train, n_eval = build_data(Path(a.data_dir), a.seed, digits=a.prompt_digits)
    print(f"model: {model_dir} (vocab {len(tok)}); data: {a.data_dir} ({n_train} train, {n_eval} eval)")


if __name__ == "__main__":
    main()
