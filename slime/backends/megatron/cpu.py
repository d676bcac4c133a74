"""megatron-core on a machine without CUDA: the Megatron backend's slow, exact CPU mode (tests, CI).

megatron-core 0.19 runs on the CPU with gloo (TP, PP's 1F1B schedule, EP with the allgather and
alltoall dispatchers), except for a few places that call CUDA unconditionally and the uneven
sequence-parallel gather/reduce-scatter of the alltoall dispatcher at TP > 1, which gloo lacks.
``apply()`` redirects exactly those, once per process, and only when
``torch.cuda.is_available()`` is False: on a GPU nothing here runs. ``cuda_to_cpu()`` is the one
context the trainer enters around megatron-core's schedules. Each patch says why it exists; none
changes a number (the CPU tests compare TP/PP/EP > 1 with one rank).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_applied = False


class _NoStream:
    """Stands for a CUDA stream: the alltoall MoE dispatcher opens side streams (and the torch_dist
    writer synchronises one) for compute/communication overlap; on the CPU everything is ordered."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, *args: Any) -> None:
        pass

    def wait_event(self, *args: Any) -> None:
        pass

    def record_event(self, *args: Any, **kwargs: Any) -> "_NoEvent":
        return _NoEvent()

    def synchronize(self) -> None:
        pass


class _NoEvent:
    """Stands for a CUDA event (the dispatcher records one to order its side stream)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, *args: Any) -> None:
        pass

    def wait(self, *args: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


def apply() -> bool:
    """Install the CPU redirections (idempotent). Returns True when they are active."""
    global _applied
    if torch.cuda.is_available():
        return False
    if _applied:
        return True
    # DDP's contiguous grad buffers, the MoE router, the p2p shape exchange of the pipeline
    # schedules, GatedDeltaNet and the MTP block allocate on ``torch.cuda.current_device()``.
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    # The alltoall dispatcher and the torch_dist writer use streams, events and synchronize for
    # overlap only; the CPU executes in order, so they are no-ops here.
    torch.cuda.Stream = _NoStream  # type: ignore[assignment,misc]
    torch.cuda.Event = _NoEvent  # type: ignore[assignment,misc]
    torch.cuda.current_stream = lambda *a, **k: _NoStream()  # type: ignore[assignment]
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()  # type: ignore[assignment]
    torch.cuda.synchronize = lambda *a, **k: None
    _patch_alltoall_splits()
    _patch_uneven_sequence_parallel()
    _patch_grad_clip()
    _applied = True
    return True


def _patch_alltoall_splits() -> None:
    """The alltoall dispatcher hands ``all_to_all_single`` its uneven split sizes as tensors or
    numpy arrays (converted late, to overlap a device sync); gloo accepts only lists of ints."""
    from megatron.core.tensor_parallel import mappings

    original = mappings.all_to_all

    def as_list(sizes):
        return sizes.tolist() if hasattr(sizes, "tolist") else sizes  # a tensor or a numpy array

    def all_to_all(group, input_, output_split_sizes_=None, input_split_sizes=None, use_nccl_stream=False):
        return original(group, input_, as_list(output_split_sizes_), as_list(input_split_sizes), use_nccl_stream)

    mappings.all_to_all = all_to_all
    try:  # the dispatcher imported the name before this ran
        from megatron.core.transformer.moe import token_dispatcher

        if getattr(token_dispatcher, "all_to_all", None) is original:
            token_dispatcher.all_to_all = all_to_all
    except ImportError:
        pass


def _patch_uneven_sequence_parallel() -> None:
    """With TP > 1 the alltoall dispatcher gathers (and in backward reduce-scatters) each TP rank's
    tokens along the sequence dimension in *uneven* parts (how many tokens each rank routed to this
    rank's experts). NCCL takes a list of differently sized tensors there; gloo refuses ("invalid
    tensor size"). On gloo the same results: gather parts padded to the largest and cut back;
    reduce-scatter as an all-reduce of the whole (with two ranks the same single addition) of which
    each rank keeps its part. Even splits keep megatron's own path."""
    import torch.distributed as dist
    from megatron.core.tensor_parallel import mappings

    gather, scatter = mappings._gather_along_first_dim, mappings._reduce_scatter_along_first_dim

    def _gather_along_first_dim(input_, group, output_split_sizes=None, use_global_buffer=False):
        if output_split_sizes is None or group.size() == 1:
            return gather(input_, group, output_split_sizes, use_global_buffer)
        sizes = [int(n) for n in output_split_sizes]
        padded = input_.new_zeros((max(sizes), *input_.shape[1:]))
        padded[: input_.shape[0]] = input_
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded.contiguous(), group=group)
        return torch.cat([part[:n] for part, n in zip(parts, sizes)], dim=0)

    def _reduce_scatter_along_first_dim(input_, group, input_split_sizes=None, use_global_buffer=False):
        if input_split_sizes is None or group.size() == 1:
            return scatter(input_, group, input_split_sizes, use_global_buffer)
        sizes = [int(n) for n in input_split_sizes]
        whole = input_.contiguous().clone()
        dist.all_reduce(whole, group=group)
        start = sum(sizes[: group.rank()])
        return whole[start:start + sizes[group.rank()]].clone()

    mappings._gather_along_first_dim = _gather_along_first_dim
    mappings._reduce_scatter_along_first_dim = _reduce_scatter_along_first_dim


def _patch_grad_clip() -> None:
    """Gradient clipping asserts ``param.grad.type() == 'torch.cuda.FloatTensor'`` before its
    multi-tensor scale (optimizer/clip_grads.py); the same scale, without the type check."""
    from megatron.core.optimizer import clip_grads, optimizer

    def clip_grad_by_total_norm_fp32(parameters, max_norm, total_norm, use_decoupled_grad=False):
        if torch.is_tensor(parameters):
            parameters = [parameters]
        attr = "decoupled_grad" if use_decoupled_grad else "grad"
        grads = [getattr(p, attr).detach() for p in parameters if getattr(p, attr, None) is not None]
        coeff = max_norm / (total_norm + 1.0e-6)
        if torch.is_tensor(coeff):
            coeff = coeff.clamp_max(1.0)
        elif coeff >= 1.0:
            return
        for g in grads:
            g.mul_(coeff)

    clip_grads.clip_grad_by_total_norm_fp32 = clip_grad_by_total_norm_fp32
    optimizer.clip_grad_by_total_norm_fp32 = clip_grad_by_total_norm_fp32


def init_rng() -> None:
    """Model-parallel RNG without CUDA: megatron's CUDA RNG tracker forks CUDA generator states
    (``model_parallel_cuda_manual_seed``), which do not exist here. Its public inference tracker
    forks nothing; dropout is 0 in RL training (model_args), so no draw depends on the fork."""
    from megatron.core.tensor_parallel.random import initialize_rng_tracker

    initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)


class _CudaToCpu(TorchFunctionMode):
    """megatron-core's schedules allocate their token counter with a literal ``device="cuda"``
    (pipeline_parallel/schedules.py); this sends every such factory call to the CPU. At PP > 1 with
    an MTP block (or tied embeddings) the model's constructor moves the last stage's copy of the
    word embeddings with ``Tensor.cuda()`` before summing it over the embedding group
    (language_module.py): on the CPU that tensor stays where it is."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.cuda:
            return args[0]
        kwargs = kwargs or {}
        dev = kwargs.get("device")
        if dev is not None and (dev == "cuda" or (isinstance(dev, torch.device) and dev.type == "cuda")):
            kwargs = {**kwargs, "device": "cpu"}
        return func(*args, **kwargs)


def cuda_to_cpu():
    """Context for a megatron-core schedule call or model build: a no-op where CUDA exists."""
    return _CudaToCpu() if _applied else contextlib.nullcontext()


def config_overrides() -> dict[str, Any]:
    """TransformerConfig settings of the CPU mode: float32 (the embedded CPU trainer's precision,
    and what makes TP/PP/EP > 1 comparable with one rank to 1e-5), and no ``torch.cuda.synchronize``
    between batched pipeline sends (``batch_p2p_sync``)."""
    if torch.cuda.is_available():
        return {}
    return {"params_dtype": torch.float32, "pipeline_dtype": torch.float32, "bf16": False, "fp16": False,
            "batch_p2p_sync": False}
