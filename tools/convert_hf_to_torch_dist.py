"""Convert a Hugging Face checkpoint into the trainer's checkpoint format (the --ref-load dir).

    python tools/convert_hf_to_torch_dist.py --backend embedded --hf-checkpoint HF_DIR --save OUT_DIR

--backend embedded: OUT_DIR/release/{model.safetensors,state.json} + latest_checkpointed_iteration.txt
("release"), the layout slime/checkpoint.py loads. --backend megatron: the torch_dist conversion
(reshardable, run on GPUs with the model's MODEL_ARGS) lives in slime/backends/megatron/convert.py
and plugs in through CONVERTERS below.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere in the repo


def convert_embedded(hf_checkpoint: str, save: str, extra: list[str]) -> Path:
    if extra:
        raise SystemExit(f"--backend embedded takes no model/parallelism flags (got {extra}): the "
                         f"architecture comes from {hf_checkpoint}/config.json")
    import torch

    from slime.checkpoint import save_checkpoint
    from slime.hf.model import load_model
    from slime.hf.weights import named_weights

    model = load_model(hf_checkpoint, device=torch.device("cpu"))
    config = json.loads((Path(hf_checkpoint) / "config.json").read_text())
    return save_checkpoint(save, "release", named_weights(model), None,
                           {"source": str(Path(hf_checkpoint).resolve()), "model_type": config.get("model_type"),
                            "num_parameters": sum(p.numel() for p in model.parameters())})


def convert_megatron(hf_checkpoint: str, save: str, extra: list[str]) -> Path:
    # The Megatron converter checks config.json against the spec (--model-args) before any weight
    # moves, and runs under torchrun on GPUs (tools/convert_hf_to_torch_dist_megatron.py).
    from slime.backends.megatron.convert import main_hf_to_torch_dist

    code = main_hf_to_torch_dist(["--hf-checkpoint", hf_checkpoint, "--save", save, *extra], script=__file__)
    if code:
        raise SystemExit(code)
    return Path(save)


CONVERTERS: dict[str, Callable[[str, str, list[str]], Path]] = {
    "embedded": convert_embedded,
    "megatron": convert_megatron,
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="HF checkpoint -> trainer checkpoint (--ref-load format)")
    ap.add_argument("--backend", choices=sorted(CONVERTERS), default="embedded")
    ap.add_argument("--hf-checkpoint", required=True)
    ap.add_argument("--save", required=True)
    a, extra = ap.parse_known_args(argv)
    if not (Path(a.hf_checkpoint) / "config.json").exists():
        raise SystemExit(f"--hf-checkpoint {a.hf_checkpoint}: no config.json (not a Hugging Face checkpoint)")
    out = CONVERTERS[a.backend](a.hf_checkpoint, a.save, extra)
    print(f"wrote {out} (load it with --ref-load {a.save})")


if __name__ == "__main__":
    main()
