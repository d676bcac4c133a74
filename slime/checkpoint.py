"""Training checkpoints of the embedded backend (and the --ref-load format the converter writes).

Layout (Megatron-like, so users' habits carry over):
    SAVE/iter_0000005/model.safetensors   weights (names of model.named_parameters())
    SAVE/iter_0000005/optimizer.pt        AdamW state (absent in a converted --ref-load dir)
    SAVE/iter_0000005/state.json          next rollout id, data position, RNG, weight version,
                                          and a manifest (size + sha256) of the files above
    SAVE/latest_checkpointed_iteration.txt   "5" (or "release"), written LAST, atomically

A directory is loadable only through its marker, and only when every file matches the
manifest: a crash mid-save (no marker, or a truncated file) is refused with a message, never
loaded and never mistaken for a fresh start.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slime.refusals import declare

_R = declare("checkpoint", {
    "no_marker": ("flag", "root", "marker"),
    "no_marker_found": ("flag", "root", "marker", "found"),
    "state_missing": ("flag", "root", "marker", "iteration", "state"),
    "no_iteration": ("flag", "root", "name", "found", "iteration"),
    "file_missing": ("flag", "root", "file"),
    "file_changed": ("flag", "root", "file", "size", "expected"),
})

MARKER = "latest_checkpointed_iteration.txt"
FORMAT = "slime-embedded-v1"


class CheckpointError(RuntimeError):
    pass


def iter_dir(root: str | Path, iteration: int | str) -> Path:
    name = "release" if iteration == "release" else f"iter_{int(iteration):07d}"
    return Path(root) / name


def _digest(path: Path) -> dict[str, Any]:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return {"size": path.stat().st_size, "sha256": h.hexdigest()}


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(root: str | Path, iteration: int | str, weights: dict, optimizer_state: dict | None,
                    state: dict[str, Any]) -> Path:
    import torch
    from safetensors.torch import save_file

    root = Path(root)
    d = iter_dir(root, iteration)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(d / "model.safetensors"))
    files = ["model.safetensors"]
    if optimizer_state is not None:
        torch.save(optimizer_state, d / "optimizer.pt")
        files.append("optimizer.pt")
    manifest = {f: _digest(d / f) for f in files}
    atomic_write(d / "state.json", json.dumps({**state, "format": FORMAT, "iteration": iteration,
                                                 "files": manifest}, indent=1))
    atomic_write(root / MARKER, str(iteration))  # last: only now is the checkpoint visible
    return d


@dataclass
class Checkpoint:
    path: Path
    state: dict[str, Any]

    def weights(self):
        from safetensors.torch import load_file

        return load_file(str(self.path / "model.safetensors"))

    def optimizer_state(self):
        import torch

        p = self.path / "optimizer.pt"
        return torch.load(p, weights_only=False) if p.exists() else None


def resolve_checkpoint(root: str | Path, flag: str = "--load") -> Checkpoint:
    """The checkpoint the marker points at, verified against its manifest; else CheckpointError."""
    root = Path(root)
    marker = root / MARKER
    if not marker.exists():
        found = sorted(p.name for p in root.glob("iter_*")) if root.is_dir() else []
        if found:
            raise CheckpointError(_R("no_marker_found", flag=flag, root=str(root), marker=MARKER, found=str(found)))
        raise CheckpointError(_R("no_marker", flag=flag, root=str(root), marker=MARKER))
    it = marker.read_text().strip()
    d = iter_dir(root, it if it == "release" else int(it))
    state_path = d / "state.json"
    if not state_path.exists():
        raise CheckpointError(_R("state_missing", flag=flag, root=str(root), marker=MARKER, iteration=it,
                                 state=str(state_path)))
    return _verified(root, d, flag)


def resolve_iteration(root: str | Path, iteration: int | str, flag: str) -> Checkpoint:
    """The checkpoint of one iteration under root, whatever the marker says (a critic resumes at
    its policy's iteration, not at its own latest save), verified like resolve_checkpoint."""
    root = Path(root)
    d = iter_dir(root, iteration)
    if not (d / "state.json").exists():
        found = sorted(p.name for p in root.glob("iter_*")) if root.is_dir() else []
        raise CheckpointError(_R("no_iteration", flag=flag, root=str(root), name=d.name,
                                 found=str(found or "nothing"), iteration=iteration))
    return _verified(root, d, flag)


def _verified(root: Path, d: Path, flag: str) -> Checkpoint:
    state = json.loads((d / "state.json").read_text())
    for name, want in state.get("files", {}).items():
        f = d / name
        if not f.exists():
            raise CheckpointError(_R("file_missing", flag=flag, root=str(root), file=str(f)))
        got = _digest(f)
        if got != want:
            raise CheckpointError(_R("file_changed", flag=flag, root=str(root), file=str(f), size=got["size"],
                                 expected=want["size"]))
    return Checkpoint(d, state)


def encode_rng() -> dict[str, Any]:
    import base64
    import random

    import torch

    return {"torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii"),
            "python": repr(random.getstate())}


def restore_rng(rng: dict[str, Any]) -> None:
    import ast
    import base64
    import random

    import numpy as np
    import torch

    if "torch" in rng:
        raw = np.frombuffer(base64.b64decode(rng["torch"]), dtype=np.uint8).copy()
        torch.set_rng_state(torch.from_numpy(raw))
    if "python" in rng:
        random.setstate(ast.literal_eval(rng["python"]))


# -- the critic of --advantage-estimator ppo: its own checkpoint root, saved at the policy's iterations --


def critic_roots(model, critic) -> tuple[str | None, str | None]:
    """(load root, save root) of the critic: --critic-load / --critic-save, else the policy's
    --load / --save with "_critic" appended (the reference runtime's default)."""
    load = critic.load or (f"{str(model.load).rstrip('/')}_critic" if model.load else None)
    save = critic.save or (f"{str(model.save).rstrip('/')}_critic" if model.save else None)
    return load, save


def resolve_critic(model, critic) -> Checkpoint | None:
    """The critic checkpoint a run starts from, or None for a fresh critic.

    Resuming the policy (--load) resumes the critic at the SAME iteration: a critic trained on
    more or fewer rollouts than its policy would mis-estimate every advantage of the first update.
    Without --load, --critic-load (a critic trained elsewhere) is read at its latest iteration."""
    load, _ = critic_roots(model, critic)
    if load is None:
        return None
    if not model.load:
        return resolve_checkpoint(load, "--critic-load")
    policy = resolve_checkpoint(model.load, "--load")
    return resolve_iteration(load, policy.state.get("iteration", policy.path.name), "--critic-load")
