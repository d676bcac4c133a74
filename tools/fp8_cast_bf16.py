#!/usr/bin/env python3
"""FP8 (block-wise scaled) HF checkpoints -> BF16, shard by shard.

DeepSeek-V3/R1 and GLM-5.x publish linear weights as ``float8_e4m3fn`` with one float32
``<name>_scale_inv`` per 128 x 128 block (``weight_block_size`` in config.json's
``quantization_config``): ``bf16[i, j] = fp8[i, j] * scale_inv[i // 128, j // 128]``. Edge blocks
may be partial. Tensors without a scale are copied unchanged; the ``*_scale_inv`` tensors are
dropped, the index is rewritten and ``quantization_config`` is removed from config.json.

    python tools/fp8_cast_bf16.py --input-fp8-hf-path /ckpt/DeepSeek-R1 --output-bf16-hf-path /ckpt/DeepSeek-R1-bf16

Runs on CPU (``--device cuda`` is faster where there is a GPU). Peak memory is about one shard.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

SCALE_SUFFIX = "_scale_inv"


def block_dequant(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int] = (128, 128),
                  out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``weight`` ``[M, N]`` (fp8) times its per-block ``scale_inv`` ``[ceil(M/bm), ceil(N/bn)]``."""
    if weight.dim() != 2:
        raise ValueError(f"block-scaled weights are 2-D, got shape {tuple(weight.shape)}")
    bm, bn = block
    m, n = weight.shape
    want = (-(-m // bm), -(-n // bn))
    if tuple(scale_inv.shape) != want:
        raise ValueError(f"scale_inv shape {tuple(scale_inv.shape)} does not match weight {m}x{n} in "
                         f"{bm}x{bn} blocks (expected {want})")
    scale = scale_inv.float().repeat_interleave(bm, dim=0)[:m].repeat_interleave(bn, dim=1)[:, :n]
    return (weight.float() * scale).to(out_dtype)


def convert_dir(src: str | Path, dst: str | Path, device: str = "cpu", log=print) -> dict[str, int]:
    from safetensors import safe_open
    from safetensors.torch import save_file

    src, dst = Path(src), Path(dst)
    if dst.resolve() == src.resolve():
        raise ValueError("output dir must differ from the input dir")
    dst.mkdir(parents=True, exist_ok=True)
    cfg_path = src / "config.json"
    block = (128, 128)
    cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
    qc = cfg.get("quantization_config") or {}
    if qc.get("weight_block_size"):
        block = tuple(int(x) for x in qc["weight_block_size"])
    index_path = src / "model.safetensors.index.json"
    if index_path.exists():
        weight_map: dict[str, str] = json.loads(index_path.read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    else:
        files = sorted(p.name for p in src.glob("*.safetensors"))
        weight_map = {}
    if not files:
        raise FileNotFoundError(f"no safetensors in {src}")
    # A scale may sit in another shard than its weight: locate every tensor first.
    location: dict[str, str] = dict(weight_map)
    if not location:
        for f in files:
            with safe_open(str(src / f), "pt") as h:
                location.update({k: f for k in h.keys()})
    new_map: dict[str, str] = {}
    stats = {"dequantized": 0, "copied": 0, "scales_dropped": 0}
    t0 = time.time()
    for i, f in enumerate(files, 1):
        out: dict[str, torch.Tensor] = {}
        with safe_open(str(src / f), "pt", device=device) as h:
            for name in h.keys():
                if name.endswith(SCALE_SUFFIX):
                    stats["scales_dropped"] += 1
                    continue
                t = h.get_tensor(name)
                scale_name = name + SCALE_SUFFIX
                if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) or scale_name in location:
                    if scale_name not in location:
                        raise KeyError(f"{name} is {t.dtype} but {scale_name} is missing")
                    sf = location[scale_name]
                    if sf == f:
                        s = h.get_tensor(scale_name)
                    else:
                        with safe_open(str(src / sf), "pt", device=device) as h2:
                            s = h2.get_tensor(scale_name)
                    t = block_dequant(t, s, block)
                    stats["dequantized"] += 1
                else:
                    stats["copied"] += 1
                out[name] = t.to("cpu").contiguous()
        save_file(out, str(dst / f), metadata={"format": "pt"})
        new_map.update({n: f for n in out})
        log(f"[fp8->bf16] {i}/{len(files)} {f}: {len(out)} tensors ({time.time() - t0:.1f} s)")
    total = sum((dst / f).stat().st_size for f in files)
    (dst / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": dict(sorted(new_map.items()))}, indent=1))
    for p in src.iterdir():
        if p.is_file() and not p.name.endswith(".safetensors") and p.name not in (
                "model.safetensors.index.json", "config.json"):
            shutil.copy(p, dst / p.name)
    if cfg:
        cfg.pop("quantization_config", None)
        cfg["torch_dtype"] = "bfloat16"
        (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    log(f"[fp8->bf16] done: {stats} in {time.time() - t0:.1f} s -> {dst}")
    return stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input-fp8-hf-path", required=True)
    ap.add_argument("--output-bf16-hf-path", required=True)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    a = ap.parse_args(argv)
    convert_dir(a.input_fp8_hf_path, a.output_bf16_hf_path, device=a.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
