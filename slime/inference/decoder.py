"""Forward passes over a slot-based static KV cache for the embedded engine.

A slot holds one running row's keys and values at fixed addresses, so rows can join and leave
between decode steps (continuous batching) and, on a GPU, the decode step can be captured once
per (batch bucket, attended length) as a CUDA graph and replayed.

`SlotDecoder` runs the Hugging Face model's own modules (projections, norms, MLP, rotary
tables, lm_head) in the standard pre-norm decoder layout of Llama / Qwen2 / Qwen3; only the
attention over the cache is ours. Weight updates copy into the same parameters in place, so a
captured graph keeps reading the current weights. `RecomputeDecoder` serves any other causal LM
by re-running its full forward every step (slow, but correct).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from slime.hf.model import HFCausalLM

_SUPPORTED = {"llama", "qwen2", "qwen3"}


def fast_path_supported(model: HFCausalLM) -> bool:
    cfg = model.config
    if cfg.model_type not in _SUPPORTED or getattr(cfg, "use_sliding_window", False):
        return False
    inner = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    return inner is not None and all(hasattr(inner, n) for n in needed) and hasattr(model, "lm_head")


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot * sin


class SlotDecoder:
    """Static per-layer caches k/v: [slots, kv_heads, capacity, head_dim]."""

    def __init__(self, model: HFCausalLM, use_graphs: bool | None = None):
        self.model = model
        cfg = model.config
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        attn0 = model.model.layers[0].self_attn
        self.head_dim = getattr(attn0, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.scaling = float(getattr(attn0, "scaling", self.head_dim ** -0.5))
        self.use_graphs = use_graphs
        # One side stream for every graph's warm-up and capture: torch keeps a cuBLAS workspace per
        # (handle, stream) for the process's life (32 MiB on Hopper), so a fresh stream per capture
        # added a workspace per (batch bucket, length) captured.
        self._side_stream: torch.cuda.Stream | None = None
        self.reset()

    # -- cache management ---------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the cache, the rotary tables and the graphs (after release, or a dtype change)."""
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.slots = 0
        self.capacity = 0
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool: torch.cuda._POOL_HANDLE | None = None
        self.dtype: torch.dtype | None = None
        # [slots] device state the decode step reads; empty until ensure() sizes it
        self.tok = self.pos = torch.zeros(0, dtype=torch.long)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def graphs_on(self) -> bool:
        return self.device.type == "cuda" if self.use_graphs is None else self.use_graphs

    def ensure(self, slots: int, length: int) -> None:
        """Room for `slots` rows of `length` positions; grows (copying what is there), never shrinks."""
        dtype = next(self.model.parameters()).dtype
        if dtype != self.dtype:
            self.reset()
            self.dtype = dtype
        new_slots = max(self.slots, _pow2(slots))
        new_cap = max(self.capacity, _round_up(length, 256 if self.device.type == "cuda" else 32))
        if (new_slots, new_cap) == (self.slots, self.capacity):
            return
        dev, shape = self.device, (new_slots, self.n_kv, new_cap, self.head_dim)
        for store in (self.k, self.v):
            for i in range(len(self.model.model.layers)):
                t = torch.zeros(shape, dtype=dtype, device=dev)
                if i < len(store):
                    t[: self.slots, :, : self.capacity] = store[i]
                    store[i] = t
                else:
                    store.append(t)
        tok = torch.zeros(new_slots, dtype=torch.long, device=dev)
        pos = torch.zeros(new_slots, dtype=torch.long, device=dev)
        if self.slots:
            tok[: self.slots], pos[: self.slots] = self.tok, self.pos
        self.tok, self.pos = tok, pos
        self.slots, self.capacity = new_slots, new_cap
        with torch.no_grad():
            ids = torch.arange(new_cap, device=dev).unsqueeze(0)
            probe = torch.zeros(1, dtype=dtype, device=dev)
            cos, sin = self.model.model.rotary_emb(probe, ids)
        self.cos, self.sin = cos[0], sin[0]
        self.graphs.clear()  # they point at the old buffers
        self.pool = None  # a pool dies with the last graph that used it: never reuse its handle

    def _qkv(self, layer: Any, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        attn = layer.self_attn
        b, t = h.shape[:2]
        q = attn.q_proj(h).view(b, t, self.n_heads, self.head_dim)
        k = attn.k_proj(h).view(b, t, self.n_kv, self.head_dim)
        v = attn.v_proj(h).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        if hasattr(attn, "q_norm"):  # Qwen3: per-head RMSNorm before rotary
            q, k = attn.q_norm(q), attn.k_norm(k)
        return _rope(q.transpose(1, 2), cos, sin), _rope(k.transpose(1, 2), cos, sin), v

    # -- forward passes -----------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, slot_ids: list[int], prompts: list[list[int]]) -> torch.Tensor:
        """Write the prompts' keys/values into their slots; logits of each prompt's last token.
        Prompts are right-padded: causal attention keeps the padding out of every real token."""
        dev = self.device
        width = max(len(p) for p in prompts)
        ids = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        ids = ids.to(dev)
        slots = torch.tensor(slot_ids, device=dev)
        lens = torch.tensor([len(p) for p in prompts], device=dev)
        m = self.model.model
        cos, sin = self.cos[:width], self.sin[:width]
        x = m.embed_tokens(ids)
        for i, layer in enumerate(m.layers):
            h = layer.input_layernorm(x)
            q, k, v = self._qkv(layer, h, cos, sin)
            self.k[i][slots, :, :width] = k
            self.v[i][slots, :, :width] = v
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scaling,
                                               enable_gqa=self.n_kv != self.n_heads)
            x = x + layer.self_attn.o_proj(o.transpose(1, 2).reshape(x.shape[0], width, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        last = x[torch.arange(len(prompts), device=dev), lens - 1]
        logits = self.model.lm_head(m.norm(last))
        self.tok[slots] = 0
        self.pos[slots] = lens
        return logits

    # -- prefill/decode disaggregation (slime/backends/embedded/kv_transfer.py) ------------------
    def read_kv(self, slot: int, length: int) -> torch.Tensor:
        """A prefilled slot's keys and values, [layers, 2, kv_heads, length, head_dim] (what a
        prefill engine hands to a decode engine)."""
        return torch.stack([torch.stack((k[slot, :, :length], v[slot, :, :length])) for k, v in zip(self.k, self.v)])

    def write_kv(self, slot: int, kv: torch.Tensor) -> None:
        """Seat a prompt's transferred keys and values in a slot instead of prefilling it: the
        next decode step writes position `length`, as after prefill()."""
        length = kv.shape[-2]
        kv = kv.to(device=self.device, dtype=self.dtype)
        for i in range(len(self.k)):
            self.k[i][slot, :, :length] = kv[i, 0]
            self.v[i][slot, :, :length] = kv[i, 1]
        self.tok[slot] = 0
        self.pos[slot] = length

    def _decode(self, n: int, length: int) -> torch.Tensor:
        """One token for slots [0, n), attending over positions [0, length); reads self.tok/pos."""
        m = self.model.model
        tok, pos = self.tok[:n], self.pos[:n]
        rows = torch.arange(n, device=tok.device)
        cos, sin = self.cos[pos].unsqueeze(1).unsqueeze(1), self.sin[pos].unsqueeze(1).unsqueeze(1)
        unseen = (torch.arange(length, device=tok.device).unsqueeze(0) > pos.unsqueeze(1)).view(n, 1, 1, length)
        groups = self.n_heads // self.n_kv
        x = m.embed_tokens(tok).unsqueeze(1)
        for i, layer in enumerate(m.layers):
            h = layer.input_layernorm(x)
            q, k, v = self._qkv(layer, h, cos, sin)  # [n, heads, 1, d]
            kc, vc = self.k[i], self.v[i]
            kc[rows, :, pos] = k[:, :, 0]
            vc[rows, :, pos] = v[:, :, 0]
            keys, vals = kc[:n, :, :length], vc[:n, :, :length]
            # grouped-query attention without repeating the cache: [n, kv, groups, d] x [n, kv, d, L]
            qg = q.reshape(n, self.n_kv, groups, self.head_dim)
            scores = torch.matmul(qg, keys.transpose(-1, -2)).float() * self.scaling
            probs = torch.softmax(scores.masked_fill(unseen, float("-inf")), dim=-1).to(vals.dtype)
            o = torch.matmul(probs, vals).reshape(n, 1, -1)
            x = x + layer.self_attn.o_proj(o)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.model.lm_head(m.norm(x[:, 0]))

    @torch.no_grad()
    def decode(self, n: int, max_pos: int) -> torch.Tensor:
        """Logits [n', vocab] for slots [0, n') where n' >= n (a graph bucket on GPU; rows past n
        are free slots whose output is ignored). max_pos: the largest position written this step."""
        if not self.graphs_on:
            return self._decode(n, max_pos + 1)
        n = min(_pow2(n), self.slots)
        length = min(_round_up(max_pos + 1, 128), self.capacity)
        key = (n, length)
        if key not in self.graphs:
            self.graphs[key] = self._capture(n, length)
        graph, out = self.graphs[key]
        graph.replay()
        return out

    def _capture(self, n: int, length: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # Warm-up and capture run with every position at length-1: a column no live row has
        # reached yet (rows only read positions <= their own), so the real step overwrites it.
        saved = self.pos[:n].clone()
        self.pos[:n] = length - 1
        if self._side_stream is None:
            self._side_stream = torch.cuda.Stream()
        stream = self._side_stream
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._decode(n, length)
        torch.cuda.current_stream().wait_stream(stream)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=stream, capture_error_mode="thread_local"):
            out = self._decode(n, length)
        self.pos[:n] = saved
        return graph, out

    def advance(self, n: int, tokens: torch.Tensor, live: torch.Tensor) -> None:
        """Feed the sampled tokens back: live slots move one position on, free slots stay at 0."""
        self.tok[: tokens.shape[0]] = tokens
        self.pos[: tokens.shape[0]] = (self.pos[: tokens.shape[0]] + 1) * live

    def seat(self, slot_ids: list[int], tokens: torch.Tensor) -> None:
        """The first sampled token of freshly prefilled slots is their next input."""
        self.tok[torch.tensor(slot_ids, device=tokens.device)] = tokens

    def free(self, slot: int) -> None:
        self.pos[slot] = 0


class RecomputeDecoder:
    """Any causal LM: every step re-runs the full forward over each live row's whole sequence.
    Same interface as SlotDecoder; the sequences come from the host (`seqs[slot]`)."""

    graphs_on = False

    def __init__(self, model: HFCausalLM):
        self.model = model
        self.seqs: dict[int, list[int]] = {}
        self.slots = self.capacity = 0

    def reset(self) -> None:
        self.seqs.clear()

    def ensure(self, slots: int, length: int) -> None:
        self.slots, self.capacity = max(self.slots, slots), max(self.capacity, length)

    @torch.no_grad()
    def _run(self, seqs: list[list[int]]) -> torch.Tensor:
        dev = next(self.model.parameters()).device
        width = max(len(s) for s in seqs)
        ids = torch.zeros((len(seqs), width), dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):  # left padding: every row's last token is at column -1
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev))
        return out.logits[:, -1, :]

    def prefill(self, slot_ids: list[int], prompts: list[list[int]]) -> torch.Tensor:
        for s, p in zip(slot_ids, prompts):
            self.seqs[s] = list(p)
        return self._run([list(p) for p in prompts])

    def decode(self, n: int, max_pos: int) -> torch.Tensor:
        seqs = [self.seqs.get(s, [0]) for s in range(n)]
        return self._run(seqs)

    def advance(self, n: int, tokens: torch.Tensor, live: torch.Tensor) -> None:
        for s, (t, ok) in enumerate(zip(tokens.tolist(), live.tolist())):
            if ok and s in self.seqs:
                self.seqs[s].append(int(t))

    def seat(self, slot_ids: list[int], tokens: torch.Tensor) -> None:
        for s, t in zip(slot_ids, tokens.tolist()):
            self.seqs[s].append(int(t))

    def free(self, slot: int) -> None:
        self.seqs.pop(slot, None)
