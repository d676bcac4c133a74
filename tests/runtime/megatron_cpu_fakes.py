"""The fakes that let megatron-core build these families on a CPU, in one place for the CPU tests
that need them (test_new_families_megatron_cpu.py, test_mtp_megatron_cpu.py). Each is named in
those tests' docstrings; none stands in for what a test checks."""
from __future__ import annotations


def install(gated_delta_net: bool) -> None:
    """`torch.cuda.current_device` returns "cpu" (GatedDeltaNet and the MTP block allocate on the
    current CUDA device); with `gated_delta_net`, fla's Triton `l2norm` becomes the same formula
    in torch."""
    import torch

    torch.cuda.current_device = lambda: "cpu"
    if gated_delta_net:
        import megatron.core.ssm.gated_delta_net.common as gdn_common

        def l2norm(x: torch.Tensor, dim: int = -1, eps: float = 1e-6) -> torch.Tensor:
            return x * torch.rsqrt((x * x).sum(dim, keepdim=True) + eps)

        gdn_common.l2norm = l2norm


def install_multi_rank() -> None:
    """The fakes megatron-core's multi-rank training path needs on a CPU (gloo), each named in the
    tests that use them (test_model_parallel_megatron_cpu.py):

    - fake: `torch.cuda.current_device` returns "cpu" (as in :func:`install`);
    - fake: megatron's CUDA RNG tracker is its public non-CUDA one
      (`initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)`);
    - fake: a `TorchFunctionMode` sends the pipeline schedules' hard-coded `device="cuda"`
      tensors to the CPU.
    """
    from megatron.core.tensor_parallel import random as mrandom
    from torch.overrides import TorchFunctionMode

    install(gated_delta_net=False)
    mrandom.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)

    class _CudaToCpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            dev = kwargs.get("device")
            if dev is not None and "cuda" in str(dev):
                kwargs["device"] = "cpu"
            return func(*args, **kwargs)

    _CudaToCpu().__enter__()  # for the rest of this (test) process
