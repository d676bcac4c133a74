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

    python tools/tiny/prepare.py --family glm4_moe --model-dir ... --data-dir ...

With --family the model is a tiny twin of a seeded architecture family (glm4, glm4_moe,
glm4_moe_lite, deepseek_v3, glm_moe_dsa, qwen3_5; the recipes' names glm4_moe_mla and glm5_dsa
are accepted too): tools/reference_models.py's configuration of that family (transformers' own
class, every structural feature at toy size) with the tiny tokenizer's vocabulary and no MTP
layer, on the same toy task. Its spec is scripts/models/tiny-<family>.sh (twin_spec_text writes
it; a test keeps the two equal) and `check` compares it with the generated config.json.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))  # reference_models (the families' configurations)

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


# The recipes' family names (recipes/*.yaml `family`) -> tools/reference_models.py's.
FAMILY_ALIASES = {"glm4_moe_mla": "glm4_moe_lite", "glm5_dsa": "glm_moe_dsa"}


def twin_family(name: str) -> str:
    import reference_models as rm

    fam = FAMILY_ALIASES.get(name, name)
    if fam not in rm.FAMILIES:
        raise SystemExit(f"--family {name}: not a seeded family; choose from {', '.join(sorted(rm.FAMILIES))}")
    return fam


def twin_spec_text(family: str, vocab_size: int) -> str:
    """scripts/models/tiny-<family>.sh: the family's reference spec with the tiny vocabulary and
    without the MTP layer (the embedded engine serves no speculative decoding)."""
    import reference_models as rm

    body = rm.spec_text(family, overrides={"--vocab-size": str(vocab_size)}, drop=("--mtp-num-layers",))
    head = (f"# shellcheck shell=bash\n# shellcheck disable=SC2034  # MODEL_ARGS is read by the script that sources "
            f"this file.\n# Tiny twin of the {family} family for the tiny-gpu-{family.replace('_', '-')} recipe: "
            f"tools/tiny/prepare.py --family {family}\n# builds it locally (tools/reference_models.py's "
            f"configuration, the tiny tokenizer's {vocab_size} tokens, no MTP layer).\n# Generated by "
            f"tools/tiny/prepare.py --write-twin-specs; tests/runtime/test_family_twins.py keeps them equal.\n")
    return head + body[body.index("MODEL_ARGS=("):]


def twin_spec_path(family: str) -> Path:
    return ROOT / "scripts" / "models" / f"tiny-{family.replace('_', '-')}.sh"


def build_twin(family: str, out: Path, vocab_size: int, eos_id: int, pad_id: int, seed: int,
               dtype: str = "float32") -> None:
    """The family's tiny twin in `out` (config.json, safetensors, generation_config.json)."""
    import reference_models as rm
    from transformers import GenerationConfig

    mtp_count = "mtp_num_hidden_layers" if family == "qwen3_5" else "num_nextn_predict_layers"
    text = {"vocab_size": vocab_size, "eos_token_id": eos_id, "pad_token_id": pad_id, "bos_token_id": None,
            mtp_count: 0}
    rm.build(family, out, dtype=dtype, seed=seed, text_overrides=text, mtp=False, spec=False, hf_dir=out)
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
    ap.add_argument("--model-dir")
    ap.add_argument("--data-dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model-spec", help="a scripts/models/*.sh whose MODEL_ARGS give the model's shape "
                                         "(default: the tiny CPU shape)")
    ap.add_argument("--family", help="build a tiny twin of this seeded architecture family (its shape is "
                                     "tools/reference_models.py's; the spec scripts/models/tiny-<family>.sh)")
    ap.add_argument("--write-twin-specs", action="store_true",
                    help="(maintainers) write scripts/models/tiny-<family>.sh for every family and exit")
    ap.add_argument("--prompt-digits", type=int, default=3,
                    help="digits per prompt (default 3: the tiny task; longer for throughput benchmarks)")
    ap.add_argument("--device", default="cpu", help="where the random weights are initialised (cpu, cuda)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="saved weights' dtype")
    a = ap.parse_args(argv)
    if a.write_twin_specs:
        import reference_models as rm

        for fam in rm.FAMILIES:
            path = twin_spec_path(fam)
            path.write_text(twin_spec_text(fam, len(SPECIALS) + len(CHARS)))
            print(path)
        return
    if not (a.model_dir and a.data_dir):
        ap.error("--model-dir and --data-dir are required")
    model_dir = Path(a.model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(model_dir)
    if a.family:
        if a.model_spec or a.prompt_digits != 3 or a.device != "cpu":
            ap.error("--family builds the family's own shape on the CPU for the tiny task: drop --model-spec / "
                     "--prompt-digits / --device")
        build_twin(twin_family(a.family), model_dir, len(tok), tok.eos_token_id, tok.pad_token_id, a.seed, a.dtype)
    else:
        shape = shape_from_spec(a.model_spec, len(tok)) if a.model_spec else None
        # room for the chat template's tags, the prompt and a short answer
        positions = 64 if a.prompt_digits <= 3 else 2 ** (a.prompt_digits + 64).bit_length()
        build_model(model_dir, len(tok), tok.eos_token_id, tok.pad_token_id, a.seed, shape, positions, a.device,
                    a.dtype)
    n_train, n_eval = build_data(Path(a.data_dir), a.seed, digits=a.prompt_digits)
    print(f"model: {model_dir} (vocab {len(tok)}); data: {a.data_dir} ({n_train} train, {n_eval} eval)")


if __name__ == "__main__":
    main()
