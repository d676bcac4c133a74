#!/usr/bin/env python3
"""Megatron torch_dist -> HF safetensors (+ config/tokenizer copied from --hf-template).

    python tools/convert_torch_dist_to_hf.py --model-args scripts/models/glm4-9B.sh \
        --load /runs/x/ckpt --save /runs/x/hf --hf-template /ckpt/GLM-4-9B

Any training parallel layout loads (torch_dist reshards); --nproc-per-node splits the layers
over pipeline stages (--pp), --tp / --ep choose tensor and expert parallelism; each tensor is
written by one rank. --cpu runs over gloo without a GPU. Logic: slime/backends/megatron/convert.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from slime.backends.megatron.convert import main_torch_dist_to_hf  # noqa: E402

if __name__ == "__main__":
    sys.exit(main_torch_dist_to_hf(script=__file__))
