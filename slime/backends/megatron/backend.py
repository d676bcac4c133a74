"""The Megatron trainer as a registry backend (slime/backends/protocol.py).

Each Ray trainer actor is one torch.distributed rank: the rendezvous is trainer rank 0's address
(taken from the placement), and megatron-core's TP/PP/EP/DP groups are formed over those ranks.
Checkpoints are torch_dist (Megatron's layout) plus slime's state.json (next rollout id, data
position, RNG), written before the tracker file so a half-written save is never loaded.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

import torch

from slime.backends.offload import DeviceOffloader, memory_figures, optimizer_tensors


class MegatronBackend:
    # Export and log-probs are collective (TP gathers, PP stages, EP experts): the runtime calls
    # every rank at once and takes rank 0's answer (slime/ray/actors.py, slime/sync/weight_sync.py).
    collective = True

    def __init__(self, trainer, resume_state: dict[str, Any]):
        self.trainer = trainer
        self.resume_state = resume_state
        self._offloader = DeviceOffloader()

    @classmethod
    def build(cls, cfg, rank: int, world_size: int, master: tuple[str, int]) -> "MegatronBackend":
        from slime.backends.megatron.trainer import MegatronTrainer
        from slime.checkpoint import MARKER, resolve_checkpoint, restore_rng

        # Ray gives each trainer actor its GPU(s) through CUDA_VISIBLE_DEVICES: local device 0.
        # Without CUDA the ranks join a gloo group on the CPU (slime/backends/megatron/cpu.py).
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR=master[0],
                          MASTER_PORT=str(master[1]), LOCAL_RANK="0")
        trainer = MegatronTrainer.from_config(cfg)
        state: dict[str, Any] = {}
        if cfg.model.load and (Path(cfg.model.load) / MARKER).exists():
            ckpt = resolve_checkpoint(cfg.model.load, "--load")
            state = ckpt.state
            if "rng" in state:
                restore_rng(state["rng"])
        return cls(trainer, state)

    # -- the protocol ----------------------------------------------------------------------------
    def log_probs(self, records: list, use_ref: bool = False) -> list[list[float]]:
        return self.trainer.log_probs(records, use_ref)

    def train(self, records: list, num_steps: int) -> dict[str, float]:
        out = self.trainer.train(records, num_steps)
        out["perf/train_flops"] = self._flops(records, num_steps)
        return out

    def _flops(self, records: list, num_steps: int) -> float:
        """Model FLOPs of this rollout's training on this rank: 6 N per token for forward+backward,
        2 N per token for each no-grad pass (old log-probs, and the reference when KL is on), plus
        attention (12 L h s per token, forward+backward). Megatron-LM's MFU convention."""
        n = sum(p.numel() for p in self.trainer.module.parameters())
        f = self.trainer.flags
        layers, hidden = int(f.get("num_layers", 0)), int(f.get("hidden_size", 0))
        dp = max(self.trainer.dp_size, 1)
        tokens = sum(len(r.tokens) for r in records) / dp
        seq2 = sum(len(r.tokens) ** 2 for r in records) / dp
        passes = 6 + 2 + (2 if self.trainer.ref_state is not None else 0)
        return float(passes * n * tokens + 2 * passes * layers * hidden * seq2)

    def named_weights(self) -> dict[str, torch.Tensor]:
        return self.trainer.named_weights()

    def export_buckets(self, buffer_size: int, device: str = "cpu") -> Iterator[dict[str, torch.Tensor]]:
        for bucket in self.trainer.export_hf_weights(bucket_bytes=buffer_size):
            if device == "cpu":
                yield {n: t.to("cpu") for n, t in bucket}
            else:
                yield {n: t.contiguous() for n, t in bucket}

    def save(self, root: str, iteration: int, state: dict[str, Any]) -> str:
        import torch.distributed as dist

        from slime.checkpoint import FORMAT, MARKER, atomic_write, encode_rng

        out = self.trainer.save(root, iteration, tracker=False)
        if dist.get_rank() == 0:
            atomic_write(out / "state.json", json.dumps({**state, "rng": encode_rng(), "format": FORMAT + "+torch_dist",
                                                          "iteration": iteration, "files": {}}, indent=1))
            atomic_write(Path(root) / MARKER, str(iteration))  # last: only now is the checkpoint visible
        dist.barrier()
        return str(out)

    def load(self, path: str) -> None:
        self.trainer.load(path)

    def _tensors(self):
        params = list(self.trainer.module.parameters())
        keep = [*params, *optimizer_tensors(self.trainer.optimizer)]
        drop = [g for g in (getattr(p, "main_grad", None) for p in params) if g is not None]
        drop += [p.grad for p in params if p.grad is not None]
        for buf in getattr(self.trainer.model, "buffers", []):  # DDP's contiguous param/grad buffers
            if getattr(buf, "param_data", None) is not None:
                keep.append(buf.param_data)
            if getattr(buf, "grad_data", None) is not None:
                drop.append(buf.grad_data)
        return keep, drop

    def offload(self) -> dict[str, float]:
        keep, drop = self._tensors()
        freed = self._offloader.offload(keep, drop)
        return {"offloaded_gib": freed / 2**30, **memory_figures("offloaded")}

    def onload(self) -> dict[str, float]:
        self._offloader.onload()
        return memory_figures("onloaded")

    def memory(self) -> dict[str, float]:
        return memory_figures("train")
