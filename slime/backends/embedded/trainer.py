"""The embedded trainer: one HF causal LM per data-parallel rank, DDP over torch.distributed
(gloo on CPU, nccl on GPU), AdamW, gradient clipping, the shared loss of slime/training/loss.py.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist

from slime import estimators
from slime.config import BatchConfig, LossConfig, OptimConfig
from slime.data.train_data import TrainRecord, micro_batches, rank_shard, split_steps
from slime.hf.model import HFCausalLM, load_model, pick_device
from slime.hf.weights import named_weights
from slime.timeline import PhaseClock, trainer_metrics
from slime.training import lr_schedule
from slime.training.advantages import needs_token_advantages, sc_advantages, token_advantages
from slime.training.loss import (
    LossFnConfig,
    compute_total_loss,
    entropy_from_logits,
    from_runtime,
    gather_log_probs,
    step_denominator,
)

# train/* metrics that are not a share of the step's aggregate (they do not add over micro-batches).
NON_ADDITIVE = ("train/grad_norm", "train/lr")


@dataclass
class Padded:
    tokens: torch.Tensor  # [B, T] right-padded
    attention: torch.Tensor  # [B, T]
    loss_mask: torch.Tensor  # [B, T-1] float, aligned with shifted log-probs
    advantages: torch.Tensor  # [B], or [B, T-1] when records carry token advantages
    rollout_log_probs: torch.Tensor  # [B, T-1]


def pad_records(records: list[TrainRecord], pad_id: int, device: torch.device) -> Padded:
    b, t = len(records), max(len(r.tokens) for r in records)
    tokens = torch.full((b, t), pad_id, dtype=torch.long)
    attention = torch.zeros((b, t), dtype=torch.long)
    mask = torch.zeros((b, t - 1))
    rollout = torch.zeros((b, t - 1))
    for i, r in enumerate(records):
        tokens[i, :len(r.tokens)] = torch.tensor(r.tokens)
        attention[i, :len(r.tokens)] = 1
        # Response token j sits at position p + j; its log-prob at shifted index p + j - 1.
        lo, hi = r.prompt_len - 1, len(r.tokens) - 1
        mask[i, lo:hi] = torch.tensor(r.response_mask, dtype=torch.float)
        if r.rollout_log_probs:
            rollout[i, lo:hi] = torch.tensor(r.rollout_log_probs)
    adv = torch.tensor([r.advantage for r in records], dtype=torch.float)
    if any(r.token_advantages is not None for r in records):
        adv = adv.unsqueeze(-1).repeat(1, t - 1)
        for i, r in enumerate(records):
            if r.token_advantages is not None:
                adv[i, r.prompt_len - 1:len(r.tokens) - 1] = torch.tensor(r.token_advantages)
    return Padded(tokens.to(device), attention.to(device), mask.to(device), adv.to(device), rollout.to(device))


def loss_fn_config(loss: LossConfig) -> LossFnConfig:
    return from_runtime(loss)  # one rule for every backend (slime/training/loss.py)


class EmbeddedTrainer:
    def __init__(self, hf_checkpoint: str, weights: dict[str, torch.Tensor] | None,
                 ref_weights: dict[str, torch.Tensor] | None, optim: OptimConfig, loss: LossConfig,
                 batch: BatchConfig, rank: int = 0, world_size: int = 1, seed: int = 1234):
        torch.manual_seed(seed)  # same init on every rank; DDP also broadcasts rank 0's params
        self.rank, self.world_size = rank, world_size
        self.device = pick_device()
        self.loss_cfg, self.batch_cfg, self.optim_cfg = loss, batch, optim
        self.fn_cfg = loss_fn_config(loss)
        self.module = load_model(hf_checkpoint, weights, self.device).train()
        self.ref: HFCausalLM | None = None
        if loss.needs_ref:
            self.ref = load_model(hf_checkpoint, ref_weights, self.device).eval().requires_grad_(False)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(hf_checkpoint)
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
        self.model: torch.nn.Module = self.module
        if world_size > 1:
            self.model = torch.nn.parallel.DistributedDataParallel(self.module)
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=optim.lr,
                                           betas=(optim.adam_beta1, optim.adam_beta2),
                                           eps=optim.adam_eps, weight_decay=optim.weight_decay)
        self.lr_schedule = lr_schedule.from_optim(optim)
        self.steps_taken = 0  # optimizer steps so far (the LR schedule's clock; restored on resume)
        # Sub-phases of train() (slime/timeline.py); on a GPU each reading waits for queued kernels.
        self.clock = PhaseClock(torch.cuda.synchronize if self.device.type == "cuda" else None)

    def resume_lr_schedule(self) -> None:
        """After loading AdamW state (--load): continue the schedule at the saved step count."""
        steps = [int(st["step"]) for st in self.optimizer.state.values() if "step" in st]
        self.steps_taken = max(steps, default=0)

    # -- forward ---------------------------------------------------------------------------------
    def _logits(self, model: torch.nn.Module, p: Padded) -> torch.Tensor:
        return model(input_ids=p.tokens, attention_mask=p.attention).logits[:, :-1]

    @torch.no_grad()
    def log_probs(self, records: list[TrainRecord], use_ref: bool = False) -> list[list[float]]:
        """Response-token log-probs (at the rollout temperature) for each record."""
        model = self.ref if use_ref else self.module
        assert model is not None  # use_ref: the loss needs the reference, so it was loaded
        p = pad_records(records, self.pad_id, self.device)
        lp = gather_log_probs(self._logits(model, p), p.tokens[:, 1:], self.loss_cfg.temperature)
        return [lp[i, r.prompt_len - 1:len(r.tokens) - 1].tolist() for i, r in enumerate(records)]

    # -- one rollout's training ------------------------------------------------------------------
    def train(self, records: list[TrainRecord], num_steps: int) -> dict[str, float]:
        """num_steps optimizer steps over this rollout's records (all ranks get all records and
        take their shard). Old log-probs are the trainer's own, computed before the first step
        (or the engine's with --use-rollout-logprobs). Each step's loss is aggregated over the
        step's whole batch (slime/training/loss.py): micro-batching and ranks do not change it."""
        self.clock.reset()
        cap = self.batch_cfg.max_tokens_per_gpu if self.batch_cfg.use_dynamic_batch_size else None
        plan = []
        with self.clock.phase("packing"):
            for step in split_steps(records, num_steps):
                shard = rank_shard(step, self.rank, self.world_size, self.batch_cfg.balance_data)
                denom = step_denominator([r.response_mask for r in step], self.fn_cfg.agg,
                                         self.fn_cfg.max_response_len)
                plan.append((micro_batches(shard, self.batch_cfg.micro_batch_size, cap), denom))
        # The PPO "old" policy is the one that existed before this rollout's first update.
        all_olds = [[self._old(mb) for mb in mbs] for mbs, _ in plan]
        if self.loss_cfg.use_sc:
            self._set_sc_advantages(records, plan, all_olds)
        self._set_token_advantages(plan, all_olds)
        sums: dict[str, float] = {}
        for (mbs, denom), olds in zip(plan, all_olds):
            self.optimizer.zero_grad(set_to_none=True)
            metrics = self.accumulate_grads(mbs, olds, denom)
            with self.clock.phase("train_optimizer"):
                metrics["train/grad_norm"] = float(
                    torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.optim_cfg.clip_grad))
                metrics["train/lr"] = self._set_lr()
                self.optimizer.step()
            self.steps_taken += 1
            for key, v in metrics.items():
                sums[key] = sums.get(key, 0.0) + v
        out = self._reduce_over_ranks({k: v / max(len(plan), 1) for k, v in sums.items()})
        return {**out, **trainer_metrics(self.clock)}  # this rank's times: not summed over ranks

    def accumulate_grads(self, mbs: list[list[TrainRecord]], olds: list, denominator: float) -> dict[str, float]:
        """Backward over one step's micro-batches (this rank's): each adds its share of the step's
        loss, scaled by the world size because DDP averages gradients over ranks."""
        sums: dict[str, float] = {}
        for k, (mb, (old, ref)) in enumerate(zip(mbs, olds)):
            last = k == len(mbs) - 1
            sync = contextlib.nullcontext() if last or self.world_size == 1 \
                else cast(torch.nn.parallel.DistributedDataParallel, self.model).no_sync()
            with sync, self.clock.phase("train_fwd_bwd"):
                loss, metrics = self._micro_loss(mb, old, ref, denominator)
                (loss * self.world_size).backward()
            for key, v in metrics.items():
                sums[key] = sums.get(key, 0.0) + v
        return sums

    def _set_lr(self) -> float:
        lr = self.lr_schedule(self.steps_taken)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def _set_sc_advantages(self, records: list[TrainRecord], plan: list, all_olds: list) -> None:
        """--use-sc: each record's advantage becomes its centred importance-weighted score
        (slime/training/advantages.py), from this rank's old log-probs and the group sums of all ranks."""
        recs, olds = [], []
        for (mbs, _), mb_olds in zip(plan, all_olds):
            for mb, (old, _ref) in zip(mbs, mb_olds):
                for i, r in enumerate(mb):
                    recs.append(r)
                    olds.append(old[i, r.prompt_len - 1:len(r.tokens) - 1].tolist())
        num_groups = 1 + max(r.group for r in records)
        values = sc_advantages([r.reward for r in recs], [r.group for r in recs], num_groups,
                               [r.response_mask for r in recs], olds, [r.rollout_log_probs for r in recs],
                               self.loss_cfg.tis_clip, self._all_reduce_sum_list)
        for r, v in zip(recs, values):
            r.advantage = v

    def _set_token_advantages(self, plan: list, all_olds: list) -> None:
        """KL in the reward / --normalize-advantages (slime/training/advantages.py), per token."""
        loss = self.loss_cfg
        if estimators.of(loss).needs_critic:  # GAE needs the critic: the runtime set them (slime/ray/runtime.py)
            if any(r.token_advantages is None for mbs, _ in plan for mb in mbs for r in mb):
                raise ValueError(f"--advantage-estimator {loss.advantage_estimator}: records reached the trainer "
                                 "without their GAE advantages (the runtime computes them from the critic's values "
                                 "first)")
            return
        if not needs_token_advantages(loss.advantage_estimator, loss.kl_coef, loss.normalize_advantages):
            return
        recs: list[TrainRecord] = []
        olds: list[list[float]] = []
        refs: list[Any] = []  # a list of floats per record (or None each, without a reference model)
        for (mbs, _), mb_olds in zip(plan, all_olds):
            for mb, (old, ref) in zip(mbs, mb_olds):
                for i, r in enumerate(mb):
                    lo, hi = r.prompt_len - 1, len(r.tokens) - 1
                    recs.append(r)
                    olds.append(old[i, lo:hi].tolist())
                    refs.append(ref[i, lo:hi].tolist() if ref is not None else None)
        values = token_advantages([r.advantage for r in recs], [r.response_mask for r in recs], olds,
                                  refs if self.ref is not None else None, loss.advantage_estimator, loss.kl_coef,
                                  loss.kl_loss_type, loss.normalize_advantages, self._all_reduce_sum_list)
        for r, v in zip(recs, values):
            r.token_advantages = v

    def _old(self, mb: list[TrainRecord]) -> tuple[torch.Tensor, torch.Tensor | None]:
        with self.clock.phase("packing"):
            p = pad_records(mb, self.pad_id, self.device)
        with torch.no_grad():
            if self.loss_cfg.use_rollout_logprobs:
                old = p.rollout_log_probs
            else:
                with self.clock.phase("old_log_probs"):
                    old = gather_log_probs(self._logits(self.module, p), p.tokens[:, 1:], self.loss_cfg.temperature)
            ref = None
            if self.ref is not None:
                with self.clock.phase("ref_log_probs"):
                    ref = gather_log_probs(self._logits(self.ref, p), p.tokens[:, 1:], self.loss_cfg.temperature)
        return old, ref

    def _micro_loss(self, mb: list[TrainRecord], old: torch.Tensor, ref: torch.Tensor | None,
                    denominator: float | None = None):
        with self.clock.phase("packing"):  # inside train_fwd_bwd: booked as packing only
            p = pad_records(mb, self.pad_id, self.device)
        logits = self._logits(self.model, p)
        lp = gather_log_probs(logits, p.tokens[:, 1:], self.loss_cfg.temperature)
        ent = entropy_from_logits(logits, self.loss_cfg.temperature)
        if self.loss_cfg.entropy_coef == 0:
            ent = ent.detach()
        return compute_total_loss(lp, old, p.advantages, p.loss_mask, self.fn_cfg,
                                  ref_log_probs=ref if self.loss_cfg.use_kl_loss else None,
                                  rollout_log_probs=p.rollout_log_probs, entropy=ent, denominator=denominator)

    def _all_reduce_sum_list(self, values: list[float]) -> list[float]:
        if self.world_size == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t)
        return t.tolist()

    def _reduce_over_ranks(self, metrics: dict[str, float]) -> dict[str, float]:
        """Shares of the step aggregates add up over ranks; grad norm and lr are the same on all."""
        if self.world_size == 1 or not metrics:
            return metrics
        keys = sorted(metrics)
        total = self._all_reduce_sum_list([metrics[k] for k in keys])
        return {k: v / self.world_size if k in NON_ADDITIVE else v for k, v in zip(keys, total)}

    # -- weights, offload, state ------------------------------------------------------------------
    def named_weights(self) -> dict[str, torch.Tensor]:
        return named_weights(self.module)

    def offload(self) -> None:
        """Colocated runs: free the accelerator for the engines (no-op on CPU)."""
        if self.device.type == "cuda":
            self.module.to("cpu")
            for state in self.optimizer.state.values():
                for k, v in state.items():
                    if torch.is_tensor(v):
                        state[k] = v.to("cpu")
            torch.cuda.empty_cache()

    def onload(self) -> None:
        if self.device.type == "cuda":
            self.module.to(self.device)
            for state in self.optimizer.state.values():
                for k, v in state.items():
                    if torch.is_tensor(v):
                        state[k] = v.to(self.device)


def init_process_group(rank: int, world_size: int, master_addr: str, master_port: int) -> None:
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://{master_addr}:{master_port}",
                                rank=rank, world_size=world_size)
