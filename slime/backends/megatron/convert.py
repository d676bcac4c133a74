"""Checkpoint conversion: HF safetensors <-> Megatron torch_dist (megatron.core.dist_checkpointing).

Entry points (thin CLIs in tools/ call these):
- :func:`main_hf_to_torch_dist` (``tools/convert_hf_to_torch_dist_megatron.py``)
- :func:`main_torch_dist_to_hf` (``tools/convert_torch_dist_to_hf.py``)

Order of work for HF -> torch_dist, so that a wrong checkpoint costs nothing:
1. read the spec and ``config.json`` and refuse on any disagreement (no library, no weight loaded);
2. start the process group and build the model skeleton (no random init);
3. read this rank's tensors lazily from the safetensors files, printing progress per layer;
4. ``dist_checkpointing.save`` into ``SAVE/release`` and write Megatron's tracker file.

Conversion parallelism is its own (``--pp``, default: every rank is a pipeline stage when the
layer count allows), never training's: torch_dist reshards on load, so a checkpoint written with
PP=4 loads into TP=2/PP=2 training (``--tp``/``--pp``/``--ep`` choose it). It runs on CPUs through
gloo (no GPU needed; :func:`torch_dist_io_without_cuda`) and across
nodes through torchrun: set ``CONVERT_MASTER_ADDR`` (and optionally ``CONVERT_MASTER_PORT``) and
``CONVERT_NODE_RANK`` on each node and pass ``--nnodes``/``--nproc-per-node``; the tool starts
torchrun itself.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

TRACKER = "latest_checkpointed_iteration.txt"
META = "slime_checkpoint.json"


def _log(msg: str) -> None:
    rank = os.environ.get("RANK", "0")
    world = os.environ.get("WORLD_SIZE", "1")
    print(f"[convert {rank}/{world}] {msg}", flush=True)


def checkpoint_subdir(load_dir: str | Path) -> Path:
    """The directory holding the torch_dist files, following Megatron's tracker file."""
    load_dir = Path(load_dir)
    tracker = load_dir / TRACKER
    if tracker.exists():
        it = tracker.read_text().strip()
        return load_dir / ("release" if it == "release" else f"iter_{int(it):07d}")
    if (load_dir / "metadata.json").exists():  # pointed at the iteration dir itself
        return load_dir
    raise FileNotFoundError(f"{load_dir}: no {TRACKER} and no torch_dist metadata.json")


def write_tracker(save_dir: str | Path, iteration: int | str) -> None:
    (Path(save_dir) / TRACKER).write_text(str(iteration))


def _want_gpu(use_gpu: bool | None) -> bool:
    """Conversion runs on GPUs (nccl) where there are some; ``False`` forces gloo + CPU."""
    import torch

    return torch.cuda.is_available() if use_gpu is None else use_gpu


def _cpu_mode(use_gpu: bool) -> None:
    """Conversion on CPUs builds the model as the trainer's CPU mode does (cpu.py): a MoE layer's
    router allocates its expert-bias buffers on ``torch.cuda.current_device()``, which must answer
    for the CPU where CUDA is absent. A no-op where CUDA exists."""
    if not use_gpu:
        from slime.backends.megatron import cpu as cpu_mode

        cpu_mode.apply()


@contextmanager
def torch_dist_io_without_cuda() -> Iterator[None]:
    """Let megatron-core's torch_dist writer run where no CUDA device exists (conversion and
    checkpoints on CPUs, over gloo).

    The writer asks CUDA for two things only: ``torch.cuda.synchronize()`` after copying the
    tensors to host memory (non-blocking copies; on a CPU they are already there) and
    ``torch.cuda.current_device()`` as the device of the one-integer failure flag it broadcasts
    (gloo wants it on the CPU). For the duration of the call, and only when CUDA is absent, those
    two answer for the CPU; where CUDA exists nothing changes."""
    import torch

    if torch.cuda.is_available():
        yield
        return
    saved = torch.cuda.synchronize, torch.cuda.current_device
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]  # as cpu.py: megatron-core passes it on as a device
    try:
        yield
    finally:
        torch.cuda.synchronize, torch.cuda.current_device = saved


def save_model_checkpoint(model, save_dir: str | Path, iteration: int | str = "release") -> Path:
    """Save ``model`` (this rank's shard; every rank calls it) as torch_dist under
    ``save_dir/release`` or ``save_dir/iter_NNNNNNN`` and point Megatron's tracker file at it.
    The layout it was saved at does not matter to :func:`load_model_checkpoint`."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    from slime.backends.megatron.model import unwrap

    sub = "release" if iteration == "release" else f"iter_{int(iteration):07d}"
    out = Path(save_dir) / sub
    if dist.get_rank() == 0:
        out.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    state = {"model": unwrap(model).sharded_state_dict(), "checkpoint_version": 3.0,
             "iteration": 0 if iteration == "release" else int(iteration)}
    with torch_dist_io_without_cuda():
        dist_checkpointing.save(state, str(out))
    dist.barrier()
    if dist.get_rank() == 0:
        write_tracker(save_dir, iteration)
    return out


def _default_pp(num_layers: int, world: int) -> int:
    for pp in range(min(world, num_layers), 0, -1):
        if world % pp == 0 and num_layers % pp == 0:
            return pp
    return 1


def maybe_launch_torchrun(argv: Sequence[str], nnodes: int, nproc_per_node: int, script: str) -> int | None:
    """Re-run this tool under torchrun when asked for several processes and not inside one yet."""
    if (nnodes * nproc_per_node) <= 1 or "LOCAL_RANK" in os.environ:
        return None
    master = os.environ.get("CONVERT_MASTER_ADDR", "127.0.0.1")
    node_rank = os.environ.get("CONVERT_NODE_RANK", "0")
    if nnodes > 1 and "CONVERT_MASTER_ADDR" not in os.environ:
        raise SystemExit("multi-node conversion: set CONVERT_MASTER_ADDR (and CONVERT_NODE_RANK on each node)")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--node-rank={node_rank}",
           f"--nproc-per-node={nproc_per_node}", f"--master-addr={master}",
           f"--master-port={os.environ.get('CONVERT_MASTER_PORT', '29611')}", script, *argv]
    _log("launching: " + " ".join(cmd))
    return subprocess.call(cmd)


# --- HF -> torch_dist -------------------------------------------------------------------------


def conversion_layout(flags: Any, *, tp: int = 1, pp: int | None = None, ep: int = 1,
                      world: int | None = None) -> dict[str, int]:
    """Megatron's parallel sizes for a conversion over ``world`` ranks (``WORLD_SIZE``): TP and EP
    as given, PP by default as many stages as the layers and the remaining ranks allow; routed
    experts are not split over TP (expert-TP 1), so any EP that divides a stage's ranks fits.
    Raises ValueError naming the flags and the fix."""
    world = int(os.environ.get("WORLD_SIZE", 1)) if world is None else world
    for name, v in (("--tp", tp), ("--ep", ep), ("--pp", pp or 1)):
        if v < 1 or world % v:
            raise ValueError(f"{name} {v} does not divide the {world} conversion ranks "
                             "(--nnodes x --nproc-per-node): choose a divisor, or change the rank count")
    pp = pp or _default_pp(int(flags["num_layers"]), world // (tp * ep))
    if world % (tp * pp) or (world // pp) % ep:
        raise ValueError(f"--tp {tp} --pp {pp} --ep {ep}: TP x PP must divide the {world} conversion ranks, and EP "
                         "the ranks of one pipeline stage; lower one of them")
    par = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp, "expert_model_parallel_size": ep}
    if ep > 1:
        par["expert_tensor_parallel_size"] = 1
    return par


def hf_to_torch_dist(hf_dir: str | Path, save_dir: str | Path, spec: Any, *, pp: int | None = None,
                     tp: int = 1, ep: int = 1, use_gpu: bool | None = None,
                     progress: Callable[[str], None] = _log) -> Path:
    """Convert; returns ``save_dir``. ``spec``: a spec file, an argv list or a flag dict."""
    from slime.backends.megatron import hf_mapping as hm
    from slime.backends.megatron.model_args import check_hf_config, load_flags, unsupported_flags

    flags = load_flags(spec)
    t0 = time.time()
    check_hf_config(flags, hf_dir)  # 1. refuse before anything moves
    hm.require_mapped(flags)
    bad = unsupported_flags(flags)
    if bad:
        raise SystemExit("; ".join(bad))
    save_dir = Path(save_dir)
    out = save_dir / "release"
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty; remove it or choose another --save")

    import torch.distributed as dist

    from slime.backends.megatron.model import HFReader, build_model, init_parallel, load_hf_into

    use_gpu = _want_gpu(use_gpu)
    par = conversion_layout(flags, tp=tp, pp=pp, ep=ep)
    pp = par["pipeline_model_parallel_size"]
    world = int(os.environ.get("WORLD_SIZE", 1))
    _cpu_mode(use_gpu)
    init_parallel(par, backend=None if use_gpu else "gloo")
    from slime.backends.megatron import cpu as cpu_mode

    with cpu_mode.cuda_to_cpu():  # a no-op on GPUs
        model = build_model(flags, par, cpu=not use_gpu, init_weights=False)
    reader = HFReader(hf_dir)
    d = hm.dims_from_flags(flags)
    unknown = hm.unmapped_hf_names(list(reader.weight_map), d)
    if unknown:
        raise KeyError(f"{hf_dir} holds tensors the spec's architecture does not have: {unknown[:8]}"
                       f"{' ...' if len(unknown) > 8 else ''}")
    carried = hm.carried_hf_names(list(reader.weight_map), d)
    progress(f"spec agrees with {hf_dir}/config.json; reading weights (tp={tp}, pp={pp}, world={world})")
    moved = load_hf_into(model, flags, reader.get,
                         progress=lambda m: progress(f"{m} read ({time.time() - t0:.1f} s)"))
    progress(f"{moved / 2**30:.2f} GiB read into this rank's shard; saving torch_dist to {out}")
    save_model_checkpoint(model, save_dir, "release")
    if dist.get_rank() == 0:
        meta = {"source": str(Path(hf_dir).resolve()), "format": "torch_dist", "model_args": flags,
                "conversion_parallel": par, "seconds": round(time.time() - t0, 1)}
        (save_dir / META).write_text(json.dumps(meta, indent=1, default=str))
        for name in ("config.json", "generation_config.json"):
            if (Path(hf_dir) / name).exists():
                shutil.copy(Path(hf_dir) / name, save_dir / f"hf_{name}")
        if carried:
            write_carried(save_dir, {n: reader.get(n) for n in carried})
            progress(f"carried unchanged (not part of the Megatron model): {summarize_names(carried)}")
    progress(f"done in {time.time() - t0:.1f} s")
    return save_dir


# --- tensors carried next to the checkpoint -----------------------------------------------------

CARRIED = "hf_carried.safetensors"


def summarize_names(names: list[str]) -> str:
    """``model.layers.3.*`` (12 tensors), ``model.visual.*`` (21 tensors): what a user reads."""
    groups: dict[str, int] = {}
    for n in names:
        parts = n.split(".")
        key = ".".join(parts[:3]) if parts[0] == "model" and parts[1] == "layers" else ".".join(parts[:2])
        groups[key] = groups.get(key, 0) + 1
    return ", ".join(f"{k}.* ({v} tensors)" for k, v in sorted(groups.items()))


def write_carried(save_dir: Path, tensors: dict) -> None:
    """The HF tensors the Megatron model does not hold (MTP layer, vision tower), byte for byte."""
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(Path(save_dir) / CARRIED), metadata={"format": "pt"})


def read_carried(load_dir: Path, hf_template: Path | None, names_needed: list[str] | None = None) -> dict:
    """Carried tensors of a converted checkpoint (next to it), else from the HF template."""
    from safetensors.torch import load_file

    for p in (Path(load_dir) / CARRIED, Path(load_dir).parent / CARRIED):
        if p.exists():
            return load_file(str(p))
    if hf_template is not None and names_needed:
        from slime.backends.megatron.model import HFReader

        r = HFReader(hf_template)
        return {n: r.get(n) for n in names_needed if n in r}
    return {}


# --- torch_dist -> HF -------------------------------------------------------------------------


def load_model_checkpoint(model, load_dir: str | Path, strict: bool = True) -> dict[str, Any]:
    """Load the ``model`` part of a torch_dist checkpoint into ``model`` (any parallel layout)."""
    from megatron.core import dist_checkpointing

    from slime.backends.megatron.model import unwrap

    m = unwrap(model)
    ckpt = checkpoint_subdir(load_dir)
    with torch_dist_io_without_cuda():
        state = dist_checkpointing.load({"model": m.sharded_state_dict()}, str(ckpt))
    missing, unexpected = m.load_state_dict(state["model"], strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if strict and (missing or unexpected):
        raise KeyError(f"checkpoint {ckpt} does not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return state


def torch_dist_to_hf(load_dir: str | Path, out_dir: str | Path, spec: Any, *, hf_template: str | Path | None = None,
                     shard_bytes: int = 5 * 2**30, dtype: str = "bfloat16", use_gpu: bool | None = None,
                     tp: int = 1, pp: int | None = None, ep: int = 1,
                     progress: Callable[[str], None] = _log) -> Path:
    """Write safetensors shards + index (+ config/tokenizer from ``hf_template``) to ``out_dir``."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from safetensors.torch import save_file

    from slime.backends.megatron import hf_mapping as hm
    from slime.backends.megatron.model import (
        bucketed,
        build_model,
        hf_config_from_flags,
        init_parallel,
        iter_hf_tensors,
    )
    from slime.backends.megatron.model_args import check_hf_config, load_flags

    flags = load_flags(spec)
    hm.require_mapped(flags)
    if hf_template is not None:
        check_hf_config(flags, hf_template)
    t0 = time.time()
    use_gpu = _want_gpu(use_gpu)
    par = conversion_layout(flags, tp=tp, pp=pp, ep=ep)
    _cpu_mode(use_gpu)
    init_parallel(par, backend=None if use_gpu else "gloo")
    from slime.backends.megatron import cpu as cpu_mode

    with cpu_mode.cuda_to_cpu():  # a no-op on GPUs
        model = build_model(flags, par, cpu=not use_gpu, init_weights=False)
    load_model_checkpoint(model, load_dir)
    progress(f"loaded {checkpoint_subdir(load_dir)} ({time.time() - t0:.1f} s); writing HF shards")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    pp_rank = ps.get_pipeline_model_parallel_rank()
    weight_map: dict[str, str] = {}
    # every rank takes part in the TP gathers; each tensor is written by one rank (model.writes_tensor):
    # TP rank 0 of the first replica of its stage, for a routed expert of its EP rank
    tensors = iter_hf_tensors(model, flags, dtype=getattr(torch, dtype), device="cpu", only_written=True)
    for i, bucket in enumerate(bucketed(tensors, shard_bytes)):
        fname = f"model-pp{pp_rank:03d}-r{dist.get_rank():05d}-{i:05d}.safetensors"
        save_file({n: t.contiguous() for n, t in bucket}, str(out_dir / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n, _ in bucket})
        progress(f"wrote {fname} ({len(bucket)} tensors)")
    d = hm.dims_from_flags(flags)
    if dist.get_rank() == 0:
        template_names: list[str] = []
        if hf_template is not None:
            from slime.backends.megatron.model import HFReader

            template_names = hm.carried_hf_names(list(HFReader(hf_template).weight_map), d)
        carried = read_carried(Path(load_dir), Path(hf_template) if hf_template else None, template_names)
        if carried:
            fname = "model-carried.safetensors"
            save_file({n: t.contiguous() for n, t in carried.items()}, str(out_dir / fname), metadata={"format": "pt"})
            weight_map.update({n: fname for n in carried})
            progress(f"carried unchanged: {summarize_names(sorted(carried))}")
    maps: list[dict[str, str]] = [None] * dist.get_world_size()  # type: ignore[list-item]
    dist.all_gather_object(maps, weight_map)
    if dist.get_rank() == 0:
        merged: dict[str, str] = {}
        for m in maps:
            twice = sorted(set(merged) & set(m))
            if twice:
                raise RuntimeError(f"export written twice: {twice[:5]}")
            merged.update(m)
        expected = set(hm.iter_hf_names(d)) | set(carried)
        if set(merged) != expected:
            raise RuntimeError(f"export incomplete: missing {sorted(expected - set(merged))[:5]}, "
                               f"extra {sorted(set(merged) - expected)[:5]}")
        total = sum((out_dir / f).stat().st_size for f in set(merged.values()))
        (out_dir / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": dict(sorted(merged.items()))}, indent=1))
        if hf_template is not None:
            for f in Path(hf_template).iterdir():
                if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
                    shutil.copy(f, out_dir / f.name)
        else:
            (out_dir / "config.json").write_text(json.dumps(hf_config_from_flags(flags), indent=1))
    dist.barrier()
    progress(f"done in {time.time() - t0:.1f} s -> {out_dir}")
    return out_dir


# --- CLIs -------------------------------------------------------------------------------------


def _common(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model-args", required=True,
                    help="the model spec: scripts/models/<model>.sh (its MODEL_ARGS array)")
    ap.add_argument("--nnodes", type=int, default=1, help="nodes taking part (torchrun is started for you)")
    ap.add_argument("--nproc-per-node", type=int, default=1, help="processes per node")
    ap.add_argument("--cpu", action="store_true",
                    help="build the model on the CPU over gloo even where GPUs exist (default: GPUs when present)")
    ap.add_argument("--tp", type=int, default=1, help="conversion tensor parallelism (default 1; loads reshard anyway)")
    ap.add_argument("--ep", type=int, default=1, help="conversion expert parallelism (default 1; loads reshard anyway)")


def main_hf_to_torch_dist(argv: Sequence[str] | None = None, script: str | None = None) -> int:
    ap = argparse.ArgumentParser(prog="convert_hf_to_torch_dist (megatron)",
                                 description="HF safetensors -> Megatron torch_dist, checked against the model spec first")
    ap.add_argument("--hf-checkpoint", required=True)
    ap.add_argument("--save", required=True, help="output dir (gets release/ and Megatron's tracker file)")
    ap.add_argument("--pp", type=int, default=None, help="conversion pipeline stages (default: all ranks)")
    _common(ap)
    argv = list(sys.argv[1:] if argv is None else argv)
    a = ap.parse_args(argv)
    from slime.backends.megatron.hf_mapping import ModelArgsError, require_mapped
    from slime.backends.megatron.model_args import ConfigMismatchError, check_hf_config, load_flags

    try:  # refuse a mismatch, or an architecture not mapped yet, before torchrun, process groups or weights
        check_hf_config(load_flags(a.model_args), a.hf_checkpoint)
        require_mapped(load_flags(a.model_args))
        conversion_layout(load_flags(a.model_args), tp=a.tp, pp=a.pp, ep=a.ep, world=a.nnodes * a.nproc_per_node)
    except (ConfigMismatchError, ModelArgsError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rc = maybe_launch_torchrun(argv, a.nnodes, a.nproc_per_node, script or sys.argv[0])
    if rc is not None:
        return rc
    hf_to_torch_dist(a.hf_checkpoint, a.save, a.model_args, pp=a.pp, tp=a.tp, ep=a.ep,
                     use_gpu=False if a.cpu else None)
    return 0


def main_torch_dist_to_hf(argv: Sequence[str] | None = None, script: str | None = None) -> int:
    ap = argparse.ArgumentParser(prog="convert_torch_dist_to_hf",
                                 description="Megatron torch_dist -> HF safetensors (bf16 by default)")
    ap.add_argument("--load", required=True, help="torch_dist dir (with the tracker file) or its iteration dir")
    ap.add_argument("--save", required=True, help="output HF dir")
    ap.add_argument("--hf-template", default=None,
                    help="HF dir whose config.json/tokenizer files are copied (and checked against the spec)")
    ap.add_argument("--shard-gb", type=float, default=5.0)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--pp", type=int, default=None, help="pipeline stages reading it (default: all ranks)")
    _common(ap)
    argv = list(sys.argv[1:] if argv is None else argv)
    a = ap.parse_args(argv)
    from slime.backends.megatron.model_args import ConfigMismatchError, check_hf_config, load_flags

    try:  # refuse before torchrun and process groups
        if a.hf_template:
            check_hf_config(load_flags(a.model_args), a.hf_template)
        conversion_layout(load_flags(a.model_args), tp=a.tp, pp=a.pp, ep=a.ep, world=a.nnodes * a.nproc_per_node)
    except (ConfigMismatchError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rc = maybe_launch_torchrun(argv, a.nnodes, a.nproc_per_node, script or sys.argv[0])
    if rc is not None:
        return rc
    torch_dist_to_hf(a.load, a.save, a.model_args, hf_template=a.hf_template,
                     shard_bytes=int(a.shard_gb * 2**30), dtype=a.dtype, use_gpu=False if a.cpu else None,
                     tp=a.tp, pp=a.pp, ep=a.ep)
    return 0
