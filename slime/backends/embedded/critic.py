"""The critic of --advantage-estimator ppo on the embedded backend (slime/backends/protocol.py:
CriticBackend): the policy's architecture without its LM head, plus a scalar value head, one copy
per data-parallel rank (torch DDP among the critic ranks), trained with the clipped value loss of
slime/training/loss.py on the same steps, shards and micro-batches as the policy.

The value at shifted position t (the layout of slime/training/loss.py) is read from the hidden
state that predicts token t + 1: the value of the state the policy was in when it chose that token.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, cast

import torch
import torch.distributed as dist

from slime.backends.embedded.trainer import Padded, init_process_group, pad_records
from slime.data.train_data import TrainRecord, micro_batches, rank_shard, split_steps
from slime.hf.model import HFCausalLM, load_model, pick_device
from slime.training import lr_schedule
from slime.training.loss import from_runtime, step_denominator, value_loss

# critic/* metrics that are not a share of the step's aggregate (they do not add over micro-batches).
NON_ADDITIVE = ("critic/grad_norm", "critic/lr")


class ValueModel(torch.nn.Module):
    """A causal LM's decoder (its LM head dropped) and a ``hidden -> 1`` value head."""

    def __init__(self, lm: HFCausalLM):
        super().__init__()
        self.backbone = lm.base_model
        self.value_head = torch.nn.Linear(lm.config.hidden_size, 1, device=lm.device, dtype=lm.dtype)
        # Zero: the first rollout's values are 0, so its advantages are the plain returns, not
        # noise from a random head; the head's gradient (hidden state x error) is not zero.
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.value_head(hidden).squeeze(-1).float()


def _response_tensor(records: list[TrainRecord], attr: str, width: int, device: torch.device) -> torch.Tensor:
    """Per-token lists of the records (values, returns) in the shifted [B, T-1] layout."""
    out = torch.zeros((len(records), width))
    for i, r in enumerate(records):
        got = getattr(r, attr)
        if got is None:
            raise ValueError(f"critic: a record carries no {attr}; the runtime sets them before training (ppo)")
        out[i, r.prompt_len - 1:len(r.tokens) - 1] = torch.tensor(got, dtype=torch.float)
    return out.to(device)


class EmbeddedCritic:
    def __init__(self, module: ValueModel, cfg, rank: int, world_size: int, pad_id: int, resume: Any = None):
        self.rank, self.world_size = rank, world_size
        self.device = pick_device()
        self.module = module.to(self.device).train()
        self.model: torch.nn.Module = self.module
        if world_size > 1:
            self.model = torch.nn.parallel.DistributedDataParallel(self.module)
        self.pad_id = pad_id
        from slime.backends.offload import DeviceOffloader

        self._offloader = DeviceOffloader()
        self.batch_cfg, self.loss_cfg = cfg.batch, cfg.loss
        self.agg_cfg = from_runtime(cfg.loss)  # the policy's aggregation: one definition of a step's mean
        o = cfg.optim
        lr = cfg.critic.lr if cfg.critic.lr is not None else o.lr
        self.optim_cfg = dataclasses.replace(o, lr=lr, min_lr=min(o.min_lr, lr))
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=lr, betas=(o.adam_beta1, o.adam_beta2),
                                           eps=o.adam_eps, weight_decay=o.weight_decay)
        self.lr_schedule = lr_schedule.from_optim(self.optim_cfg)  # the policy's schedule shape, --critic-lr peak
        self.steps_taken = 0
        if resume is not None:
            opt = resume.optimizer_state()
            if opt is not None:
                self.optimizer.load_state_dict(opt)
                self.steps_taken = max((int(st["step"]) for st in self.optimizer.state.values() if "step" in st),
                                       default=0)

    @classmethod
    def build(cls, cfg, rank: int, world_size: int, master: tuple[str, int]) -> "EmbeddedCritic":
        from transformers import AutoTokenizer

        from slime.checkpoint import resolve_checkpoint, resolve_critic
        from slime.hf.weights import load_into

        init_process_group(rank, world_size, master[0], master[1])
        torch.manual_seed(cfg.run.seed)
        m = cfg.model
        resume = resolve_critic(m, cfg.critic)
        # A fresh critic starts from the policy's initial weights (--ref-load, else --hf-checkpoint).
        init = resolve_checkpoint(m.ref_load, "--ref-load").weights() if (m.ref_load and resume is None) else None
        module = ValueModel(load_model(m.hf_checkpoint, init, torch.device("cpu")))
        if resume is not None:
            load_into(module, resume.weights())
        tok = AutoTokenizer.from_pretrained(m.hf_checkpoint)
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
        return cls(module, cfg, rank, world_size, pad_id, resume)

    # -- the protocol ----------------------------------------------------------------------------
    def _values(self, model: torch.nn.Module, p: Padded) -> torch.Tensor:
        return model(p.tokens, p.attention)[:, :-1]

    @torch.no_grad()
    def values(self, records: list[TrainRecord]) -> list[list[float]]:
        p = pad_records(records, self.pad_id, self.device)
        v = self._values(self.module, p)
        return [v[i, r.prompt_len - 1:len(r.tokens) - 1].tolist() for i, r in enumerate(records)]

    def train(self, records: list[TrainRecord], num_steps: int) -> dict[str, float]:
        """The same steps, shards and micro-batches as the policy's (slime/data/train_data.py), and
        the same aggregation, so a step's value loss does not depend on micro-batching or ranks."""
        cap = self.batch_cfg.max_tokens_per_gpu if self.batch_cfg.use_dynamic_batch_size else None
        sums: dict[str, float] = {}
        steps = split_steps(records, num_steps)
        for step in steps:
            shard = rank_shard(step, self.rank, self.world_size, self.batch_cfg.balance_data)
            denom = step_denominator([r.response_mask for r in step], self.agg_cfg.agg, self.agg_cfg.max_response_len)
            mbs = micro_batches(shard, self.batch_cfg.micro_batch_size, cap)
            self.optimizer.zero_grad(set_to_none=True)
            metrics: dict[str, float] = {}
            for k, mb in enumerate(mbs):
                sync = contextlib.nullcontext() if k == len(mbs) - 1 or self.world_size == 1 \
                    else cast(torch.nn.parallel.DistributedDataParallel, self.model).no_sync()
                with sync:
                    loss, m = self._micro_loss(mb, denom)
                    (loss * self.world_size).backward()  # DDP averages over ranks; the shares add up
                for key, v in m.items():
                    metrics[key] = metrics.get(key, 0.0) + v
            metrics["critic/grad_norm"] = float(
                torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.optim_cfg.clip_grad))
            lr = self.lr_schedule(self.steps_taken)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            metrics["critic/lr"] = lr
            self.optimizer.step()
            self.steps_taken += 1
            for key, v in metrics.items():
                sums[key] = sums.get(key, 0.0) + v
        return self._reduce_over_ranks({k: v / max(len(steps), 1) for k, v in sums.items()})

    def _micro_loss(self, mb: list[TrainRecord], denominator: float) -> tuple[torch.Tensor, dict[str, float]]:
        p = pad_records(mb, self.pad_id, self.device)
        width = p.loss_mask.shape[1]
        loss, m = value_loss(self._values(self.model, p), _response_tensor(mb, "values", width, self.device),
                             _response_tensor(mb, "returns", width, self.device), p.loss_mask,
                             self.loss_cfg.value_clip, self.agg_cfg.agg, denominator)
        return loss, {f"critic/{k}": v for k, v in m.items()}

    def _reduce_over_ranks(self, metrics: dict[str, float]) -> dict[str, float]:
        if self.world_size == 1 or not metrics:
            return metrics
        keys = sorted(metrics)
        t = torch.tensor([metrics[k] for k in keys], dtype=torch.float64)
        dist.all_reduce(t)
        return {k: v / self.world_size if k in NON_ADDITIVE else v for k, v in zip(keys, t.tolist())}

    def offload(self) -> dict[str, float]:
        """--offload-train: give the GPU back while the engines sample, like the trainer (no-op on CPU)."""
        from slime.backends.offload import memory_figures, optimizer_tensors

        if self.device.type != "cuda":
            return {}
        params = list(self.module.parameters())
        freed = self._offloader.offload([*params, *optimizer_tensors(self.optimizer)],
                                        [q.grad for q in params if q.grad is not None])
        return {"critic_offloaded_gib": freed / 2**30, **memory_figures("critic_offloaded")}

    def onload(self) -> dict[str, float]:
        if self.device.type != "cuda":
            return {}
        self._offloader.onload()
        return {}

    def named_weights(self) -> dict[str, torch.Tensor]:
        from slime.hf.weights import named_weights

        return named_weights(self.module)

    def save(self, root: str, iteration: int, state: dict[str, Any]) -> str:
        from slime.checkpoint import save_checkpoint

        if self.rank != 0:  # DDP ranks hold identical weights and optimizer state
            return ""
        return str(save_checkpoint(root, iteration, self.named_weights(), self.optimizer.state_dict(),
                                   {**state, "role": "critic"}))
