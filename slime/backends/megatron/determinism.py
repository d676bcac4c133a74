"""One order for the MoE combine, so that the same weights give the same log-probs in every pass.

megatron-core's token dispatchers return each token's expert outputs to it with ``unpermute``,
which, unless PyTorch's deterministic algorithms are on, sums them with ``scatter_add_``. On a GPU
that is a bf16 atomic add per (token, expert): with top-k > 2 the order of the adds varies between
launches, and bf16 sums of three or more terms depend on their order (with top-2, ``0 + a + b`` is
the same either way, which is why only DeepSeek-V3's top-4 routing moved: step-1 KL 9e-8, ppo_kl
-1.1e-5 on the H200, where the actor's training pass and the old/reference passes must agree bit
for bit). With deterministic algorithms on, megatron-core's own code takes its ``index_add_``
branch, which PyTorch then computes in a fixed order.

Only this call runs under the flag: turning it on for the whole process would also switch every
other kernel to its deterministic (slower or refusing) variant.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

_MARK = "_slime_fixed_order"


def fixed_order(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run with PyTorch's deterministic algorithms on (restored after, warn-only kept)."""
    if getattr(fn, _MARK, False):
        return fn

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if torch.are_deterministic_algorithms_enabled():
            return fn(*args, **kwargs)
        torch.use_deterministic_algorithms(True)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.use_deterministic_algorithms(False)

    setattr(wrapper, _MARK, True)
    return wrapper


def install_fixed_order_moe_combine() -> bool:
    """Route megatron-core's token dispatchers' ``unpermute`` through :func:`fixed_order` (once per
    process; the dispatchers import it by name, so their module's binding is the one replaced).
    Returns whether it is in place."""
    from megatron.core.transformer.moe import token_dispatcher

    token_dispatcher.unpermute = fixed_order(token_dispatcher.unpermute)
    return getattr(token_dispatcher.unpermute, _MARK, False)
