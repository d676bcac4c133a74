"""One rank of the model-parallel CPU tests (test_model_parallel_megatron_cpu.py), run under
torchrun with gloo: build a tiny family from its reference checkpoint at the given layout, and
its weights from the HF checkpoint (``--hf``) or from a torch_dist checkpoint saved at any layout
(``--load``), optionally save them as torch_dist (``--save``), and write what rank 0 gathered:
the weights and one step's gradients under HF names, and the step's loss.

    python -m torch.distributed.run --nproc-per-node N tests/runtime/mp_worker.py \
        --hf HF | --load CKPT --spec SPEC --tp 2 --pp 1 --ep 1 [--sp] [--save CKPT] --out OUT.pt

The fakes it installs are listed in tests/runtime/megatron_cpu_fakes.py (install_multi_rank).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SEQ, BATCH = 16, 2


def _setup(a):
    import torch

    from tests.runtime.megatron_cpu_fakes import install_multi_rank

    install_multi_rank()
    from slime.backends.megatron.model import build_model, init_parallel
    from slime.model_spec import load_flags

    flags = dict(load_flags(a.spec))
    flags.pop("mtp_num_layers", None)  # the main model only: MTP has its own tests
    # no padded vocabulary rows at any TP here (256 = 64 x 4): megatron-core's own loss, used below,
    # counts them (the trainer's log-probs leave them out), so padding that changes with TP would
    # change the loss
    flags["make_vocab_size_divisible_by"] = "64"
    par = {"tensor_model_parallel_size": a.tp, "pipeline_model_parallel_size": a.pp,
           "expert_model_parallel_size": a.ep, "sequence_parallel": a.sp}
    if a.ep > 1 or "num_experts" in flags:
        par["expert_tensor_parallel_size"] = 1
    init_parallel(par, backend="gloo")
    model = build_model(flags, par, cpu=True, init_weights=False, params_dtype=torch.float32,
                        pipeline_dtype=torch.float32, bf16=False, moe_token_dispatcher_type="allgather",
                        variable_seq_lengths=False)
    return flags, par, model


def _step(model, flags) -> float:
    """One forward/backward through megatron-core's schedule; the loss on every rank."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.distributed.finalize_model_grads import _allreduce_non_tensor_model_parallel_grads
    from megatron.core.pipeline_parallel import get_forward_backward_func

    vocab = int(flags["vocab_size"])
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (BATCH, SEQ + 1), generator=g)
    tokens, labels = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    pos = torch.arange(SEQ)[None].expand(BATCH, -1)
    model.config.batch_p2p_sync = False  # gloo's batch_isend_irecv waits on its own

    def forward_step(_it, m):
        out = m(input_ids=tokens, position_ids=pos, attention_mask=None, labels=labels)

        def loss_func(per_token):
            loss = per_token.float().mean()
            return loss, {"loss": loss.detach()}

        return out, loss_func

    res = get_forward_backward_func()(forward_step_func=forward_step, data_iterator=iter([None]), model=[model],
                                      num_microbatches=1, seq_length=SEQ, micro_batch_size=BATCH,
                                      forward_only=False)
    model.ddp_config = DistributedDataParallelConfig()  # what finalize_model_grads reads of a DDP chunk
    _allreduce_non_tensor_model_parallel_grads([model], model.config)
    loss = torch.tensor([float(res[0]["loss"]) if res else 0.0])
    dist.all_reduce(loss, group=ps.get_pipeline_model_parallel_group())  # from the last stage
    return float(loss)


def _collect(model, flags, grads: bool) -> dict:
    """Every rank's exported tensors (gradients or weights) under HF names, on rank 0."""
    import torch.distributed as dist

    from slime.backends.megatron.model import iter_hf_tensors

    mine = {n: t.detach().clone() for n, t in iter_hf_tensors(model, flags, grads=grads, only_written=True)}
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, mine)
    out: dict = {}
    for p in parts:
        dup = set(out) & set(p)
        assert not dup, f"two ranks exported {sorted(dup)[:3]}"
        out.update(p)
    return out


def main() -> None:
    import torch
    import torch.distributed as dist

    ap = argparse.ArgumentParser()
    ap.add_argument("--hf")
    ap.add_argument("--spec", required=True)
    ap.add_argument("--load")
    ap.add_argument("--save")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--ep", type=int, default=1)
    ap.add_argument("--sp", action="store_true")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    flags, _, model = _setup(a)
    from slime.backends.megatron.convert import load_model_checkpoint, save_model_checkpoint
    from slime.backends.megatron.model import HFReader, load_hf_into

    if a.load:
        load_model_checkpoint(model, a.load)
    else:
        load_hf_into(model, flags, HFReader(a.hf).get)
    if a.save:
        save_model_checkpoint(model, a.save, iteration=1)
    weights = _collect(model, flags, grads=False)
    result = {"weights": weights, "loss": _step(model, flags)}
    result["grads"] = _collect(model, flags, grads=True)
    if dist.get_rank() == 0:
        torch.save(result, a.out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
