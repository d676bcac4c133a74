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
(hf_mapping.py) and their export. The forward stacks them (``torch.stack``: a copy of the local
expert weights per MoE layer per forward, kept for backward by autograd); gradients flow back
through the stack to each expert's own parameter (megatron's DDP hooks see them as before).

Tokens arrive as the token dispatcher leaves them: permuted, sorted by local expert, with
``tokens_per_expert`` counts (a CPU tensor for the alltoall dispatcher) and the routing
probabilities, which are applied exactly where ``SequentialMLP`` applies them: on the input with
``moe_apply_probs_on_input`` (then ones), otherwise as ``MLP``'s ``per_token_scale`` after the
activation (the fused weighted SwiGLU when ``bias_activation_fusion`` is on).

``torch._grouped_mm`` (torch 2.13) runs on CUDA (bf16 is its fast path on Hopper) and on the CPU
(fp32 and bf16, autograd included), but only when every stride is a multiple of 16 bytes. Where it
is missing or a shape is not aligned (odd test shapes), :func:`grouped_linear` uses an equivalent
batched formulation (tokens scattered into a zero-padded ``[E, max_tokens, in]`` block, one
``torch.bmm``, gathered back): still no per-expert Python loop, more memory, used only there.

Cases this path does not cover run ``SequentialMLP``'s own forward: one local expert (already one
GEMM), expert biases (``add_bias_linear``), fp8/fp4, Transformer Engine activations and delayed
weight-gradient computation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.transformer.moe.experts import SequentialMLP

_ALIGN = 16  # bytes: torch._grouped_mm's stride requirement


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward hands on a contiguous gradient: ``_grouped_mm``'s backward refuses
    a broadcast (stride-0) gradient, e.g. the one of ``out.sum()``."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


def _aligned(*tensors: torch.Tensor) -> bool:
    for t in tensors:
        if t.data_ptr() % _ALIGN:
            return False
        es = t.element_size()
        if any((s * es) % _ALIGN for s, n in zip(t.stride(), t.shape) if s != 1 and n > 1):
            return False
    return True


def torch_grouped_mm_usable(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``torch._grouped_mm`` takes ``x [T, in]`` against ``w [E, out, in]`` (the output's
    rows, ``out`` wide, must be aligned too)."""
    if not hasattr(torch, "_grouped_mm") or x.dim() != 2 or w.dim() != 3 or x.dtype != w.dtype:
        return False
    return x.is_contiguous() and w.is_contiguous() and (w.shape[1] * w.element_size()) % _ALIGN == 0 \
        and _aligned(x, w)


def grouped_linear(x: torch.Tensor, w: torch.Tensor, tokens_per_expert: torch.Tensor,
                   offs: torch.Tensor | None = None) -> torch.Tensor:
    """``y[rows of expert e] = x[rows of expert e] @ w[e].T`` for rows sorted by expert.

    x: ``[T, in]``; w: ``[E, out, in]`` (a stack of ``nn.Linear``-layout weights);
    tokens_per_expert: ``[E]`` counts summing to T (any device); offs: their int32 cumsum on x's
    device (computed when not given)."""
    if torch_grouped_mm_usable(x, w):
        if offs is None:
            offs = grouped_offsets(tokens_per_expert, x.device)
        y = torch._grouped_mm(x, w.transpose(1, 2), offs=offs)
        return _ContiguousGrad.apply(y) if y.requires_grad else y
    return _padded_bmm(x, w, tokens_per_expert)


def grouped_offsets(tokens_per_expert: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The int32 end offsets ``_grouped_mm`` takes, on the activations' device."""
    return torch.cumsum(tokens_per_expert.to(torch.int64), 0).to(dtype=torch.int32).to(device, non_blocking=True)


def _padded_bmm(x: torch.Tensor, w: torch.Tensor, tokens_per_expert: torch.Tensor) -> torch.Tensor:
    """The batched stand-in for ``_grouped_mm`` (see the module docstring): rows scattered into a
    zero-padded ``[E, max_count, in]`` block, one ``bmm``, the rows gathered back. Padding rows are
    zeros and meet no other row, so each row's result is its own expert's matmul."""
    counts = tokens_per_expert.to(device=x.device, dtype=torch.int64)
    n_exp, t = w.shape[0], x.shape[0]
    if t == 0:
        return x @ w[0].t()  # [0, out]
    expert = torch.repeat_interleave(torch.arange(n_exp, device=x.device), counts, output_size=t)
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.arange(t, device=x.device) - starts[expert]
    width = int(counts.max())
    block = x.new_zeros(n_exp, width, x.shape[1]).index_put((expert, pos), x)
    return torch.bmm(block, w.transpose(1, 2))[expert, pos]


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
        w1 = torch.stack([e.linear_fc1.weight for e in experts])  # [E, (2)F, H]; fc1 of a GLU is [gate; up]
        w2 = torch.stack([e.linear_fc2.weight for e in experts])  # [E, H, F]
        offs = grouped_offsets(tokens_per_expert, x.device) if hasattr(torch, "_grouped_mm") else None
        h = grouped_linear(x, w1, tokens_per_expert, offs)
        h = self._activation(h, probs)
        return grouped_linear(h, w2, tokens_per_expert, offs), None

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
