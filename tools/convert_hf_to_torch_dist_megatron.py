#!/usr/bin/env python3
"""HF safetensors -> Megatron torch_dist with megatron-core (the Megatron backend's conversion).

    python tools/convert_hf_to_torch_dist_megatron.py --model-args scripts/models/glm4-9B.sh \
        --hf-checkpoint /ckpt/GLM-4-9B --save /ckpt/GLM-4-9B_torch_dist [--nproc-per-node 8] \
        [--tp T] [--pp P] [--ep E] [--cpu]

--cpu builds the model and writes torch_dist on CPUs over gloo (no GPU needed).

Multi-node: on every node set CONVERT_MASTER_ADDR=<node 0's address> and CONVERT_NODE_RANK=<i>,
then run the same command with --nnodes N --nproc-per-node G. The checkpoint's config.json is
checked against the spec first; a disagreement is refused before any weight is read.
Logic: slime/backends/megatron/convert.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from slime.backends.megatron.convert import main_hf_to_torch_dist  # noqa: E402

if __name__ == "__main__":
    sys.exit(main_hf_to_torch_dist(script=__file__))
