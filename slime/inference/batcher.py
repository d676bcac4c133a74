"""Continuous batching for the embedded engine: one thread owns the model and runs a loop of
decode steps; requests' rows join between steps (prefilled into free KV slots) and leave as soon
as they finish or are aborted, freeing their slot for a waiting row.

Per step: one decode pass over the occupied slots, sampling on the device, and one copy of the
sampled tokens and log-probs to the host (the step's only synchronisation), where stop tokens,
lengths and aborts are checked.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import cast

import numpy as np
import torch

from slime.inference.decoder import (
    RecomputeDecoder,
    SlotDecoder,
    fast_path_supported,
)
from slime.inference.sampler import (
    RowParams,
    RowResult,
    TruncationPlan,
    choose_tokens,
    row_uniforms,
    to_device,
)


@dataclass
class _Row:
    prompt: list[int]
    params: RowParams
    seed: int
    stops: frozenset[int]
    should_abort: Callable[[], bool]
    batch: _Batch
    index: int = 0  # the row's place in its request (what a streaming caller is told)
    result: RowResult = field(default_factory=RowResult)
    slot: int = -1
    pos: int = 0  # the position the next decode step writes (= tokens in the cache)
    # prefill/decode disaggregation (kv_transfer.py): a decode row starts from a transferred
    # (KV, last logits) instead of a prefill; a prefill row ends after its prefill, exporting them.
    kv_in: tuple | None = None
    export: bool = False


@dataclass
class _Batch:
    left: int
    # Streaming: called on the loop thread (under the batcher's lock) with (row index, its result
    # so far) after each recorded token; it must only hand the news over, never block.
    on_token: Callable[[int, RowResult], None] | None = None
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


class ContinuousBatcher:
    def __init__(self, model: torch.nn.Module, eos_ids: tuple[int, ...], generator: torch.Generator,
                 model_lock: threading.Lock, max_running: int | None = None, prefill_tokens: int = 16384,
                 use_graphs: bool | None = None):
        self.model = model
        self.eos_ids = tuple(eos_ids)
        self.generator = generator
        self.model_lock = model_lock  # weight updates and memory release take it between steps
        self.decoder = SlotDecoder(model, use_graphs) if fast_path_supported(model) else RecomputeDecoder(model)
        self.max_running = max_running
        self.prefill_tokens = prefill_tokens
        self.step_delay_s = 0.0
        self._cv = threading.Condition()
        self._waiting: list[_Row] = []
        self._running: dict[int, _Row] = {}  # slot -> row
        self._free: list[int] = []  # min-heap of free slots below self._slots
        self._slots = 0
        self._thread: threading.Thread | None = None
        self.steps = 0  # decode steps run (tests and benchmarks read it)
        self.prefilled_tokens = 0  # prompt tokens run through a prefill forward (PD tests read it)

    # -- requests ------------------------------------------------------------------------------
    def run(self, prompts: list[list[int]], params: list[RowParams],
            should_abort: Callable[[int], bool] = lambda i: False, kv_in: list[tuple] | None = None,
            export: bool = False, on_token: Callable[[int, RowResult], None] | None = None) -> list[RowResult]:
        """Blocks until every row has finished; rows decode alongside other callers' rows.
        kv_in: per row, a transferred (KV, last logits) to start from; export: prefill only.
        `on_token(i, result)`: row i has a new token in `result` (see _Batch.on_token)."""
        if not prompts:
            return []
        batch = _Batch(left=len(prompts), on_token=on_token)
        rows = []
        with self._cv:
            for i, (p, rp) in enumerate(zip(prompts, params)):
                # Rows without a seed take one from the engine's generator, in arrival order.
                seed = rp.seed if rp.seed is not None else int(
                    torch.randint(0, 2 ** 62, (1,), generator=self.generator))
                stops = frozenset(rp.stop_token_ids) | (frozenset() if rp.ignore_eos else frozenset(self.eos_ids))
                rows.append(_Row(list(p), rp, seed & (2 ** 64 - 1), stops, partial(should_abort, i), batch, i,
                                 kv_in=kv_in[i] if kv_in else None, export=export))
            for r in rows:
                if r.params.max_new_tokens <= 0:
                    self._finish(r, "length")
                else:
                    self._waiting.append(r)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="embedded-batcher", daemon=True)
                self._thread.start()
            self._cv.notify_all()
        batch.done.wait()
        if batch.error is not None:
            raise batch.error
        return [r.result for r in rows]

    def running(self) -> int:
        return len(self._running)

    def waiting(self) -> int:
        return len(self._waiting)

    def reset(self) -> None:
        """Drop the KV cache and graphs (memory release); only while nothing runs."""
        self.decoder.reset()
        self._slots, self._free = 0, []

    # -- the loop ------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._waiting and not self._running:
                    self._cv.wait()
            try:
                with self.model_lock:
                    self._iteration()
            except BaseException as e:  # noqa: BLE001 - fail the rows in flight, keep serving
                with self._cv:
                    for r in [*self._running.values(), *self._waiting]:
                        r.batch.error = e
                        self._finish(r, "abort")
                    self._running.clear()
                    self._waiting.clear()
                    self.reset()
            if self.step_delay_s:
                time.sleep(self.step_delay_s)

    def _iteration(self) -> None:
        with self._cv:
            for _slot, r in list(self._running.items()):
                if r.should_abort():
                    self._release(r)
                    self._finish(r, "abort")
            keep = []
            for r in self._waiting:
                if r.should_abort():
                    self._finish(r, "abort")
                else:
                    keep.append(r)
            self._waiting = keep
            room = (self.max_running or 1 << 30) - len(self._running)
            admitted, self._waiting = self._waiting[:room], self._waiting[room:]
        if admitted:
            self._admit(admitted)
        if self._running:
            self._decode_step()

    def _take_slot(self) -> int:
        if self._free:
            return heapq.heappop(self._free)
        self._slots += 1
        return self._slots - 1

    def _release(self, r: _Row) -> None:
        self._running.pop(r.slot, None)
        self.decoder.free(r.slot)
        heapq.heappush(self._free, r.slot)
        r.slot = -1

    def _finish(self, r: _Row, kind: str, matched: int | None = None) -> None:
        r.result.finish_type, r.result.matched = kind, matched
        r.batch.left -= 1
        if r.batch.left == 0:
            r.batch.done.set()

    def _admit(self, rows: list[_Row]) -> None:
        for r in rows:
            r.slot = self._take_slot()
            r.pos = len(r.prompt)
        self.decoder.ensure(self._slots, max(r.pos for r in rows) + 1)
        loaded = [r for r in rows if r.kv_in is not None]
        fresh = [r for r in rows if r.kv_in is None]
        if loaded:
            self._seat_loaded(loaded)
        chunk: list[_Row] = []
        for r in fresh:  # prefill in chunks of at most prefill_tokens (padded) tokens
            width = max([len(c.prompt) for c in chunk] + [len(r.prompt)])
            if chunk and width * (len(chunk) + 1) > self.prefill_tokens:
                self._prefill(chunk)
                chunk = []
            chunk.append(r)
        if chunk:
            self._prefill(chunk)

    def _prefill(self, rows: list[_Row]) -> None:
        slots = [r.slot for r in rows]
        logits = self.decoder.prefill(slots, [r.prompt for r in rows])
        self.prefilled_tokens += sum(len(r.prompt) for r in rows)
        if any(r.export for r in rows):
            decoder = self.decoder
            assert isinstance(decoder, SlotDecoder)  # PD runs on the slot decoder only (pd.py refuses the rest)
            with self._cv:
                for j, r in enumerate(rows):
                    if r.export:
                        r.result.kv = (decoder.read_kv(r.slot, len(r.prompt)).cpu(), logits[j].cpu())
                        self._release(r)
                        self._finish(r, "length")
            keep = [j for j, r in enumerate(rows) if not r.export]
            if not keep:
                return
            rows, slots, logits = [rows[j] for j in keep], [slots[j] for j in keep], logits[keep]
        self._start(rows, slots, logits)

    def _seat_loaded(self, rows: list[_Row]) -> None:
        """Decode rows whose prompt KV came from a prefill engine: no forward over the prompt."""
        decoder = self.decoder
        assert isinstance(decoder, SlotDecoder)  # PD runs on the slot decoder only (pd.py refuses the rest)
        loaded = [cast(tuple, r.kv_in) for r in rows]  # every row seated here carries its (KV, logits)
        for r, (kv, _) in zip(rows, loaded):
            decoder.write_kv(r.slot, kv)
        logits = torch.stack([last for _, last in loaded]).to(decoder.device)
        for r in rows:
            r.kv_in = None  # the slot holds it now
        self._start(rows, [r.slot for r in rows], logits)

    def _start(self, rows: list[_Row], slots: list[int], logits: torch.Tensor) -> None:
        """Sample each row's first token from its prompt's last logits; the rows start decoding."""
        tok, lp = self._sample(logits, rows)
        self.decoder.seat(slots, tok)
        host = torch.stack([tok.double(), lp.double()]).cpu().numpy()
        with self._cv:
            for r in rows:
                self._running[r.slot] = r
            for j, r in enumerate(rows):
                self._record(r, int(host[0, j]), float(host[1, j]))

    def _decode_step(self) -> None:
        top = max(self._running) + 1
        max_pos = max(r.pos for r in self._running.values())
        self.decoder.ensure(self._slots, max_pos + 1)
        logits = self.decoder.decode(top, max_pos)
        n = logits.shape[0]
        rows: list[_Row | None] = [self._running.get(s) for s in range(n)]
        tok, lp = self._sample(logits, rows)
        live = to_device(torch.tensor([r is not None for r in rows], dtype=torch.long), tok.device)
        self.decoder.advance(n, tok, live)
        host = torch.stack([tok.double(), lp.double()]).cpu().numpy()
        self.steps += 1
        with self._cv:
            for s, r in enumerate(rows):
                if r is not None:
                    r.pos += 1
                    self._record(r, int(host[0, s]), float(host[1, s]))

    def _record(self, r: _Row, tok: int, lp: float) -> None:
        r.result.output_ids.append(tok)
        r.result.logprobs.append(lp)
        if r.batch.on_token is not None:
            r.batch.on_token(r.index, r.result)
        if tok in r.stops:
            self._release(r)
            self._finish(r, "stop", tok)
        elif len(r.result.output_ids) >= r.params.max_new_tokens:
            self._release(r)
            self._finish(r, "length")

    def _sample(self, logits: torch.Tensor, rows: list) -> tuple[torch.Tensor, torch.Tensor]:
        """Sampling params of each logits row (a free slot samples greedily and is ignored)."""
        n = logits.shape[0]
        table = np.zeros((4, n), dtype=np.float64)  # temperature, top_k, top_p, uniform
        table[0], table[1], table[2] = 1.0, -1.0, 1.0
        seeds, steps = np.zeros(n, dtype=np.uint64), np.zeros(n, dtype=np.uint64)
        for j, r in enumerate(rows):
            if r is not None:
                p = r.params
                table[0, j], table[1, j], table[2, j] = p.temperature, p.top_k, p.top_p
                seeds[j], steps[j] = r.seed, len(r.result.output_ids)
        table[3] = row_uniforms(seeds, steps)
        plan = TruncationPlan.of(table[1], table[2], logits.shape[-1])
        dev = to_device(torch.from_numpy(table), logits.device)
        return choose_tokens(logits, dev[0].float(), dev[1].long(), dev[2].float(), dev[3], plan)
