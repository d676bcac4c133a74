"""``--moe-grouped-gemm``'s experts (slime/backends/megatron/grouped_experts.py) compute what
megatron-core's ``SequentialMLP`` computes, on the CPU in float32: the same weights (the grouped
module *is* a SequentialMLP, so it is loaded with its state dict), the same routed tokens (sorted
by expert, uneven counts, one expert with none), the same output and the same gradient of every
parameter and of the input, within 1e-6 (bitwise where ``torch._grouped_mm`` runs, weight gradients
included: the CPU kernel computes each expert's ``dy_e.T @ x_e`` as megatron's linear does). And the
memory property: autograd keeps no stacked copy of the expert weights from forward to backward,
only what SequentialMLP keeps (``saved_tensors_hooks``).

Real parts only: megatron-core's SequentialMLP / MLP / Column- and RowParallelLinear on a one-rank
gloo group; ``torch._grouped_mm`` where the shapes are 16-byte aligned, and the batched stand-in
where they are not.
"""

from __future__ import annotations

import functools
import json

import pytest

pytest.importorskip("megatron.core")
torch = pytest.importorskip("torch")

COUNTS = [5, 0, 11, 1, 3]  # uneven, expert 1 receives no token


@pytest.fixture(scope="module")
def one_rank_group():
    import torch.distributed as dist

    if not dist.is_initialized():
        from slime.backends.megatron.model import _free_port

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    return dist.group.WORLD


def _config(hidden: int, ffn: int, **kw):
    from megatron.core.transformer import TransformerConfig

    base = dict(num_layers=1, hidden_size=hidden, num_attention_heads=4, ffn_hidden_size=4 * hidden,
                moe_ffn_hidden_size=ffn, num_moe_experts=len(COUNTS), moe_router_topk=2, gated_linear_unit=True,
                activation_func=torch.nn.functional.silu, add_bias_linear=False, bias_activation_fusion=False,
                use_cpu_initialization=True, params_dtype=torch.float32, gradient_accumulation_fusion=False)
    base.update(kw)
    return TransformerConfig(**base)


def _pair(config, group):
    """A SequentialMLP and a GroupedSequentialMLP holding the same weights."""
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.process_groups_config import ProcessGroupCollection

    from slime.backends.megatron.grouped_experts import GroupedSequentialMLP

    pgs = ProcessGroupCollection(ep=group, expt_tp=group, expt_dp=group, tp=group)
    spec = LocalSpecProvider().grouped_mlp_modules(True)
    assert isinstance(spec, functools.partial)
    torch.manual_seed(0)
    seq = spec(num_local_experts=len(COUNTS), config=config, pg_collection=pgs)
    grp = GroupedSequentialMLP(len(COUNTS), config, spec.keywords["submodules"], pg_collection=pgs)
    grp.load_state_dict(seq.state_dict())
    assert [n for n, _ in grp.named_parameters()] == [n for n, _ in seq.named_parameters()]
    return seq, grp


def _run(module, x, counts, probs, grad):
    x = x.clone().requires_grad_(True)
    out, bias = module(x, counts, probs)
    assert bias is None
    out.backward(grad)
    return out.detach(), x.grad, {n: p.grad.clone() for n, p in module.named_parameters()}


def _compare(config, group, hidden, counts=COUNTS, seed=1):
    seq, grp = _pair(config, group)
    g = torch.Generator().manual_seed(seed)
    t = sum(counts)
    x = torch.randn(t, hidden, generator=g)
    probs = torch.rand(t, generator=g)
    grad = torch.randn(t, hidden, generator=g)
    c = torch.tensor(counts, dtype=torch.int64)
    want, want_dx, want_g = _run(seq, x, c, probs, grad)
    got, got_dx, got_g = _run(grp, x, c, probs, grad)
    diffs = {"out": (got - want).abs().max().item(), "dx": (got_dx - want_dx).abs().max().item(),
             "grads": max((got_g[n] - want_g[n]).abs().max().item() for n in want_g)}
    print("[grouped-vs-sequential]", json.dumps(diffs), flush=True)
    assert got.shape == want.shape
    assert all(v <= 1e-6 for v in diffs.values()), diffs
    empty = [n for n in want_g if n.startswith("local_experts.1.")]
    assert empty and all(torch.count_nonzero(got_g[n]) == 0 for n in empty)  # the expert with no token
    return diffs


@pytest.mark.parametrize("fused", [False, True], ids=["glu", "fused-weighted-swiglu"])
def test_grouped_experts_equal_sequential_mlp_output_and_gradients(one_rank_group, fused, monkeypatch):
    from slime.backends.megatron import grouped_experts as ge

    calls = []
    real = torch._grouped_mm
    monkeypatch.setattr(torch, "_grouped_mm", lambda *a, **k: calls.append(1) or real(*a, **k))
    diffs = _compare(_config(64, 32, bias_activation_fusion=fused), one_rank_group, 64)
    # bitwise: per expert, the CPU _grouped_mm runs the very matmuls megatron's linear runs (forward
    # x_e @ w_e.T, input grad dy_e @ w_e, weight grad dy_e.T @ x_e), in the same order
    assert diffs == {"out": 0.0, "dx": 0.0, "grads": 0.0}, diffs
    # fc1 and fc2 once each for all experts in the forward; in the backward each takes one for the input
    # gradient and one (K-grouped) for all its experts' weight gradients
    assert len(calls) == 2 + 2 * 2
    assert ge.torch_grouped_mm_usable(torch.zeros(4, 64), torch.zeros(5, 64, 64))


def test_unaligned_shapes_take_the_batched_stand_in_and_still_equal_sequential_mlp(one_rank_group, monkeypatch):
    from slime.backends.megatron import grouped_experts as ge

    assert not ge.torch_grouped_mm_usable(torch.zeros(4, 6), torch.zeros(5, 10, 6))  # 24-byte rows
    monkeypatch.setattr(torch, "_grouped_mm", lambda *a, **k: pytest.fail("not aligned: must not be called"))
    _compare(_config(6, 5), one_rank_group, 6)


def test_probs_on_the_input_are_applied_as_sequential_mlp_applies_them(one_rank_group):
    _compare(_config(64, 32, moe_router_topk=1, moe_router_pre_softmax=True,
                     moe_apply_probs_on_input=True), one_rank_group, 64)


def test_all_tokens_on_one_expert_and_no_tokens_at_all(one_rank_group):
    cfg = _config(64, 32)
    _compare(cfg, one_rank_group, 64, counts=[0, 0, 9, 0, 0], seed=2)
    seq, grp = _pair(cfg, one_rank_group)
    x = torch.zeros(0, 64, requires_grad=True)
    out, _ = grp(x, torch.zeros(len(COUNTS), dtype=torch.int64), torch.zeros(0))
    assert out.shape == (0, 64)
    out.sum().backward()  # no rows: an empty input gradient, zero weight gradients
    assert x.grad is not None and x.grad.shape == (0, 64)
    assert all(p.grad is not None and not p.grad.any() for p in grp.parameters())


def test_the_spec_swap_touches_only_the_moe_layers_experts():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from slime.backends.megatron.grouped_experts import GroupedSequentialMLP, use_grouped_experts

    moe = get_gpt_layer_local_spec(num_experts=4, moe_grouped_gemm=True)
    dense = get_gpt_layer_local_spec(num_experts=None)
    shared = moe.submodules.mlp.keywords["submodules"].shared_experts
    assert use_grouped_experts([dense, moe, moe]) == 1  # the shared spec object is patched once
    sub = moe.submodules.mlp.keywords["submodules"]
    assert sub.experts.func is GroupedSequentialMLP and sub.shared_experts is shared
    assert use_grouped_experts([moe]) == 0


def _saved_for_backward(module, x, counts, probs):
    """What autograd keeps from one forward of ``module``: every tensor packed for backward (through
    ``saved_tensors_hooks``), and the bytes of the distinct storages among them that neither are the
    module's parameters nor the forward's own inputs (both live anyway): what the forward holds until
    backward."""
    x = x.clone().requires_grad_(True)
    alive = {t.untyped_storage().data_ptr() for t in (*module.parameters(), x, counts, probs)}
    saved: list[torch.Tensor] = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out, _ = module(x, counts, probs)
    held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in saved
            if t.untyped_storage().data_ptr() not in alive}
    out.sum().backward()  # and those saved tensors are all the backward needs
    return saved, sum(held.values())


@pytest.mark.parametrize("hidden,ffn", [(64, 32), (6, 5)], ids=["grouped-mm", "batched-stand-in"])
def test_grouped_experts_keep_no_stacked_weight_copy_for_backward(one_rank_group, hidden, ffn):
    """The forward stacks the experts' weights for the grouped matmul, but autograd must not keep
    that ``[E, out, in]`` copy until backward (one per MoE layer: tens of GB for a GLM-4.7-class
    model): it keeps what SequentialMLP keeps, the activations and the parameters themselves."""
    seq, grp = _pair(_config(hidden, ffn), one_rank_group)
    g = torch.Generator().manual_seed(3)
    t, n_exp = sum(COUNTS), len(COUNTS)
    x, probs = torch.randn(t, hidden, generator=g), torch.rand(t, generator=g)
    c = torch.tensor(COUNTS, dtype=torch.int64)
    seq_saved, seq_bytes = _saved_for_backward(seq, x, c, probs)
    grp_saved, grp_bytes = _saved_for_backward(grp, x, c, probs)
    print("[saved-for-backward]", json.dumps({"sequential_bytes": seq_bytes, "grouped_bytes": grp_bytes,
                                               "grouped_shapes": sorted({tuple(s.shape) for s in grp_saved})}),
          flush=True)

    params = {p.untyped_storage().data_ptr() for p in grp.parameters()}
    kept = [s for s in grp_saved if s.untyped_storage().data_ptr() not in params]
    # Besides the parameters (by reference, as each expert's linear keeps its weight), only rows of
    # the tokens ([T, ...]: input, fc1 output, activation) and the [E] counts / int32 offsets.
    odd = [tuple(s.shape) for s in kept if not (s.dim() >= 1 and s.shape[0] == t) and tuple(s.shape) != (n_exp,)]
    assert not odd, f"autograd keeps something else than activations and parameters: {odd}"
    assert params <= {s.untyped_storage().data_ptr() for s in grp_saved}
    # No more than SequentialMLP holds, but for the int32 offsets ([E], shared by fc1 and fc2):
    # SequentialMLP keeps its counts as Python ints (tokens_per_expert.tolist()).
    assert grp_bytes <= seq_bytes + 4 * n_exp, (grp_bytes, seq_bytes)
