"""The Megatron trainer: megatron-core GPTModel + DDP + (distributed) optimizer, packed micro-batches.

Same public surface as ``slime.backends.embedded.trainer.EmbeddedTrainer`` (``log_probs``,
``train``, ``named_weights``) plus ``export_hf_weights`` (HF-named buckets, what weight sync
sends), ``save`` / ``load`` (torch_dist). The loss is ``slime.training.loss.compute_total_loss``
and the records, steps, rank shards and packs come from ``slime.data.train_data`` /
``batch_builder.pack_samples``: nothing of the algorithm is re-implemented here.

Micro-batches are packed THD rows (one row holding several sequences, ``cu_seqlens`` marking
them) so no compute is spent on padding; with ``--use-dynamic-batch-size`` a pack holds at most
``--max-tokens-per-gpu`` tokens. Log-probs are taken at response positions only.
Pipeline parallelism goes through megatron-core's schedules (``forward_backward_func``); TP, EP,
DP and the distributed optimizer through its process groups. CP needs ring attention (Transformer
Engine), which this build does not have: it is refused at start-up.
"""

from __future__ import annotations

import json
import time
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch
import torch.distributed as dist

from slime.backends.megatron import cpu as cpu_mode
from slime.backends.megatron import model as mm
from slime.backends.megatron.convert import checkpoint_subdir, load_model_checkpoint, write_tracker
from slime.backends.megatron.determinism import install_fixed_order_moe_combine
from slime.backends.megatron.model_args import (
    builds_mtp,
    check_hf_config,
    load_flags,
    optimizer_kwargs,
    parallel_kwargs,
)
from slime.backends.megatron.optimizer_resume import LAYOUT_FILE, LAYOUT_KEYS, optimizer_resume_refusal
from slime.backends.offload import HostBuffers
from slime.config import BatchConfig, LossConfig, ModelConfig, OptimConfig
from slime.data.train_data import TrainRecord, micro_batches, rank_shard, split_steps
from slime.model_spec import flag_bool, flag_int
from slime.profiling import CallProfiler
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

# megatron-core 0.19's default optimizer layout (fully_sharded_model_space) needs flattened
# ShardedTensors, which its own checkpointing now refuses; dp_reshardable is Megatron-LM's default.
# Model weights reshard freely on load; optimizer state resumes at the same data-parallel size.
OPTIM_CKPT_METADATA = {"distrib_optim_sharding_type": "dp_reshardable"}
def _cast_params(module: torch.nn.Module, dtype: torch.dtype) -> None:
    """Give every floating-point parameter the training dtype, as Megatron-LM's Float16Module does.

    Without Transformer Engine the local spec's norms are torch RMSNorm/LayerNorm, created in
    fp32 next to bf16 linears. megatron-core's DistributedOptimizer assumes one dtype per
    parameter group: it lists a group's optimizer params as [fp32 shards..., fp32 copies of bf16
    shards...] but indexes them (``model_param_group_index_map``) in model order, so with mixed
    dtypes the optimizer-state checkpoint pairs params with the wrong shards (torch_dist save
    asserted ``(torch.Size([512]), 2686976, 2687744)``), and the fp32 params are handed over as
    non-leaf views, which the CPU-offload optimizer refuses ("can't optimize a non-leaf Tensor").
    """
    if dtype not in (torch.bfloat16, torch.float16):
        return
    for p in module.parameters():
        if p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)


def loss_fn_config(loss: LossConfig) -> LossFnConfig:
    """Runtime LossConfig -> the loss function's config (same rule as the embedded trainer)."""
    return from_runtime(loss)


@dataclass
class Pack:
    """One packed micro-batch on the GPU."""

    records: list[TrainRecord]
    tokens: torch.Tensor  # [1, t] (t padded to a multiple of tp when sequence parallel)
    position_ids: torch.Tensor  # [1, t]
    packed: Any  # megatron PackedSeqParams
    logit_rows: torch.Tensor  # [n_resp] rows of the logits that predict response tokens
    targets: torch.Tensor  # [n_resp] the response tokens
    resp_lens: list[int]


def build_pack(records: list[TrainRecord], device: torch.device, pad_to: int = 1) -> Pack:
    from megatron.core.packed_seq_params import PackedSeqParams

    toks: list[int] = []
    pos: list[int] = []
    cu = [0]
    rows: list[int] = []
    targets: list[int] = []
    for r in records:
        start = len(toks)
        toks.extend(r.tokens)
        pos.extend(range(len(r.tokens)))
        cu.append(len(toks))
        # Response token j sits at start + prompt_len + j and is predicted by the row before it.
        rows.extend(range(start + r.prompt_len - 1, start + len(r.tokens) - 1))
        targets.extend(r.tokens[r.prompt_len:])
    extra = (-len(toks)) % pad_to
    if extra:  # a dummy sequence so the row splits evenly over TP ranks (sequence parallel)
        toks.extend([0] * extra)
        pos.extend(range(extra))
        cu.append(len(toks))
    cu_t = torch.tensor(cu, dtype=torch.int32, device=device)
    max_len = max(b - a for a, b in zip(cu[:-1], cu[1:]))
    packed = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu_t, cu_seqlens_kv=cu_t,
                             max_seqlen_q=max_len, max_seqlen_kv=max_len)
    return Pack(records, torch.tensor([toks], device=device), torch.tensor([pos], device=device), packed,
                torch.tensor(rows, dtype=torch.long, device=device), torch.tensor(targets, dtype=torch.long, device=device),
                [r.response_len for r in records])


def _pad_rows(flat: torch.Tensor, lens: list[int]) -> torch.Tensor:
    """Concatenated per-record values -> [B, max_len] (zeros after each record's end)."""
    out = flat.new_zeros(len(lens), max(lens) if lens else 0)
    off = 0
    for i, n in enumerate(lens):
        out[i, :n] = flat[off:off + n]
        off += n
    return out


def _rows_to_tensor(values: Sequence[Sequence[float]], device) -> torch.Tensor:
    width = max((len(v) for v in values), default=0)
    out = torch.zeros(len(values), width, device=device)
    for i, v in enumerate(values):
        if v:
            out[i, :len(v)] = torch.tensor(v, device=device)
    return out


class MegatronTrainer:
    def __init__(self, megatron: Mapping[str, Any], model: ModelConfig, optim: OptimConfig, loss: LossConfig,
                 batch: BatchConfig, seed: int = 1234, model_args: Any = None, attention: str = "sdpa"):
        """``megatron``: the Megatron pass-through flags (cfg.megatron, which holds MODEL_ARGS
        too); ``model_args``: a spec file / argv / dict that overrides the model flags."""
        self.megatron = dict(megatron)
        self.flags = {**self.megatron, **(load_flags(model_args) if model_args is not None else {})}
        self.model_cfg, self.optim_cfg, self.loss_cfg, self.batch_cfg = model, optim, loss, batch
        self.fn_cfg = loss_fn_config(loss)
        par = parallel_kwargs(self.flags)
        if par["context_parallel_size"] > 1:
            raise NotImplementedError("--context-parallel-size > 1 needs Transformer Engine's ring attention, "
                                      "which this Megatron build does not use; use TP/PP instead")
        hf = model.hf_checkpoint
        if hf:  # the HF names and config.json weight sync targets: refuse before allocating anything
            check_hf_config(self.flags, hf)
        # No CUDA: megatron-core's hard-coded CUDA calls go to the CPU (cpu.py), gloo, float32.
        on_cpu = cpu_mode.apply()
        mm.init_parallel(self.flags, seed=seed)
        if on_cpu:
            cpu_mode.init_rng()
        from megatron.core import parallel_state as ps
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

        self.ps = ps
        self.device = torch.device("cpu") if on_cpu else torch.device("cuda", torch.cuda.current_device())
        # the actor's, old and reference passes must sum each token's experts in one order (determinism.py)
        install_fixed_order_moe_combine()
        with cpu_mode.cuda_to_cpu():
            module = mm.build_model(self.flags, self.flags, attention=attention, cpu=on_cpu,
                                    **cpu_mode.config_overrides())
        # The MTP layer (the draft SGLang's EAGLE reads) trains on its own loss only with
        # --enable-mtp-training; otherwise it is frozen and skipped, and weight sync sends it unchanged.
        self.mtp_training = builds_mtp(self.flags) and flag_bool(self.flags, "enable_mtp_training")
        if not self.mtp_training:
            mm.freeze_mtp(module)
        self.config = module.config
        okw = optimizer_kwargs(self.flags, optim)
        if on_cpu:  # float32 throughout, as the model config above; the distributed optimizer
            # accepts torch.cuda.*Tensor parameters only (distrib_optimizer.py), so each rank keeps Adam whole
            okw.update(bf16=False, fp16=False, params_dtype="float32", use_distributed_optimizer=False)
        okw["params_dtype"] = mm.DTYPES[okw["params_dtype"]]
        self.opt_config = OptimizerConfig(**okw)
        _cast_params(module, okw["params_dtype"])
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=bool(self.flags.get("overlap_grad_reduce")),
            overlap_param_gather=bool(self.flags.get("overlap_param_gather")),
            use_distributed_optimizer=self.opt_config.use_distributed_optimizer)
        with cpu_mode.cuda_to_cpu():  # DDP's buffers and the optimizer's flags name "cuda" outright
            self.model = DistributedDataParallel(config=self.config, ddp_config=ddp_config, module=module)
            self.module = module
            self.optimizer = get_megatron_optimizer(self.opt_config, [self.model])
        wd = self.opt_config.weight_decay
        sched = lr_schedule.from_optim(optim)  # the same flags, read the same way as the embedded trainer
        self.scheduler = OptimizerParamScheduler(
            self.optimizer, init_lr=0.0, max_lr=optim.lr, min_lr=sched.min_lr,
            lr_warmup_steps=sched.warmup_steps, lr_decay_steps=max(sched.decay_steps, 1),
            lr_decay_style=sched.style, start_wd=wd, end_wd=wd, wd_incr_steps=1, wd_incr_style="constant")
        self.config.no_sync_func = self.model.no_sync
        self.config.finalize_model_grads_func = finalize_model_grads
        self.config.grad_scale_func = self.optimizer.scale_loss
        self.iteration = 0
        self.ref_state: dict[str, torch.Tensor] | None = None
        # Host buffers of weight snapshots (the actor's weights during a reference pass), kept by size
        # between steps as offload keeps its own (slime/backends/offload.py).
        self._host = HostBuffers()
        self._profiler = CallProfiler("megatron_train")
        # Sub-phases of train() (slime/timeline.py); each reading waits for the queued kernels.
        self.clock = PhaseClock(torch.cuda.synchronize if torch.cuda.is_available() else None)

        # Weights: --load (resume) > --ref-load > --hf-checkpoint (checked against the spec above).
        if model.load and Path(model.load, "latest_checkpointed_iteration.txt").exists():
            self.load(model.load)
        elif model.ref_load:
            load_model_checkpoint(self.model, model.ref_load)
        elif hf:
            mm.load_hf_into(self.model, self.flags, mm.HFReader(hf).get)
        if self.dp_size > 1:
            self.model.broadcast_params()
        self.optimizer.reload_model_params()  # fp32 main params from the loaded bf16 weights
        if loss.needs_ref:
            self.ref_state = self._snapshot()
            if model.ref_load and model.load and model.ref_load != model.load:
                actor = self._snapshot()
                load_model_checkpoint(self.model, model.ref_load)
                self._release(self.ref_state)
                self.ref_state = self._snapshot()
                self._restore(actor)
                self._release(actor)

    @classmethod
    def from_config(cls, cfg, **kw) -> "MegatronTrainer":
        return cls(cfg.megatron, cfg.model, cfg.optim, cfg.loss, cfg.batch, seed=cfg.run.seed, **kw)

    # -- parallel helpers ------------------------------------------------------------------------
    @property
    def dp_rank(self) -> int:
        return self.ps.get_data_parallel_rank()

    @property
    def dp_size(self) -> int:
        return self.ps.get_data_parallel_world_size()

    def _is_last_stage(self) -> bool:
        return self.ps.is_pipeline_last_stage(ignore_virtual=True)

    def _pad_to(self) -> int:
        tp = self.ps.get_tensor_model_parallel_world_size()
        return tp if self.config.sequence_parallel else 1

    @torch.no_grad()
    def _snapshot(self) -> dict[str, torch.Tensor]:
        """The parameters, copied to host buffers from `self._host`: pinned on a GPU, where pageable
        copies of a 3B model's weights took seconds each way (the reference pass makes three), and
        taken again, not made anew, once `_release` gave them back."""
        cuda = self.device.type == "cuda"
        out: dict[str, torch.Tensor] = {}
        for n, p in mm.unwrap(self.model).named_parameters():
            buf = self._host.take(p.numel() * p.element_size()).view(p.dtype).view(p.shape)
            buf.copy_(p.detach(), non_blocking=cuda)
            out[n] = buf
        if cuda:
            torch.cuda.synchronize()  # the buffers hold the weights before anyone reads them
        return out

    @torch.no_grad()
    def _restore(self, state: Mapping[str, torch.Tensor]) -> None:
        for n, p in mm.unwrap(self.model).named_parameters():
            p.copy_(state[n], non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize()  # `state`'s buffers may be refilled as soon as this returns

    def _release(self, state: Mapping[str, torch.Tensor]) -> None:
        """Give a snapshot's buffers back for the next one (no copy from them may be pending)."""
        for t in state.values():
            self._host.give(t.reshape(-1).view(torch.uint8))

    # -- log-probs from logits ----------------------------------------------------------------------
    def _response_log_probs(self, logits: torch.Tensor, pack: Pack, with_entropy: bool = False):
        """logits [1, t, V_local] -> (log-probs [n_resp] float32, entropy [n_resp] or None)."""
        vocab = flag_int(self.flags, "vocab_size")
        assert vocab is not None  # the spec requires it (slime.model_spec.spec_from_flags)
        rows = logits[0].index_select(0, pack.logit_rows)
        temp = self.loss_cfg.temperature
        if self.ps.get_tensor_model_parallel_world_size() == 1:
            rows = rows[:, :vocab]  # drop megatron's padded vocabulary rows
            lp = gather_log_probs(rows, pack.targets, temp)
            ent = entropy_from_logits(rows, temp, chunk_size=4096) if with_entropy else None
            return lp, ent
        # Vocab-parallel logits: megatron's cross entropy is the TP-aware log-softmax.
        from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

        tp_rank = self.ps.get_tensor_model_parallel_rank()
        local = rows.shape[-1]
        lo = tp_rank * local
        scaled = rows.float() / temp
        if lo + local > vocab:  # mask the padded tail of the vocabulary
            col = torch.arange(lo, lo + local, device=rows.device)
            scaled = scaled.masked_fill(col >= vocab, float("-inf"))
        lp = -vocab_parallel_cross_entropy(scaled.unsqueeze(1), pack.targets.unsqueeze(1)).squeeze(1)
        return lp, None

    # -- schedules ---------------------------------------------------------------------------------
    def _run(self, packs: list[Pack], loss_func, forward_only: bool) -> list[Any]:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        def forward_step(data_iterator, model):
            pack = next(data_iterator)
            out = model(pack.tokens, pack.position_ids, None, packed_seq_params=pack.packed)
            return out, partial(loss_func, pack)

        fwd_bwd = get_forward_backward_func()
        with nullcontext() if self.mtp_training and not forward_only else mm.mtp_skipped(self.model), \
                cpu_mode.cuda_to_cpu():
            return fwd_bwd(forward_step_func=forward_step, data_iterator=iter(packs), model=[self.model],
                           num_microbatches=len(packs), seq_length=max(p.tokens.shape[1] for p in packs),
                           micro_batch_size=1, forward_only=forward_only)

    def _mtp_metrics(self, n_mb: int) -> dict[str, float]:
        """megatron-core's MTP loss and next-next-token accuracy of the step just run (its tracker,
        summed over micro-batches), as this DP rank's share of the mean; the tracker is reset."""
        from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

        tracker = MTPLossLoggingHelper.tracker
        if not self.mtp_training or "loss_values" not in tracker:
            return {}
        loss = float(tracker["loss_values"].mean()) / max(n_mb, 1)
        total = float(tracker["total_values"].sum())
        acc = float(tracker["correct_values"].sum()) / total if total else 0.0
        MTPLossLoggingHelper.clean_metrics_in_tracker()
        return {"train/mtp_loss": loss / self.dp_size, "train/mtp_accuracy": acc / self.dp_size}

    def _packs(self, records: list[TrainRecord]) -> list[Pack]:
        cap = self.batch_cfg.max_tokens_per_gpu if self.batch_cfg.use_dynamic_batch_size else None
        with self.clock.phase("packing"):
            return [build_pack(mb, self.device, self._pad_to())
                    for mb in micro_batches(records, self.batch_cfg.micro_batch_size, cap)]

    def _from_last_stage(self, obj: Any) -> Any:
        """Share a Python object computed on the last pipeline stage with the whole PP group."""
        pp = self.ps.get_pipeline_model_parallel_world_size()
        if pp == 1:
            return obj
        group = self.ps.get_pipeline_model_parallel_group()
        src = dist.get_global_rank(group, pp - 1)
        box = [obj]
        dist.broadcast_object_list(box, src=src, group=group)
        return box[0]

    # -- public API --------------------------------------------------------------------------------
    @torch.no_grad()
    def log_probs(self, records: list[TrainRecord], use_ref: bool = False) -> list[list[float]]:
        """Response-token log-probs at the rollout temperature, one list per record (every rank
        passes the same records; each computes them; no DP split here)."""
        if use_ref and self.ref_state is None:
            raise ValueError("no reference weights: enable --use-kl-loss (and --ref-load)")
        with self.clock.phase("ref_log_probs" if use_ref else "old_log_probs"):  # packing inside: its own phase
            return self._log_probs(records, use_ref)

    def _log_probs(self, records: list[TrainRecord], use_ref: bool) -> list[list[float]]:
        self.model.eval()
        backup = None
        if use_ref:
            backup = self._snapshot()
            assert self.ref_state is not None  # log_probs() refused use_ref without one
            self._restore(self.ref_state)
        try:
            out: list[list[float]] = []

            def collect(pack: Pack, logits: torch.Tensor):
                lp, _ = self._response_log_probs(logits, pack)
                vals = lp.float().cpu().split(pack.resp_lens)
                out.extend(v.tolist() for v in vals)
                return logits.new_zeros(()), {}

            self._run(self._packs(records), collect, forward_only=True)
        finally:
            if backup is not None:
                self._restore(backup)
                self._release(backup)
            self.model.train()
        return self._from_last_stage(out if self._is_last_stage() else None)

    def train(self, records: list[TrainRecord], num_steps: int) -> dict[str, float]:
        """``num_steps`` optimizer steps over this rollout's records (same contract as the
        embedded trainer: old log-probs are taken before the first update)."""
        with self._profiler(dist.get_rank() if dist.is_initialized() else 0):  # slime/profiling.py (unset: nothing)
            return self._train(records, num_steps)

    def _train(self, records: list[TrainRecord], num_steps: int) -> dict[str, float]:
        t0 = time.time()
        self.clock.reset()
        # This DP rank's records per optimizer step. Old (and reference) log-probs are computed
        # before the first update, shard by shard with the packs training will use, so at the
        # first micro-batch the ratio is exactly 1.
        steps = split_steps(records, num_steps)
        plan = [rank_shard(step, self.dp_rank, self.dp_size, self.batch_cfg.balance_data) for step in steps]
        # The loss of a step is its share of the step's whole-batch aggregate (slime/training/loss.py).
        denoms = [step_denominator([r.response_mask for r in step], self.fn_cfg.agg, self.fn_cfg.max_response_len)
                  for step in steps]
        olds: dict[int, list[float]] | None = None if self.loss_cfg.use_rollout_logprobs else {}
        refs: dict[int, list[float]] | None = None if self.ref_state is None else {}
        for shard in plan:
            if olds is not None:
                olds.update(zip(map(id, shard), self.log_probs(shard)))
            if refs is not None:
                refs.update(zip(map(id, shard), self.log_probs(shard, use_ref=True)))
        lc = self.loss_cfg
        if lc.use_sc:  # centred importance-weighted scores (slime/training/advantages.py), group sums over DP
            mine = [r for shard in plan for r in shard]
            values = sc_advantages([r.reward for r in mine], [r.group for r in mine], 1 + max(r.group for r in records),
                                   [r.response_mask for r in mine],
                                   [olds[id(r)] if olds is not None else r.rollout_log_probs for r in mine],
                                   [r.rollout_log_probs for r in mine], lc.tis_clip, self._sum_over_dp)
            for r, v in zip(mine, values):
                r.advantage = v
        if needs_token_advantages(lc.advantage_estimator, lc.kl_coef, lc.normalize_advantages):
            mine = [r for shard in plan for r in shard]
            old_rows = [olds[id(r)] if olds is not None else r.rollout_log_probs for r in mine]
            per_token = token_advantages([r.advantage for r in mine], [r.response_mask for r in mine], old_rows,
                                         [refs[id(r)] for r in mine] if refs is not None else None,
                                         lc.advantage_estimator, lc.kl_coef, lc.kl_loss_type, lc.normalize_advantages,
                                         self._sum_over_dp)
            for r, rows in zip(mine, per_token):
                r.token_advantages = rows
        sums: dict[str, float] = {}
        count = 0
        for shard, denom in zip(plan, denoms):
            step_metrics = self.accumulate_grads(shard, denom, olds, refs)
            lr = float(self.optimizer.param_groups[0]["lr"])
            with self.clock.phase("train_optimizer"):
                with cpu_mode.cuda_to_cpu():
                    ok, grad_norm, _ = self.optimizer.step()
                self.scheduler.step(increment=1)
            self.iteration += 1
            for m in step_metrics:  # shares of the step's aggregates: they add up
                for k, v in m.items():
                    sums[k] = sums.get(k, 0.0) + v
            count += 1
            # Identical on every DP rank; pre-divided so that the sum over DP below restores it.
            if grad_norm is not None:
                sums["train/grad_norm"] = sums.get("train/grad_norm", 0.0) + float(grad_norm) / self.dp_size
            sums["train/lr"] = sums.get("train/lr", 0.0) + lr / self.dp_size
            if not ok:
                sums["train/skipped_steps"] = sums.get("train/skipped_steps", 0.0) + 1.0 / self.dp_size
        out = {k: v / max(count, 1) for k, v in sums.items()}
        out = self._sum_over_dp_metrics(out)
        out["perf/train_seconds"] = time.time() - t0
        return {**out, **trainer_metrics(self.clock)}  # this rank's times: not summed over ranks

    def accumulate_grads(self, shard: list[TrainRecord], denom: float, olds: dict[int, list[float]] | None,
                         refs: dict[int, list[float]] | None) -> list[dict[str, float]]:
        """Forward/backward of one step's packs (this DP rank's shard) into zeroed grad buffers:
        each pack adds its share of the step's loss (``denom`` from the whole step)."""
        packs = self._packs(shard)
        n_mb = len(packs)
        step_metrics: list[dict[str, float]] = []

        def loss_func(pack: Pack, logits: torch.Tensor):
            lp, ent = self._response_log_probs(logits, pack, with_entropy=self.loss_cfg.entropy_coef != 0)
            lp = _pad_rows(lp, pack.resp_lens)
            ent = _pad_rows(ent, pack.resp_lens) if ent is not None else None
            dev = lp.device
            mask = _rows_to_tensor([r.response_mask for r in pack.records], dev)
            adv = torch.tensor([r.advantage for r in pack.records], device=dev)
            if any(r.token_advantages is not None for r in pack.records):
                adv = _rows_to_tensor([r.token_advantages if r.token_advantages is not None
                                       else [r.advantage] * r.response_len for r in pack.records], dev)
            rollout = _rows_to_tensor([r.rollout_log_probs for r in pack.records], dev) \
                if all(len(r.rollout_log_probs) == r.response_len for r in pack.records) else None
            if olds is None and rollout is None:
                raise ValueError("--use-rollout-logprobs needs the engine's log-probs on every record")
            old = rollout if olds is None else _rows_to_tensor([olds[id(r)] for r in pack.records], dev)
            assert old is not None  # refused just above
            ref = _rows_to_tensor([refs[id(r)] for r in pack.records], dev) if refs is not None else None
            loss, metrics = compute_total_loss(lp, old, adv, mask, self.fn_cfg,
                                               ref_log_probs=ref if self.loss_cfg.use_kl_loss else None,
                                               rollout_log_probs=rollout, entropy=ent, denominator=denom)
            step_metrics.append(metrics)
            # `loss` is this pack's share of the step's loss. The schedule divides by the number
            # of micro-batches and DDP averages gradients over DP ranks: undo both.
            return loss * n_mb * self.dp_size, {}

        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        self.model.train()
        with self.clock.phase("train_fwd_bwd"):
            self._run(packs, loss_func, forward_only=False)
        mtp = self._mtp_metrics(n_mb)
        if mtp and step_metrics:
            step_metrics.append(mtp)
        return step_metrics

    def _sum_over_dp(self, values: list[float]) -> list[float]:
        if self.dp_size == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, group=self.ps.get_data_parallel_group())
        return t.tolist()

    def _sum_over_dp_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Every DP rank holds its share of each step aggregate (non-additive ones pre-divided)."""
        if dist.get_world_size() == 1:
            return metrics
        metrics = self._from_last_stage(metrics if self._is_last_stage() else None) or {}
        keys = sorted(metrics)
        if not keys:
            return metrics
        return dict(zip(keys, self._sum_over_dp([metrics[k] for k in keys])))

    # -- weights out -------------------------------------------------------------------------------
    def export_hf_weights(self, bucket_bytes: int = 512 * 2**20, dtype: torch.dtype | None = None
                          ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """The whole model's weights under HF names, TP-merged, in buckets of <= bucket_bytes, on
        global rank 0; every rank must iterate (collectives inside: export.py), the others get
        nothing. On the training device; weight sync broadcasts them or moves them to the CPU.
        ``dtype``: bf16 on GPUs (what the engines load); float32, the CPU mode's dtype, on CPU."""
        from slime.backends.megatron import hf_mapping as hm
        from slime.backends.megatron.export import gather_to_rank0, owner_rule

        if dtype is None:
            dtype = torch.float32 if self.device.type == "cpu" else torch.bfloat16
        local = mm.bucketed(mm.iter_hf_tensors(self.model, self.flags, dtype=dtype), bucket_bytes)
        # every tensor of the model, MTP included: rank 0 refuses an export that lacks one
        expected = set(hm.iter_hf_names(hm.dims_from_flags(self.flags)))
        return gather_to_rank0(local, owner_rule(), self.device, expected)

    def named_weights(self) -> dict[str, torch.Tensor]:
        """All HF-named weights on the CPU (the embedded trainer's hand-off form) on rank 0, {}
        on the other ranks; collective."""
        return {n: t.to("cpu") for bucket in self.export_hf_weights() for n, t in bucket}

    # -- checkpoints -------------------------------------------------------------------------------
    def save(self, save_dir: str | Path, iteration: int | None = None, with_optimizer: bool | None = None,
             tracker: bool = True) -> Path:
        """torch_dist checkpoint ``save_dir/iter_NNNNNNN`` + Megatron's tracker file (``tracker``
        False: the caller writes it, after its own files; slime/backends/megatron/backend.py)."""
        from megatron.core import dist_checkpointing

        it = self.iteration if iteration is None else iteration
        if with_optimizer is None:
            with_optimizer = not self.flags.get("no_save_optim")
        out = Path(save_dir) / f"iter_{it:07d}"
        if dist.get_rank() == 0:
            out.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        model_sd = mm.unwrap(self.model).sharded_state_dict()
        state: dict[str, Any] = {"model": model_sd, "iteration": it, "checkpoint_version": 3.0}
        if with_optimizer:
            state["optimizer"] = self.optimizer.sharded_state_dict(model_sd, metadata=OPTIM_CKPT_METADATA)
            state["opt_param_scheduler"] = self.scheduler.state_dict()
        dist_checkpointing.save(state, str(out))
        if dist.get_rank() == 0:
            (out / LAYOUT_FILE).write_text(json.dumps(self._layout()))
        dist.barrier()
        if tracker and dist.get_rank() == 0:
            write_tracker(save_dir, it)
        return out

    def _layout(self) -> dict[str, Any]:
        """The parallel layout the optimizer state is written at (LAYOUT_FILE)."""
        values = mm.current_layout()
        return {**dict(zip(LAYOUT_KEYS, values)), "dp": self.dp_size,
                "distributed_optimizer": bool(self.opt_config.use_distributed_optimizer),
                "optimizers": len(getattr(self.optimizer, "chained_optimizers", None) or [self.optimizer])}

    def _materialise_optimizer_state(self) -> None:
        """Give every parameter of a fresh optimizer an Adam state (zeros, step 0) before a load.

        Resuming builds a new trainer and loads into it before its first step. megatron-core's
        distributed optimizer (torch Adam, without Apex/TE) reads each parameter's ``step`` while it
        describes the state to load into, and a fresh optimizer has none: it asserts. Megatron-LM
        fills such slots with a dummy step; here they are zeros, which the load then overwrites."""
        for opt in getattr(self.optimizer, "chained_optimizers", None) or [self.optimizer]:
            inner = getattr(opt, "optimizer", None)
            if inner is None:
                continue
            for group in inner.param_groups:
                on_device = bool(group.get("fused") or group.get("capturable"))
                for p in group["params"]:
                    st = inner.state[p]
                    if "step" not in st:
                        st["step"] = torch.zeros((), dtype=torch.float32, device=p.device if on_device else "cpu")
                    st.setdefault("exp_avg", torch.zeros_like(p, memory_format=torch.preserve_format))
                    st.setdefault("exp_avg_sq", torch.zeros_like(p, memory_format=torch.preserve_format))

    def _restore_adam_step(self) -> None:
        """Adam's bias correction reads each parameter's ``step``. Loaded into a fresh optimizer, the
        moments come back but the step keeps the value the slots were given before the load (measured
        on the H200: 0 after 2 saved steps); one optimizer step per trainer iteration, so the
        iteration restores it."""
        step = float(self.iteration)
        for opt in getattr(self.optimizer, "chained_optimizers", None) or [self.optimizer]:
            inner = getattr(opt, "optimizer", None)
            for st in (inner.state.values() if inner is not None else ()):
                if "step" in st and torch.is_tensor(st["step"]):
                    st["step"].fill_(step)
                elif "step" in st:
                    st["step"] = step

    def load(self, load_dir: str | Path, with_optimizer: bool | None = None) -> None:
        from megatron.core import dist_checkpointing

        ckpt = checkpoint_subdir(load_dir)
        if with_optimizer is None:
            with_optimizer = not self.flags.get("no_load_optim") and ckpt.name != "release"
        model_sd = mm.unwrap(self.model).sharded_state_dict()
        request: dict[str, Any] = {"model": model_sd}
        if with_optimizer:
            record = ckpt / LAYOUT_FILE
            refusal = optimizer_resume_refusal(json.loads(record.read_text()) if record.exists() else None,
                                               self._layout())
            if refusal:
                raise ValueError(refusal)
            self._materialise_optimizer_state()
            request["optimizer"] = self.optimizer.sharded_state_dict(model_sd, is_loading=True,
                                                                     metadata=OPTIM_CKPT_METADATA)
        state = dist_checkpointing.load(request, str(ckpt))
        mm.unwrap(self.model).load_state_dict(state["model"], strict=False)
        if with_optimizer:
            self.optimizer.load_state_dict(state["optimizer"])
        else:
            self.optimizer.reload_model_params()
        it = state.get("iteration", 0)
        self.iteration = int(it) if isinstance(it, (int, float)) else 0
        if with_optimizer:
            self._restore_adam_step()
