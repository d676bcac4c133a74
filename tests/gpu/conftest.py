"""Fixtures for the GPU tests: a small Qwen2-architecture model made locally (random init through
transformers' config, a word-level tokenizer, no hub), its spec file, and its torch_dist
conversion. Every test here is marked ``gpu`` and skips cleanly without CUDA or megatron-core.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_helpers import SHAPE, VOCAB, run_tool, spec_text


@pytest.fixture(scope="session")
def gpu_ready():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    pytest.importorskip("megatron.core")
    return True


def _make_tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>"]
    vocab = {t: i for i, t in enumerate(specials + [f"w{i}" for i in range(VOCAB - len(specials))])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    fast.save_pretrained(out)
    return fast


@pytest.fixture(scope="session")
def tiny(gpu_ready, tmp_path_factory):
    """(hf_dir, spec_path): bf16 Qwen2 weights, norms and biases perturbed so none is trivial."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    base = tmp_path_factory.mktemp("tiny")
    hf = base / "hf"
    tok = _make_tokenizer(hf)
    cfg = Qwen2Config(vocab_size=VOCAB, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
                      max_position_embeddings=4096, initializer_range=0.05, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, bos_token_id=None, **SHAPE)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.2)
    model.to(torch.bfloat16).save_pretrained(hf)
    GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id).save_pretrained(hf)
    spec = base / "tiny-qwen2.sh"
    spec.write_text(spec_text())
    return hf, spec


@pytest.fixture(scope="session")
def converted(tiny):
    """The tiny model converted to torch_dist with the tool (a subprocess, like users run it)."""
    hf, spec = tiny
    save = hf.parent / "torch_dist"
    r = run_tool("tools/convert_hf_to_torch_dist_megatron.py", "--model-args", str(spec),
                 "--hf-checkpoint", str(hf), "--save", str(save))
    assert r.returncode == 0, r.stderr[-2000:]
    return save
