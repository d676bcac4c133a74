#!/usr/bin/env python3
"""HF BF16 checkpoint -> weight-only symmetric INT4 (compressed-tensors "pack-quantized"), shard by shard.

Round-to-nearest (no calibration, no GPTQ) with one scale per ``--group-size`` inputs:
``scale = amax(|w_group|) / 7.5`` (rounded *up* to the source dtype), ``q = clamp(round(w / scale), -8, 7)``,
``w ~= q * scale``. Same weights as ``tools/convert_hf_to_fp8.py``: every 2-D Linear weight of the
transformer layers, not embeddings, norms, lm_head, biases or MoE router gates. A weight whose input
dim is not a multiple of ``--group-size`` is left in BF16 and named in ``ignore``. Each quantized
``<prefix>.weight`` [out, in] becomes

    <prefix>.weight_packed  int32 [out, ceil(in / 8)]   8 nibbles per int32
    <prefix>.weight_scale   source dtype [out, in / group_size]
    <prefix>.weight_shape   int64 [2] = [out, in]

Packing follows ``pack_to_int32`` / ``unpack_from_int32`` of compressed-tensors
(``compressors/quantized_compressors/pack_quantized.py``, vllm-project/compressed-tensors, the
0.10-0.12 era main branch, read not copied): each value is stored unsigned as ``q + 8``; input columns
``8k .. 8k+7`` go into int32 ``k`` with column ``8k + j`` in bits ``4j .. 4j+3`` (first column in the
lowest nibble); the last word is zero-padded. config.json gets a compressed-tensors
``quantization_config`` (format "pack-quantized", one group targeting Linear: num_bits 4, type int,
symmetric, strategy group, group_size; ``ignore`` holds lm_head and every skipped layer Linear).
NOT verified here against SGLang's / vLLM's compressed-tensors loader or kernels (no GPU run): check
one converted model's greedy output against BF16 before a long run. Keep
``OPEN_TRAINING_INT4_GROUP_SIZE`` equal to ``--group-size`` (PRC-4); Marlin-style INT4 kernels need
Ampere (sm80) or newer.

    python tools/convert_hf_to_int4.py --model-dir /ckpt/Qwen3-4B --save-dir /ckpt/Qwen3-4B-int4 --group-size 128
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from convert_hf_to_fp8 import (
    ConversionError,
    convert_shards,
    copy_side_files,
    open_source,
    say,
    write_config,
)

NUM_BITS = 4
QMIN, QMAX = -8, 7
PACK = 32 // NUM_BITS  # 8 nibbles per int32


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """int8 values in [-8, 7], [rows, cols] -> int32 [rows, ceil(cols / 8)] (compressed-tensors order)."""
    if q.dtype != torch.int8 or q.dim() != 2:
        raise ValueError(f"pack_int4 wants a 2-D int8 tensor, got {q.dtype} {tuple(q.shape)}")
    if q.numel() and (int(q.min()) < QMIN or int(q.max()) > QMAX):
        raise ValueError("values out of the int4 range [-8, 7]")
    rows, cols = q.shape
    u = (q.to(torch.int64) + 8)  # unsigned nibble 0..15
    u = torch.nn.functional.pad(u, (0, -cols % PACK)).view(rows, -1, PACK)
    shifts = torch.arange(PACK, dtype=torch.int64, device=q.device) * NUM_BITS
    words = (u << shifts).sum(dim=2)  # 0 .. 2**32 - 1
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words)  # two's complement view as int32
    return words.to(torch.int32).contiguous()


def unpack_int4(packed: torch.Tensor, shape: tuple[int, int] | torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_int4`: int32 [rows, ceil(cols / 8)] -> int8 [rows, cols] in [-8, 7]."""
    if packed.dtype != torch.int32:
        raise ValueError(f"unpack_int4 wants int32, got {packed.dtype}")
    rows, cols = (int(x) for x in shape)
    shifts = torch.arange(PACK, dtype=torch.int32, device=packed.device) * NUM_BITS
    nib = (packed.unsqueeze(-1) >> shifts) & 0xF  # arithmetic shift is fine: the mask drops the sign bits
    return (nib.reshape(rows, -1)[:, :cols] - 8).to(torch.int8).contiguous()


def quantize_group(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` [out, in] -> (int8 q [out, in] in [-8, 7], scale [out, in / group] in w's dtype)."""
    out_f, in_f = w.shape
    if in_f % group_size:
        raise ValueError(f"input dim {in_f} is not a multiple of group size {group_size}")
    x = w.float().view(out_f, in_f // group_size, group_size)
    amax = x.abs().amax(dim=2)
    scale = amax / ((QMAX - QMIN) / 2)  # / 7.5, as compressed-tensors' symmetric minmax observer
    tiny = torch.finfo(w.dtype).tiny if w.dtype.is_floating_point else 1e-30
    scale = scale.clamp_min(tiny)
    # Store in the source dtype, rounded up so |w| / scale <= 7.5 still holds with the stored scale.
    stored = (scale * (1 + 2 ** -7)).to(w.dtype) if w.dtype in (torch.bfloat16, torch.float16) else scale.to(w.dtype)
    q = torch.round(x / stored.float().unsqueeze(-1)).clamp(QMIN, QMAX).to(torch.int8)
    return q.view(out_f, in_f), stored


def dequantize(packed: torch.Tensor, scale: torch.Tensor, shape, dtype=torch.float32) -> torch.Tensor:
    q = unpack_int4(packed, shape).float()
    out_f, in_f = q.shape
    g = in_f // scale.shape[1]
    return (q.view(out_f, -1, g) * scale.float().unsqueeze(-1)).view(out_f, in_f).to(dtype)


def quantization_config(group_size: int, ignore: list[str]) -> dict:
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {
                    "num_bits": NUM_BITS, "type": "int", "symmetric": True, "strategy": "group",
                    "group_size": group_size, "dynamic": False, "actorder": None, "observer": "minmax",
                    "observer_kwargs": {}, "block_structure": None,
                },
                "input_activations": None,
                "output_activations": None,
                "format": "pack-quantized",
            }
        },
        "ignore": ignore,
        "kv_cache_scheme": None,
        "sparsity_config": {},
    }


def convert(model_dir: str | Path, save_dir: str | Path, group_size: int = 128, device: str = "cpu",
            overwrite: bool = False, log=None) -> dict[str, int]:
    log = log or say
    if group_size <= 0 or group_size % PACK:
        raise ConversionError(f"--group-size must be a positive multiple of {PACK}, got {group_size}")
    src, dst = Path(model_dir), Path(save_dir)
    cfg, files, sharded = open_source(src, dst, overwrite)
    log(f"[hf->int4] {src} -> {dst}: {len(files)} shard(s), symmetric int4, group size {group_size}")
    skipped: list[str] = []

    def quantize(name: str, t: torch.Tensor):
        prefix = name[: -len(".weight")]
        if t.shape[1] % group_size:
            skipped.append(prefix)
            log(f"[hf->int4] warning: {name} {tuple(t.shape)}: input dim not a multiple of {group_size}, kept "
                f"{t.dtype} (listed in ignore)")
            return None
        q, s = quantize_group(t, group_size)
        return {prefix + ".weight_packed": pack_int4(q), prefix + ".weight_scale": s,
                prefix + ".weight_shape": torch.tensor(list(t.shape), dtype=torch.int64)}

    stats = convert_shards(src, dst, files, sharded, quantize, "hf->int4", device, log)
    copy_side_files(src, dst)
    write_config(dst, cfg, quantization_config(group_size, ["lm_head", *sorted(skipped)]))
    if stats["quantized"] == 0:
        log("[hf->int4] warning: nothing was quantized")
    log(f"[hf->int4] done: {stats} -> {dst}")
    return stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True, help="HF BF16 checkpoint dir (config.json + *.safetensors)")
    ap.add_argument("--save-dir", required=True, help="output dir for the INT4 checkpoint")
    ap.add_argument("--group-size", type=int, default=128,
                    help="inputs per scale (default 128); must match OPEN_TRAINING_INT4_GROUP_SIZE")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (faster)")
    ap.add_argument("--overwrite", action="store_true", help="replace a finished conversion in --save-dir")
    a = ap.parse_args(argv)
    try:
        convert(a.model_dir, a.save_dir, a.group_size, a.device, a.overwrite)
    except ConversionError as e:
        print(f"convert_hf_to_int4: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
