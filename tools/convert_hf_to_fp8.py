#!/usr/bin/env python3
"""HF BF16 checkpoint -> block-wise FP8 (DeepSeek-V3 layout) serving checkpoint, shard by shard.

Every 2-D Linear weight of the transformer layers (``*.layers.N.*.weight``) becomes
``float8_e4m3fn`` plus one float32 ``<name>_scale_inv`` per 128 x 128 block, shape
``[ceil(out/128), ceil(in/128)]``, with ``w ~= fp8[i, j] * scale_inv[i // 128, j // 128]``
(partial edge blocks get their own scale). ``scale_inv = amax(|block|) / 448``. Not quantized, copied
byte for byte: embeddings, norms, lm_head, biases, MoE router gates (``mlp.gate.weight``,
``shared_expert_gate.weight``) and anything outside the transformer layers. config.json gets
``quantization_config = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
"weight_block_size": [128, 128]}``, which is what slime's FP8 weight sync re-quantizes with (PRC-2).
``tools/fp8_cast_bf16.py`` is the inverse.

    python tools/convert_hf_to_fp8.py --model-dir /ckpt/Qwen3-4B --save-dir /ckpt/Qwen3-4B-fp8 \\
        --strategy block --block-size 128 128

Shards keep their input names (an index json is written when the input is sharded); tokenizer,
generation config and other small files are copied; config.json is written last, so a save dir
holding config.json is a finished conversion. Peak memory is about one shard. SGLang's block-FP8
kernels need Hopper (sm90) or newer and dims divisible by 128 per tensor-parallel shard.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

import torch

SCALE_SUFFIX = "_scale_inv"
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
INDEX = "model.safetensors.index.json"
QUANTIZED_MARKERS = (SCALE_SUFFIX, ".weight_packed", ".weight_scale", ".qweight", ".scales")


class ConversionError(Exception):
    """A problem with the input or output dir, reported as one line naming the path."""


# ---------------------------------------------------------------- shared with convert_hf_to_int4.py
def say(msg: str) -> None:
    print(msg, flush=True)


_LAYER = re.compile(r"(^|\.)layers\.\d+\.")
_NOT_QUANTIZED = re.compile(r"(norm|embed|lm_head|(^|\.)mlp\.gate\.weight$|shared_expert_gate\.weight$)")


def is_quantizable(name: str, t: torch.Tensor) -> bool:
    """A 2-D floating Linear weight inside a transformer layer, not a norm/embedding/router gate."""
    return (t.dim() == 2 and name.endswith(".weight") and t.is_floating_point()
            and t.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2)
            and bool(_LAYER.search(name)) and not _NOT_QUANTIZED.search(name))


def open_source(model_dir: str | Path, save_dir: str | Path, overwrite: bool = False) -> tuple[dict, list[str], bool]:
    """Validate the dirs; return (config, shard file names, sharded?). Raises ConversionError."""
    from safetensors import safe_open

    src, dst = Path(model_dir), Path(save_dir)
    if not src.exists():
        raise ConversionError(f"--model-dir {src} does not exist")
    if not src.is_dir():
        raise ConversionError(f"--model-dir {src} is not a directory")
    cfg_path = src / "config.json"
    if not cfg_path.is_file():
        raise ConversionError(f"{cfg_path} is missing: --model-dir must be a Hugging Face checkpoint dir")
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise ConversionError(f"{cfg_path} is not valid JSON: {e}") from None
    if cfg.get("quantization_config"):
        qm = cfg["quantization_config"].get("quant_method", "?")
        raise ConversionError(f"{src} is already quantized (config.json quantization_config.quant_method={qm!r}); "
                              f"convert from the BF16 checkpoint")
    if dst.resolve() == src.resolve():
        raise ConversionError(f"--save-dir {dst} must differ from --model-dir")
    if (dst / "config.json").exists() and not overwrite:
        raise ConversionError(f"--save-dir {dst} already holds a checkpoint (config.json); pass --overwrite or "
                              f"remove it")
    sharded = (src / INDEX).is_file()
    if sharded:
        files = sorted(set(json.loads((src / INDEX).read_text())["weight_map"].values()))
        missing = [f for f in files if not (src / f).is_file()]
        if missing:
            raise ConversionError(f"{src / INDEX} names shards that are missing: {missing[:3]}")
    else:
        files = sorted(p.name for p in src.glob("*.safetensors"))
        sharded = len(files) > 1
    if not files:
        raise ConversionError(f"no *.safetensors in {src}")
    with safe_open(str(src / files[0]), "pt") as h:
        keys = list(h.keys())
        marker = next((k for k in keys if k.endswith(QUANTIZED_MARKERS)), None)
        if marker:
            raise ConversionError(f"{src} is already quantized ({marker} in {files[0]}); convert from the BF16 "
                                  f"checkpoint")
        fp8 = next((k for k in keys if h.get_slice(k).get_dtype() in ("F8_E4M3", "F8_E5M2")), None)
        if fp8:
            raise ConversionError(f"{src} is already quantized ({fp8} is FP8); convert from the BF16 checkpoint")
    dst.mkdir(parents=True, exist_ok=True)
    return cfg, files, sharded


def convert_shards(src: Path, dst: Path, files: list[str], sharded: bool, quantize, tag: str,
                   device: str = "cpu", log=None) -> dict[str, int]:
    """For each shard: ``quantize(name, tensor) -> {name: tensor}`` or None (copy unchanged)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    log = log or say
    stats = {"quantized": 0, "copied": 0}
    weight_map: dict[str, str] = {}
    total = 0
    t0 = time.time()
    for i, f in enumerate(files, 1):
        out: dict[str, torch.Tensor] = {}
        with safe_open(str(src / f), "pt", device=device) as h:
            metadata = h.metadata() or {}
            for name in h.keys():
                t = h.get_tensor(name)
                q = quantize(name, t) if is_quantizable(name, t) else None
                if q is None:
                    out[name] = t.to("cpu")
                    stats["copied"] += 1
                else:
                    out.update({k: v.to("cpu").contiguous() for k, v in q.items()})
                    stats["quantized"] += 1
        metadata = {**metadata, "format": "pt"}
        save_file(out, str(dst / f), metadata=metadata)
        total += sum(v.numel() * v.element_size() for v in out.values())
        weight_map.update({n: f for n in out})
        log(f"[{tag}] shard {i}/{len(files)} {f}: {stats['quantized']} quantized, {stats['copied']} copied so far "
            f"({time.time() - t0:.1f} s)")
    if sharded:
        (dst / INDEX).write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=2))
    return stats


def copy_side_files(src: Path, dst: Path) -> list[str]:
    """Tokenizer, generation config, chat template, custom modeling code...: every other plain file."""
    copied = []
    for p in sorted(src.iterdir()):
        if p.is_file() and not p.name.endswith((".safetensors", ".bin", ".pt", ".pth")) and p.name not in (
                INDEX, "config.json", "pytorch_model.bin.index.json"):
            shutil.copy2(p, dst / p.name)
            copied.append(p.name)
    return copied


def write_config(dst: Path, cfg: dict, quantization_config: dict) -> None:
    """Written last: the template's ``prepare`` treats ``<save-dir>/config.json`` as 'done'."""
    cfg = dict(cfg, quantization_config=quantization_config)
    tmp = dst / "config.json.tmp"
    tmp.write_text(json.dumps(cfg, indent=2) + "\n")
    tmp.replace(dst / "config.json")


# ---------------------------------------------------------------- FP8
def block_quant(w: torch.Tensor, block: tuple[int, int] = (128, 128)) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` [M, N] -> (fp8 e4m3 [M, N], float32 scale_inv [ceil(M/bm), ceil(N/bn)]), w ~= fp8 * scale_inv."""
    if w.dim() != 2:
        raise ValueError(f"block quantization needs a 2-D weight, got {tuple(w.shape)}")
    bm, bn = block
    m, n = w.shape
    mb, nb = -(-m // bm), -(-n // bn)
    x = torch.nn.functional.pad(w.float(), (0, nb * bn - n, 0, mb * bm - m))  # zeros do not change amax
    x = x.view(mb, bm, nb, bn)
    amax = x.abs().amax(dim=(1, 3), keepdim=True)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    q = q.view(mb * bm, nb * bn)[:m, :n].contiguous()
    return q, scale.view(mb, nb).contiguous()


def convert(model_dir: str | Path, save_dir: str | Path, block: tuple[int, int] = (128, 128),
            device: str = "cpu", overwrite: bool = False, log=None) -> dict[str, int]:
    log = log or say
    src, dst = Path(model_dir), Path(save_dir)
    cfg, files, sharded = open_source(src, dst, overwrite)
    log(f"[hf->fp8] {src} -> {dst}: {len(files)} shard(s), {block[0]}x{block[1]} blocks, e4m3")

    def quantize(name: str, t: torch.Tensor):
        q, s = block_quant(t, block)
        return {name: q, name + SCALE_SUFFIX: s}

    stats = convert_shards(src, dst, files, sharded, quantize, "hf->fp8", device, log)
    copy_side_files(src, dst)
    write_config(dst, cfg, {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [int(block[0]), int(block[1])]})
    if stats["quantized"] == 0:
        log("[hf->fp8] warning: no weight matched *.layers.N.*.weight; nothing was quantized")
    log(f"[hf->fp8] done: {stats} -> {dst}")
    return stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True, help="HF BF16 checkpoint dir (config.json + *.safetensors)")
    ap.add_argument("--save-dir", required=True, help="output dir for the FP8 checkpoint")
    ap.add_argument("--strategy", choices=["block"], default="block",
                    help="scaling granularity; only 'block' (DeepSeek-V3 style, what slime's FP8 sync uses)")
    ap.add_argument("--block-size", type=int, nargs=2, default=[128, 128], metavar=("OUT", "IN"),
                    help="block shape (default 128 128; SGLang's block-FP8 kernels expect 128 128)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (faster)")
    ap.add_argument("--overwrite", action="store_true", help="replace a finished conversion in --save-dir")
    a = ap.parse_args(argv)
    if min(a.block_size) <= 0:
        ap.error(f"--block-size must be positive, got {a.block_size}")
    if tuple(a.block_size) != (128, 128):
        print(f"[hf->fp8] warning: --block-size {a.block_size[0]} {a.block_size[1]}; slime and SGLang expect 128 128",
              file=sys.stderr)
    try:
        convert(a.model_dir, a.save_dir, tuple(a.block_size), a.device, a.overwrite)
    except ConversionError as e:
        print(f"convert_hf_to_fp8: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
