"""MoE experts as grouped GEMMs without Transformer Engine (``--moe-grouped-gemm``).

megatron-core's local spec builds the routed experts as ``SequentialMLP``: one ``MLP`` per local
expert, run in a Python loop (one fc1 GEMM, one activation and one fc2 GEMM per expert, a host sync
on ``tokens_per_expert.tolist()`` and a ``torch.cat``). Its grouped paths (``TEGroupedMLP``) need
Transformer Engine. :class:`GroupedSequentialMLP` computes the same thing with PyTorch's own grouped
matmul, ``torch._grouped_mm(x [T, in], w [E, in, out], offs=int32 cumsum of tokens per expert)``:
the whole fc1, the activation and the whole fc2 of every local expert in three calls.

Checkpoint and weight sync are untouched: it *is* a ``SequentialMLP`` (subclass), so the parameters
are still the local experts' own ``local_experts.{i}.linear_fc1.weight`` / ``linear_fc2.weight``
with their shapes, their sharded state dict (dist-checkpointing, resume), their HF names
(hf_mapping.py) and their export.

Memory: the grouped matmul needs the experts' weights as one ``[E, out, in]`` tensor, a copy
(``torch.stack``). :class:`_GroupedLinear` (an autograd Function taking the per-expert weights as
inputs) makes that copy inside its forward and drops it on return, and makes it again, transiently,
in its backward for the input gradient: autograd keeps only what each expert's ``nn.Linear`` in
``SequentialMLP`` keeps, the input rows and references to the parameters (plus the ``[E]`` int32
offsets), never the stack, so no extra copy of the local expert weights is held per MoE layer across
the forward (GLM-4.5/4.7-355B at EP 8: 20 local experts of 3 x 5120 x 1536 bf16 weights, 0.94 GB
per MoE layer, 89 of them). The weight gradients of
all experts come from one "K-grouped" ``_grouped_mm(dy.T [out, T], x [T, in], offs)`` =
``[E, out, in]`` and reach each expert's own parameter as views of it (megatron's DDP hooks see
them as before). At most one layer's stack is alive at a time, briefly.

Tokens arrive as the token dispatcher leaves them: permuted, sorted by local expert, with
``tokens_per_expert`` counts (a CPU tensor for the alltoall dispatcher) and the routing
probabilities, which are applied exactly where ``SequentialMLP`` applies them: on the input with
``moe_apply_probs_on_input`` (then ones), otherwise as ``MLP``'s ``per_token_scale`` after the
activation (the fused weighted SwiGLU when ``bias_activation_fusion`` is on).

``torch._grouped_mm`` (torch 2.13) runs on CUDA (bf16 is its fast path on Hopper) and on the CPU
(fp32 and bf16, autograd included), but only when every stride is a multiple of 16 bytes. Where it
is missing or a shape is not aligned (odd test shapes), :func:`grouped_linear` uses an equivalent
batched formulation (tokens scattered into a zero-padded ``[E, max_tokens, in]`` block, one
``torch.bmm``, gathered back; weight gradients as one ``bmm`` of padded blocks): still no
per-expert Python loop, more transient memory, used only there. It runs inside the same autograd
Function, so it keeps no stack (nor padded block) for backward either.

Cases this path does not cover run ``SequentialMLP``'s own forward: one local expert (already one
GEMM), expert biases (``add_bias_linear``), fp8/fp4, Transformer Engine activations and delayed
weight-gradient computation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from megatron.core.transformer.moe.experts import SequentialMLP

_ALIGN = 16  # bytes: torch._grouped_mm's stride requirement


def _aligned(*tensors: torch.Tensor) -> bool:
    for t in tensors:
        if t.data_ptr() % _ALIGN:
            return False
        es = t.element_size()
        if any((s * es) % _ALIGN for s, n in zip(t.stride(), t.shape) if s != 1 and n > 1):
            return False
    return True


def _usable(x: torch.Tensor, n_out: int, n_in: int, dtype: torch.dtype) -> bool:
    """Whether ``torch._grouped_mm`` takes ``x [T, in]`` against a (contiguous) stack of
    ``[out, in]`` weights of ``dtype``: forward ``y = x @ w.T``, backward ``dx = dy @ w`` and
    ``dw = dy.T @ x`` (``dy`` made contiguous and aligned there), so ``in`` and ``out`` rows both
    16-byte aligned."""
    if not hasattr(torch, "_grouped_mm") or x.dim() != 2 or x.dtype != dtype or x.shape[1] != n_in:
        return False
    es = x.element_size()
    return x.is_contiguous() and (n_out * es) % _ALIGN == 0 and (n_in * es) % _ALIGN == 0 and _aligned(x)


def torch_grouped_mm_usable(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``torch._grouped_mm`` takes ``x [T, in]`` against ``w [E, out, in]`` (the output's
    rows, ``out`` wide, must be aligned too)."""
    if w.dim() != 3 or not w.is_contiguous() or not _aligned(w):
        return False
    return _usable(x, w.shape[1], w.shape[2], w.dtype)


def grouped_offsets(tokens_per_expert: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The int32 end offsets ``_grouped_mm`` takes, on the activations' device."""
    return torch.cumsum(tokens_per_expert.to(torch.int64), 0).to(dtype=torch.int32).to(device, non_blocking=True)


def _rows_to_blocks(tokens_per_expert: torch.Tensor, t: int, device: torch.device):
    """For the batched stand-in: each row's expert and position in its expert's block, and the
    block height (the largest count)."""
    counts = tokens_per_expert.to(device=device, dtype=torch.int64)
    expert = torch.repeat_interleave(torch.arange(counts.numel(), device=device), counts, output_size=t)
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.arange(t, device=device) - starts[expert]
    return expert, pos, int(counts.max())


def _padded_bmm(x: torch.Tensor, w: torch.Tensor, tokens_per_expert: torch.Tensor) -> torch.Tensor:
    """The batched stand-in for ``_grouped_mm`` (see the module docstring): ``x[rows of e] @ w[e].T``
    with the rows scattered into a zero-padded ``[E, max_count, in]`` block, one ``bmm``, the rows
    gathered back. Padding rows are zeros and meet no other row, so each row's result is its own
    expert's matmul. ``x`` must have at least one row."""
    expert, pos, width = _rows_to_blocks(tokens_per_expert, x.shape[0], x.device)
    block = x.new_zeros(w.shape[0], width, x.shape[1]).index_put((expert, pos), x)
    return torch.bmm(block, w.transpose(1, 2))[expert, pos]


def _padded_wgrad(dy: torch.Tensor, x: torch.Tensor, tokens_per_expert: torch.Tensor, n_exp: int) -> torch.Tensor:
    """``dw[e] = dy[rows of e].T @ x[rows of e]`` for every expert (``[E, out, in]``) as one ``bmm``
    of zero-padded blocks (padding rows add zeros); an expert without rows gets zeros."""
    expert, pos, width = _rows_to_blocks(tokens_per_expert, x.shape[0], x.device)
    dyb = dy.new_zeros(n_exp, width, dy.shape[1]).index_put((expert, pos), dy)
    xb = x.new_zeros(n_exp, width, x.shape[1]).index_put((expert, pos), x)
    return torch.bmm(dyb.transpose(1, 2), xb)


class _GroupedLinear(torch.autograd.Function):
    """``y[rows of e] = x[rows of e] @ weights[e].T`` for rows sorted by expert, the per-expert
    weights taken as they are (each expert's own parameter, so gradients reach them directly).

    The ``[E, out, in]`` stack the grouped matmul needs is made inside ``forward`` and dropped when
    it returns; autograd keeps ``x`` (which each expert's ``nn.Linear`` would keep as well) and
    references to the parameters themselves, never the stack. ``backward`` stacks again for
    ``dx = dy @ w`` (a transient copy) and computes every expert's weight gradient at once as the
    K-grouped product ``dy.T @ x`` (``_grouped_mm`` of two 2-D operands with offsets along the rows:
    ``[E, out, in]``), returned as per-expert views of that one result."""

    @staticmethod
    def forward(ctx, x, tokens_per_expert, offs, *weights):
        n_out, n_in = weights[0].shape
        grouped = offs is not None and _usable(x, n_out, n_in, weights[0].dtype)
        ctx.grouped = grouped
        ctx.save_for_backward(x, tokens_per_expert, offs, *weights)
        if x.shape[0] == 0:
            return x.new_zeros(0, n_out)
        w = torch.stack(weights)  # [E, out, in]: transient, not saved
        if grouped:
            return torch._grouped_mm(x, w.transpose(1, 2), offs=offs)
        return _padded_bmm(x, w, tokens_per_expert)

    @staticmethod
    def backward(ctx, dy):
        x, tokens_per_expert, offs, *weights = ctx.saved_tensors
        n_exp, (n_out, n_in) = len(weights), weights[0].shape
        need_dx, need_dw = ctx.needs_input_grad[0], any(ctx.needs_input_grad[3:])
        if x.shape[0] == 0:
            dx = torch.zeros_like(x) if need_dx else None
            dw = x.new_zeros(n_exp, n_out, n_in) if need_dw else None
        else:
            dy = dy.contiguous()  # e.g. the stride-0 gradient of out.sum()
            if ctx.grouped and not _aligned(dy):
                dy = dy.clone()
            dx = dw = None
            if need_dx:
                w = torch.stack(weights)  # [E, out, in]: transient
                dx = (torch._grouped_mm(dy, w, offs=offs) if ctx.grouped
                      else _padded_bmm(dy, w.transpose(1, 2), tokens_per_expert))
                del w
            if need_dw:
                dw = (torch._grouped_mm(dy.t(), x, offs=offs) if ctx.grouped
                      else _padded_wgrad(dy, x, tokens_per_expert, n_exp))
        return (dx, None, None, *(dw.unbind(0) if dw is not None else (None,) * n_exp))


def grouped_linear(x: torch.Tensor, weights: Sequence[torch.Tensor], tokens_per_expert: torch.Tensor,
                   offs: torch.Tensor | None = None) -> torch.Tensor:
    """``y[rows of expert e] = x[rows of expert e] @ weights[e].T`` for rows sorted by expert.

    x: ``[T, in]``; weights: the ``E`` experts' ``nn.Linear``-layout ``[out, in]`` weights;
    tokens_per_expert: ``[E]`` counts summing to T (any device); offs: their int32 cumsum on x's
    device (computed when not given and ``torch._grouped_mm`` exists). ``torch._grouped_mm`` where
    the shapes are aligned, the batched stand-in otherwise; either way autograd saves no stack of
    the weights (:class:`_GroupedLinear`)."""
    if offs is None and hasattr(torch, "_grouped_mm"):
        offs = grouped_offsets(tokens_per_expert, x.device)
    return _GroupedLinear.apply(x, tokens_per_expert, offs, *weights)


class GroupedSequentialMLP(SequentialMLP):
    """``SequentialMLP`` with the per-expert loop replaced by grouped GEMMs (module docstring)."""

    def _grouped_ok(self) -> bool:
        c = self.config
        return (self.num_local_experts > 1 and not c.add_bias_linear and not c.fp8 and not c.fp4
                and not c.use_te_activation_func and not c.delay_wgrad_compute
                and not getattr(c, "use_kitchen", False))

    def forward(self, permuted_local_hidden_states: torch.Tensor, tokens_per_expert: torch.Tensor,
                permuted_probs: torch.Tensor):
        if not self._grouped_ok():
            return super().forward(permuted_local_hidden_states, tokens_per_expert, permuted_probs)
        x, probs = permuted_local_hidden_states, permuted_probs
        if self.config.moe_apply_probs_on_input:  # as SequentialMLP: scale the input, then ones
            assert self.config.moe_router_topk == 1, "`moe_apply_probs_on_input` only works with `moe_router_topk`=1."
            x = (probs.unsqueeze(-1) * x).to(x.dtype)
            probs = torch.ones_like(probs)
        experts = self.local_experts
        offs = grouped_offsets(tokens_per_expert, x.device) if hasattr(torch, "_grouped_mm") else None
        # fc1 weights are [(2)F, H] (a GLU's is [gate; up]), fc2's [H, F]; passed one by one, not stacked
        h = grouped_linear(x, [e.linear_fc1.weight for e in experts], tokens_per_expert, offs)
        h = self._activation(h, probs)
        return grouped_linear(h, [e.linear_fc2.weight for e in experts], tokens_per_expert, offs), None

    def _activation(self, h: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """``MLP.forward``'s activation with ``per_token_scale=probs`` (what SequentialMLP passes),
        branch for branch, on all experts' rows at once (it is row-wise)."""
        c = self.config
        act = c.activation_func
        if c.bias_activation_fusion:
            from megatron.core.fusions.fused_bias_geglu import quick_gelu, weighted_bias_quick_geglu_impl
            from megatron.core.fusions.fused_bias_swiglu import weighted_bias_swiglu_impl

            if act == F.silu and c.gated_linear_unit:
                return weighted_bias_swiglu_impl(h, None, probs.unsqueeze(-1), c.activation_func_fp8_input_store)
            if act == quick_gelu and c.gated_linear_unit:
                return weighted_bias_quick_geglu_impl(h, None, probs.unsqueeze(-1), c.activation_func_fp8_input_store,
                                                      c.glu_linear_offset, c.activation_func_clamp_value)
            raise ValueError("Only support fusion of swiglu and quick_gelu with per_token_scale in MLP.")
        if c.gated_linear_unit:
            x_glu, x_linear = torch.chunk(h, 2, dim=-1)
            if (val := c.activation_func_clamp_value) is not None:
                x_glu = x_glu.clamp(min=None, max=val)
                x_linear = x_linear.clamp(min=-val, max=val)
            h = act(x_glu) * (x_linear + c.glu_linear_offset)
        else:
            h = act(h)
        dtype = h.dtype
        return (h * probs.unsqueeze(-1)).to(dtype)


def use_grouped_experts(layer_specs) -> int:
    """Swap ``SequentialMLP`` for :class:`GroupedSequentialMLP` in the MoE layers of megatron-core
    local layer specs (each spec object patched once); returns how many were swapped."""
    import functools

    swapped, seen = 0, set()
    for spec in layer_specs:
        mlp = getattr(getattr(spec, "submodules", None), "mlp", None)
        sub = getattr(mlp, "keywords", {}).get("submodules") if isinstance(mlp, functools.partial) else None
        experts = getattr(sub, "experts", None)
        if sub is None or experts is None or id(sub) in seen:
            continue
        seen.add(id(sub))
        if isinstance(experts, functools.partial) and experts.func is SequentialMLP:
            sub.experts = functools.partial(GroupedSequentialMLP, *experts.args, **experts.keywords)
            swapped += 1
    return swapped
