"""The embedded trainer as a registry backend (slime/backends/protocol.py): HF model per DDP rank."""

from __future__ import annotations

from typing import Any, Iterator

import torch

from slime.backends.embedded.trainer import EmbeddedTrainer, init_process_group
from slime.backends.offload import DeviceOffloader, memory_figures, optimizer_tensors
from slime.hf.weights import bucketize


class EmbeddedBackend:
    def __init__(self, trainer: EmbeddedTrainer, resume_state: dict[str, Any]):
        self.trainer = trainer
        self.resume_state = resume_state
        self._offloader = DeviceOffloader()

    @classmethod
    def build(cls, cfg, rank: int, world_size: int, master: tuple[str, int]) -> "EmbeddedBackend":
        from slime.checkpoint import resolve_checkpoint, restore_rng

        init_process_group(rank, world_size, master[0], master[1])
        m, loss = cfg.model, cfg.loss
        weights_path = m.load or m.ref_load
        weights = resolve_checkpoint(weights_path, "--load" if m.load else "--ref-load").weights() \
            if weights_path else None
        # The reference of the KL loss and of the KL in the reward (--kl-coef) alike is --ref-load.
        ref = resolve_checkpoint(m.ref_load, "--ref-load").weights() if (m.ref_load and loss.needs_ref) else None
        trainer = EmbeddedTrainer(m.hf_checkpoint, weights, ref, cfg.optim, loss, cfg.batch, rank, world_size,
                                  cfg.run.seed)
        state: dict[str, Any] = {}
        if m.load:
            ckpt = resolve_checkpoint(m.load, "--load")
            opt = ckpt.optimizer_state()
            if opt is not None:
                trainer.optimizer.load_state_dict(opt)
            if rank == 0 and "rng" in ckpt.state:
                restore_rng(ckpt.state["rng"])
            state = ckpt.state
        return cls(trainer, state)

    # -- the protocol ----------------------------------------------------------------------------
    def log_probs(self, records: list, use_ref: bool = False) -> list[list[float]]:
        return self.trainer.log_probs(records, use_ref)

    def train(self, records: list, num_steps: int) -> dict[str, float]:
        return self.trainer.train(records, num_steps)

    def named_weights(self) -> dict[str, torch.Tensor]:
        return self.trainer.named_weights()

    def export_buckets(self, buffer_size: int, device: str = "cpu") -> Iterator[dict[str, torch.Tensor]]:
        if device == "cpu":
            yield from bucketize(self.trainer.named_weights(), buffer_size)
            return
        named = {n: p.detach().contiguous() for n, p in self.trainer.module.named_parameters()}
        yield from bucketize(named, buffer_size)

    def save(self, root: str, iteration: int, state: dict[str, Any]) -> str:
        from slime.checkpoint import encode_rng, save_checkpoint

        if self.trainer.rank != 0:  # DDP ranks hold identical weights and optimizer state
            return ""
        return str(save_checkpoint(root, iteration, self.trainer.named_weights(),
                                   self.trainer.optimizer.state_dict(), {**state, "rng": encode_rng()}))

    def load(self, path: str) -> None:
        from slime.checkpoint import resolve_checkpoint
        from slime.hf.weights import load_into

        ckpt = resolve_checkpoint(path, "--load")
        load_into(self.trainer.module, ckpt.weights())
        opt = ckpt.optimizer_state()
        if opt is not None:
            self.trainer.optimizer.load_state_dict(opt)

    def offload(self) -> dict[str, float]:
        if self.trainer.device.type != "cuda":
            return {}
        params = list(self.trainer.module.parameters())
        freed = self._offloader.offload([*params, *optimizer_tensors(self.trainer.optimizer)],
                                        [p.grad for p in params if p.grad is not None])
        return {"offloaded_gib": freed / 2**30, **memory_figures("offloaded")}

    def onload(self) -> dict[str, float]:
        if self.trainer.device.type != "cuda":
            return {}
        self._offloader.onload()
        return memory_figures("onloaded")

    def memory(self) -> dict[str, float]:
        return memory_figures("train") if self.trainer.device.type == "cuda" else {}
