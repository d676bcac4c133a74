"""Load the HF causal LM and tokenizer the embedded backends run (CPU float32 or GPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

# A Hugging Face causal LM (a transformers PreTrainedModel, a torch Module). Its parts are read by
# name (model.model.layers[i].self_attn.q_proj, config.model_type), which nn.Module's typing can
# only call `Tensor | Module`: so it is Any to the type checker.
HFCausalLM = Any


def pick_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def load_tokenizer(hf_checkpoint: str):
    from transformers import AutoTokenizer

    # padding_side is not saved with the tokenizer; the engine pads left itself anyway.
    return AutoTokenizer.from_pretrained(hf_checkpoint, padding_side="left")


def load_model(hf_checkpoint: str, weights: dict[str, torch.Tensor] | None = None,
               device: torch.device | None = None, dtype: torch.dtype = torch.float32) -> HFCausalLM:
    """The architecture always comes from --hf-checkpoint's config.json; the weights from there
    or from `weights` (a trainer checkpoint, under the checkpoint's names: slime/hf/layout.py).
    float32 on CPU: the train/rollout KL check relies on both sides computing in the same precision."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one bar per load floods every actor's log

    from slime.hf.layout import load_checkpoint_tensors

    device = device or pick_device()
    model: HFCausalLM
    if weights is None:
        model = AutoModelForCausalLM.from_pretrained(hf_checkpoint, dtype=dtype)
    else:
        config = AutoConfig.from_pretrained(hf_checkpoint)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        load_checkpoint_tensors(model, weights, strict=True)
    return model.to(device)


def eos_token_ids(tokenizer, hf_checkpoint: str) -> tuple[int, ...]:
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_cfg = Path(hf_checkpoint) / "generation_config.json"
    if gen_cfg.exists():
        import json

        eos = json.loads(gen_cfg.read_text()).get("eos_token_id")
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    return tuple(sorted(ids))
