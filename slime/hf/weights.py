"""Named weights between the trainer and the engines: buckets, safetensors bytes, disk dirs.

Both sides name tensors by `model.named_parameters()` (tied weights appear once), so what the
trainer exports is exactly what the engine expects. Bytes are safetensors (no pickle), so a
payload from the network can never execute code.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load as st_load
from safetensors.torch import load_file, save_file
from safetensors.torch import save as st_save

INDEX = "model.safetensors.index.json"


def named_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().to("cpu").contiguous() for n, p in model.named_parameters()}


def bucketize(named: dict[str, torch.Tensor], buffer_size: int) -> list[dict[str, torch.Tensor]]:
    """Split into buckets of at most buffer_size bytes (a larger tensor gets a bucket alone)."""
    buckets: list[dict[str, torch.Tensor]] = [{}]
    used = 0
    for name, t in named.items():
        size = t.numel() * t.element_size()
        if buckets[-1] and used + size > buffer_size:
            buckets.append({})
            used = 0
        buckets[-1][name] = t
        used += size
    return buckets


def encode_bucket(bucket: dict[str, torch.Tensor]) -> bytes:
    return st_save(bucket)


def decode_bucket(data: bytes) -> dict[str, torch.Tensor]:
    return st_load(data)


def write_weights_dir(named: dict[str, torch.Tensor], path: str | Path, buffer_size: int) -> Path:
    """Shards of <= buffer_size bytes plus an index; written to a temp dir, then renamed, so a
    reader never sees half a directory."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    buckets = bucketize(named, buffer_size)
    weight_map = {}
    for i, bucket in enumerate(buckets, start=1):
        fname = f"model-{i:05d}-of-{len(buckets):05d}.safetensors"
        save_file(bucket, str(tmp / fname))
        weight_map.update({n: fname for n in bucket})
    (tmp / INDEX).write_text(json.dumps({"weight_map": weight_map}))
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
    return path


def read_weights_dir(path: str | Path) -> dict[str, torch.Tensor]:
    """A dir written by write_weights_dir, or an HF dir with model.safetensors / shards."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"weights directory not found: {path}")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def load_into(model: torch.nn.Module, named: dict[str, torch.Tensor], strict: bool = True) -> None:
    """Copy tensors into the model's parameters in place (storage, and so the KV-free state,
    stays where it is). strict: every parameter must be given (a full update)."""
    params = dict(model.named_parameters())
    unknown = sorted(set(named) - set(params))
    if unknown:
        raise KeyError(f"unknown weight names: {unknown[:5]}{'...' if len(unknown) > 5 else ''}")
    if strict:
        missing = sorted(set(params) - set(named))
        if missing:
            raise KeyError(f"missing weight names: {missing[:5]}{'...' if len(missing) > 5 else ''}")
    with torch.no_grad():
        for name, t in named.items():
            p = params[name]
            if p.shape != t.shape:
                raise ValueError(f"{name}: shape {tuple(t.shape)} != model's {tuple(p.shape)}")
            p.copy_(t.to(device=p.device, dtype=p.dtype))
