"""Core attention on PyTorch's fused kernels (SDPA / flash varlen) for megatron-core's local spec.

megatron-core's local ``DotProductAttention`` materialises the ``[b, n, s, s]`` score matrix and
refuses packed (THD) sequences; Transformer Engine is not installed on our GPU machine. This
module takes its place in the layer spec (same constructor and forward signature):

- ``[s, b, n, d]`` batches go through ``F.scaled_dot_product_attention(is_causal=True)``, which
  picks the flash kernel on Hopper for bf16;
- packed THD micro-batches (``packed_seq_params.qkv_format == 'thd'``, one row of several
  sequences, what dynamic batching produces) go through ``torch.nn.attention.varlen.varlen_attn``
  (flash varlen) when this torch has it, else one SDPA call per sequence.

Context parallelism is not implemented here (it needs ring attention); the trainer refuses CP > 1
with this spec instead of computing something else.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from megatron.core.transformer.module import MegatronModule

# Its keywords differ between torch versions (_VARLEN_PARAMS); None where torch lacks it.
_varlen_attn: Callable[..., Any] | None
try:  # torch >= 2.10
    from torch.nn.attention.varlen import varlen_attn

    _VARLEN_PARAMS = set(inspect.signature(varlen_attn).parameters)
    _varlen_attn = varlen_attn
except Exception:  # pragma: no cover - depends on the torch build
    _varlen_attn = None
    _VARLEN_PARAMS = set()

FORCE_LOOP = False  # tests flip this to compare the varlen kernel with the per-sequence loop


def varlen_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                            max_seqlen: int, scale: float) -> torch.Tensor:
    """Causal attention over packed sequences: q ``[t, nq, d]``, k/v ``[t, nkv, d]`` -> ``[t, nq, d]``."""
    nq, nkv = q.shape[1], k.shape[1]
    same_dims = q.shape[-1] == k.shape[-1] == v.shape[-1]  # MLA's v head differs from its qk head
    if _varlen_attn is not None and not FORCE_LOOP and same_dims and q.is_cuda and q.dtype in (torch.bfloat16, torch.float16):
        kw: dict[str, Any] = {"scale": scale}
        if nq != nkv:
            if "enable_gqa" in _VARLEN_PARAMS:
                kw["enable_gqa"] = True
            else:
                k = k.repeat_interleave(nq // nkv, dim=1)
                v = v.repeat_interleave(nq // nkv, dim=1)
        if "is_causal" in _VARLEN_PARAMS:
            kw["is_causal"] = True
        else:
            kw["window_size"] = (-1, 0)
        cu = cu_seqlens.to(torch.int32)
        return _varlen_attn(q, k, v, cu, cu, int(max_seqlen), int(max_seqlen), **kw)
    out = torch.empty_like(q) if v.shape[-1] == q.shape[-1] else q.new_empty(*q.shape[:2], v.shape[-1])
    bounds = cu_seqlens.tolist()
    for s, e in zip(bounds[:-1], bounds[1:]):
        if e <= s:
            continue
        qs, ks, vs = (x[s:e].transpose(0, 1).unsqueeze(0) for x in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=nq != nkv)
        out[s:e] = o.squeeze(0).transpose(0, 1)
    return out


class SDPACoreAttention(MegatronModule):
    """Drop-in for megatron-core's ``DotProductAttention`` (module docstring)."""

    def __init__(self, config, layer_number: int, attn_mask_type, attention_type: str,
                 attention_dropout: Optional[float] = None, softmax_scale: Optional[float] = None,
                 cp_comm_type: Optional[str] = None, pg_collection=None, k_channels: Optional[int] = None,
                 v_channels: Optional[int] = None, **_unused):
        super().__init__(config=config)
        if config.context_parallel_size > 1:
            raise NotImplementedError("context parallelism needs ring attention (Transformer Engine); "
                                      "SDPACoreAttention supports --context-parallel-size 1 only")
        if pg_collection is not None and hasattr(pg_collection, "tp"):
            tp = pg_collection.tp.size()
        else:
            from megatron.core import parallel_state

            tp = parallel_state.get_tensor_model_parallel_world_size()
        self.heads = config.num_attention_heads // tp
        self.groups = config.num_query_groups // tp
        # MLA passes its query/key head width (nope + rope) and value width, which differ from
        # kv_channels; SDPA takes q/k and v of different widths as they come.
        head_dim = k_channels if k_channels is not None else config.kv_channels
        self.scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        if getattr(config, "window_size", None) is not None:
            raise NotImplementedError("sliding-window attention is not implemented in SDPACoreAttention")

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None, **_unused):
        if attention_bias is not None:
            raise NotImplementedError("attention bias is not supported by SDPACoreAttention")
        if packed_seq_params is not None and packed_seq_params.qkv_format == "thd":
            cu = packed_seq_params.cu_seqlens_q_padded
            if cu is None:
                cu = packed_seq_params.cu_seqlens_q
            out = varlen_causal_attention(query, key, value, cu, packed_seq_params.max_seqlen_q, self.scale)
            return out.reshape(out.shape[0], -1)
        # [s, b, n, d] -> [b, n, s, d]; the mask is causal (padding, if any, sits after the
        # last real token of each row, so causal attention never reads it for real tokens).
        q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale,
                                             dropout_p=self.dropout if self.training else 0.0,
                                             enable_gqa=q.shape[1] != k.shape[1])
        s, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)
