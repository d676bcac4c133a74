"""``--moe-grouped-gemm``'s experts (slime/backends/megatron/grouped_experts.py: ``torch._grouped_mm``)
against megatron-core's SequentialMLP on a real GPU in bf16, at a GLM-4.7-Flash-like expert shape
(hidden 2048, expert FFN 1536, 16 local experts, uneven counts, one expert without tokens): the
output and every gradient agree within bf16 tolerance, and neither is further from the fp32 result
than the other by more than a small factor. Also prints the time of one forward + backward of each
(the GEMM part of an MoE layer; bench/bench_megatron.py --moe-experts both gives the whole step).
tests/runtime/test_grouped_experts.py checks equality in fp32 on a CPU. Run with
tools/run_gpu_tests.sh on the GPU machine."""

from __future__ import annotations

import pytest
from gpu_helpers import record

pytestmark = pytest.mark.gpu

HIDDEN, FFN = 2048, 1536
COUNTS = [700, 0, 1300, 64, 900, 257, 1, 512, 2048, 333, 10, 1000, 640, 128, 1800, 300]


def _group():
    import torch.distributed as dist

    if not dist.is_initialized():
        from slime.backends.megatron.model import _free_port

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    return dist.group.WORLD


def _modules(dtype):
    import functools

    import torch
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer import TransformerConfig

    from slime.backends.megatron.grouped_experts import GroupedSequentialMLP

    g = _group()
    cfg = TransformerConfig(num_layers=1, hidden_size=HIDDEN, num_attention_heads=16, ffn_hidden_size=4 * HIDDEN,
                            moe_ffn_hidden_size=FFN, num_moe_experts=len(COUNTS), moe_router_topk=4,
                            gated_linear_unit=True, activation_func=torch.nn.functional.silu, add_bias_linear=False,
                            bias_activation_fusion=True, use_cpu_initialization=True, params_dtype=torch.float32,
                            gradient_accumulation_fusion=False)
    pgs = ProcessGroupCollection(ep=g, expt_tp=g, expt_dp=g, tp=g)
    spec = LocalSpecProvider().grouped_mlp_modules(True)
    assert isinstance(spec, functools.partial)
    torch.manual_seed(0)
    seq = spec(num_local_experts=len(COUNTS), config=cfg, pg_collection=pgs)
    grp = GroupedSequentialMLP(len(COUNTS), cfg, spec.keywords["submodules"], pg_collection=pgs)
    grp.load_state_dict(seq.state_dict())
    return seq.cuda().to(dtype), grp.cuda().to(dtype)


def _step(module, x, counts, probs, grad):
    x = x.clone().requires_grad_(True)
    out, _ = module(x, counts, probs)
    out.backward(grad)
    grads = {n: p.grad.float().clone() for n, p in module.named_parameters()}
    module.zero_grad(set_to_none=True)
    return out.float().detach(), x.grad.float(), grads


def _timed(module, x, counts, probs, grad, n=10):
    import torch

    for _ in range(3):
        _step(module, x, counts, probs, grad)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        xx = x.clone().requires_grad_(True)
        out, _ = module(xx, counts, probs)
        out.backward(grad)
    end.record()
    torch.cuda.synchronize()
    module.zero_grad(set_to_none=True)
    return start.elapsed_time(end) / n


def test_grouped_experts_match_sequential_mlp_in_bf16_on_gpu(gpu_ready):
    import torch

    t = sum(COUNTS)
    gen = torch.Generator().manual_seed(1)
    x32 = torch.randn(t, HIDDEN, generator=gen).cuda()
    probs = torch.rand(t, generator=gen).cuda()
    grad32 = torch.randn(t, HIDDEN, generator=gen).cuda()
    counts = torch.tensor(COUNTS, dtype=torch.int64)  # on the host, as the alltoall dispatcher leaves it

    ref_seq, _ = _modules(torch.float32)
    ref = _step(ref_seq, x32, counts, probs, grad32)
    del ref_seq
    seq, grp = _modules(torch.bfloat16)
    x, grad = x32.bfloat16(), grad32.bfloat16()
    s = _step(seq, x, counts, probs, grad)
    g = _step(grp, x, counts, probs, grad)

    def rel(a, b):
        return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()

    out_d, dx_d = rel(g[0], s[0]), rel(g[1], s[1])
    grad_d = max(rel(g[2][n], s[2][n]) for n in s[2] if s[2][n].abs().max() > 0)
    err_seq = max(rel(s[0], ref[0]), max(rel(s[2][n], ref[2][n]) for n in ref[2] if ref[2][n].abs().max() > 0))
    err_grp = max(rel(g[0], ref[0]), max(rel(g[2][n], ref[2][n]) for n in ref[2] if ref[2][n].abs().max() > 0))
    figures = {"out_rel": out_d, "dx_rel": dx_d, "grad_rel": grad_d, "seq_vs_fp32": err_seq, "grouped_vs_fp32": err_grp,
               "max_abs_out": (g[0] - s[0]).abs().max().item()}
    ms_seq = _timed(seq, x, counts, probs, grad)
    ms_grp = _timed(grp, x, counts, probs, grad)
    figures.update(ms_sequential=round(ms_seq, 3), ms_grouped=round(ms_grp, 3), speedup=round(ms_seq / ms_grp, 2),
                   gpu=torch.cuda.get_device_name())
    record("grouped_experts_bf16_vs_sequential", figures)
    assert out_d <= 2e-2 and dx_d <= 2e-2 and grad_d <= 2e-2, figures
    assert err_grp <= 2 * err_seq + 1e-3, figures
    empty = [n for n in g[2] if n.startswith("local_experts.1.")]
    assert empty and all(torch.count_nonzero(g[2][n]) == 0 for n in empty), "expert 1 received no token"
