"""The tiny twins of the six seeded families (tools/tiny/prepare.py --family, the tiny-gpu-<family>
recipes) on the CPU: each committed spec is the generated one and agrees with the twin's
config.json; the embedded engine loads each twin with transformers' own class and its sampled
log-probs are the HF forward's; a weight sync under the checkpoint's names (per-expert MoE
tensors split across buckets, the router's expert bias, Qwen3.5's composite prefix) lands every
tensor where transformers' own loader puts it."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "tiny"))
sys.path.insert(0, str(ROOT / "tools"))

import prepare  # noqa: E402  (tools/tiny/prepare.py)

FAMILIES = ["glm4", "glm4_moe", "glm4_moe_lite", "deepseek_v3", "glm_moe_dsa", "qwen3_5"]
VOCAB = len(prepare.SPECIALS) + len(prepare.CHARS)


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    base = tmp_path_factory.mktemp("twins")
    out = {}
    for fam in FAMILIES:
        prepare.main(["--family", fam, "--model-dir", str(base / fam / "model"), "--data-dir", str(base / fam / "data")])
        out[fam] = base / fam / "model"
    return out


def _checkpoint(d: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    sd: dict[str, torch.Tensor] = {}
    for f in sorted(d.glob("*.safetensors")):
        sd.update(load_file(str(f)))
    return sd


def _hf(d: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()


def _engine_vs_hf(core, hf_model, tokenizer) -> float:
    """Largest |engine log-prob - HF forward log-prob| over the sampled tokens of 4 prompts."""
    from slime.inference.engine_core import GenerateRequest
    from slime.inference.sampler import RowParams

    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                             tokenize=True, return_dict=False) for p in ("123", "40", "9", "777")]
    req = GenerateRequest(input_ids=prompts, params=[RowParams(max_new_tokens=3, ignore_eos=True, seed=i)
                                                     for i in range(len(prompts))], rids=[str(i) for i in range(4)])
    outs = core.generate(req)
    worst = 0.0
    for p, o in zip(prompts, outs):
        ids = torch.tensor([list(p) + o["output_ids"]])
        with torch.no_grad():
            lp = torch.log_softmax(hf_model(input_ids=ids).logits[0].float(), -1)
        ref = [lp[len(p) - 1 + j, t].item() for j, t in enumerate(o["output_ids"])]
        got = [x[0] for x in o["meta_info"]["output_token_logprobs"]]
        worst = max(worst, *(abs(a - b) for a, b in zip(got, ref)))
    return worst


def test_committed_twin_specs_are_generated_and_match_config(twins):
    from slime.model_spec import flag_mismatches, load_flags

    for fam in FAMILIES:
        path = prepare.twin_spec_path(fam)
        assert path.read_text() == prepare.twin_spec_text(fam, VOCAB), \
            f"{path} is stale: python tools/tiny/prepare.py --write-twin-specs"
        hf = json.loads((twins[fam] / "config.json").read_text())
        assert not flag_mismatches(load_flags(str(path)), hf), fam


@pytest.mark.parametrize("family", FAMILIES)
def test_engine_serves_twin_like_hf_and_syncs_checkpoint_names(family, twins, tmp_path):
    from slime.hf.layout import model_tensors
    from slime.inference.engine_core import EngineCore

    model_dir = twins[family]
    core = EngineCore(str(model_dir), seed=0, device="cpu", dtype=torch.float32)
    before = _engine_vs_hf(core, _hf(model_dir), core.tokenizer)
    assert before < 1e-4, f"{family}: engine vs HF log-prob {before:.3g}"

    # New weights under the checkpoint's names, in two buckets that split the experts of a layer.
    g = torch.Generator().manual_seed(1)
    new = {k: (v.float() + 0.05 * torch.randn(v.shape, generator=g)).to(v.dtype) for k, v in
           _checkpoint(model_dir).items()}
    names = sorted(new)
    half = len(names) // 2
    core.update_from_named({k: new[k] for k in names[:half]}, 1, last_bucket=False)
    core.update_from_named({k: new[k] for k in names[half:]}, 1, last_bucket=True)
    assert core.weight_version == "1"

    # transformers' own loader, reading the same tensors, is the reference layout.
    ref_dir = tmp_path / "ref"
    shutil.copytree(model_dir, ref_dir)
    for f in ref_dir.glob("*.safetensors*"):
        f.unlink()
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in new.items()}, str(ref_dir / "model.safetensors"),
              metadata={"format": "pt"})
    ref = _hf(ref_dir)
    mine, theirs = model_tensors(core.model), model_tensors(ref)
    assert set(mine) == set(theirs)
    differ = [k for k in mine if not torch.equal(mine[k].float(), theirs[k].float())]
    assert not differ, f"{family}: synced tensors differ from transformers' load: {differ[:5]}"
    after = _engine_vs_hf(core, ref, core.tokenizer)
    assert after < 1e-4, f"{family}: after sync, engine vs HF log-prob {after:.3g}"

    # A full update from a directory (the disk transport) is strict: every model tensor filled.
    core.update_from_disk(str(ref_dir), 2)
    assert core.weight_version == "2"


def test_layout_rules_tied_weights_skipped_and_unknown_names():
    """Tied weights are one tensor; MTP layers and a vision tower are skipped and counted; any other
    name the model has no place for, a missing tensor in a full update, or a wrong shape is refused."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from slime.hf.layout import load_checkpoint_tensors

    m = Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True))
    named = {n: p.detach().clone() + 1 for n, p in m.named_parameters()}
    extra = {"model.layers.1.eh_proj.weight": torch.zeros(16, 32), "mtp.fc.weight": torch.zeros(16, 32),
             "model.visual.patch_embed.proj.weight": torch.zeros(4)}
    assert load_checkpoint_tensors(m, {**named, **extra}, strict=True) == {"mtp": 2, "vision": 1}
    assert torch.equal(m.lm_head.weight, named["model.embed_tokens.weight"])
    with pytest.raises(KeyError, match="unknown weight names"):
        load_checkpoint_tensors(m, {"model.layers.0.mlp.nonsense.weight": torch.zeros(1)})
    with pytest.raises(KeyError, match="missing weight names"):
        load_checkpoint_tensors(m, {"model.norm.weight": named["model.norm.weight"]}, strict=True)
    with pytest.raises(ValueError, match="shape"):
        load_checkpoint_tensors(m, {"model.norm.weight": torch.zeros(3)})
