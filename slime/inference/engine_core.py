"""The embedded rollout engine without HTTP: model, generation, versioned weight updates,
memory release. slime/rollout/engines/embedded.py puts the SGLang protocol in front of it.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch

from slime.hf.layout import load_checkpoint_tensors
from slime.hf.model import eos_token_ids, load_model, load_tokenizer, pick_device
from slime.hf.weights import decode_bucket, read_weights_dir
from slime.inference.batcher import ContinuousBatcher
from slime.inference.sampler import RowParams, RowResult


class EngineError(Exception):
    """A refused request; status is the HTTP status the server answers with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def parse_version(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


@dataclass
class GenerateRequest:
    input_ids: list[list[int]]  # one prompt per entry (already expanded by n)
    params: list[RowParams]
    rids: list[str]
    return_logprob: bool = True
    # prefill/decode disaggregation (kv_transfer.py): per row, a transferred (KV, last logits) to
    # decode from; or export=True: prefill only, each row's (KV, last logits) left in `exported`.
    kv_in: list[tuple] | None = None
    export: bool = False
    exported: list[tuple] | None = None
    kv_version: str | None = None  # the weight version kv_in was computed with


class _RequestGate:
    """Requests share the engine; a weight update or memory release waits until the requests in
    flight have finished, and requests that arrive meanwhile wait for it (one weight version per
    request, as SGLang's model-update lock gives)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._readers = 0
        self._writers_waiting = 0
        self._writing = False

    def enter(self) -> None:
        with self._cv:
            self._cv.wait_for(lambda: not self._writing and not self._writers_waiting)
            self._readers += 1

    def leave(self) -> None:
        with self._cv:
            self._readers -= 1
            self._cv.notify_all()

    def __enter__(self) -> _RequestGate:  # the exclusive side
        with self._cv:
            self._writers_waiting += 1
            self._cv.wait_for(lambda: not self._writing and self._readers == 0)
            self._writers_waiting -= 1
            self._writing = True
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cv:
            self._writing = False
            self._cv.notify_all()


class EngineCore:
    def __init__(self, hf_checkpoint: str, seed: int = 0, weight_version: str = "0",
                 device: str | torch.device | None = None, dtype: str | torch.dtype | None = None,
                 max_running: int | None = None):
        """device: default the GPU when there is one; dtype (a torch dtype or --sglang-dtype's name):
        default float32 on CPU (the train/rollout KL check compares like with like), bfloat16 on a GPU."""
        self.hf_checkpoint = hf_checkpoint
        self.tokenizer = load_tokenizer(hf_checkpoint)
        self.device = torch.device(device) if device is not None else pick_device()
        self.dtype = dtype if isinstance(dtype, torch.dtype) else engine_dtype(self.device, dtype)
        self.model = load_model(hf_checkpoint, device=self.device, dtype=self.dtype).eval()
        self.eos_ids = eos_token_ids(self.tokenizer, hf_checkpoint)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        self.weight_version = str(weight_version)
        self._partial_version: str | None = None  # a bucketed update in progress
        self.released = False
        self.lock = threading.Lock()  # one forward pass at a time; updates wait for it
        # A bucketed update in progress holds generation back until its last bucket commits, so
        # no request is ever sampled on a mix of two versions (whatever the transport); the gate
        # makes each update wait for the requests in flight.
        self._committed = threading.Condition(self.lock)
        self.partial_update_timeout_s = 600.0
        self._gate = _RequestGate()
        self.batcher = ContinuousBatcher(self.model, self.eos_ids, self.generator, self.lock,
                                         max_running=max_running)
        self.busy = 0
        # abort_all aborts every request present when it is called, running or waiting for the
        # lock (SGLang: running and queued); requests that arrive later are not affected.
        self._abort_epoch = 0
        self._abort_rids: set[str] = set()

    @property
    def step_delay_s(self) -> float:
        """Tests and benchmarks: a pause after every decode step, to act mid-request."""
        return self.batcher.step_delay_s

    @step_delay_s.setter
    def step_delay_s(self, seconds: float) -> None:
        self.batcher.step_delay_s = float(seconds)

    # -- generation --------------------------------------------------------------------------
    def generate(self, req: GenerateRequest,
                 on_token: Callable[[int, RowResult], None] | None = None) -> list[dict[str, Any]]:
        """The outputs of every row of `req`, in SGLang's shape. `on_token(i, result)`: row i has a
        new output token (called on the batcher's thread; see ContinuousBatcher.run)."""
        if self.released:
            raise EngineError("engine memory is released; POST /resume_memory_occupation first", 503)
        self.busy += 1
        epoch = self._abort_epoch
        try:
            self._enter_committed()
            try:
                if self.released:
                    raise EngineError("engine memory is released; POST /resume_memory_occupation first", 503)
                if req.kv_in is not None and req.kv_version != self.weight_version:
                    raise EngineError(f"the prompt's KV cache was computed with weight version {req.kv_version} and "
                                      f"this decode engine serves {self.weight_version}; retry the request", 503)

                def abort(i: int) -> bool:
                    return self._abort_epoch != epoch or req.rids[i] in self._abort_rids

                rows = self.batcher.run(req.input_ids, req.params, abort, req.kv_in, req.export, on_token)
                version = self.weight_version
                if req.export:
                    req.exported = [cast(tuple, row.kv) for row in rows]  # each export row ended with its kv set
            finally:
                self._gate.leave()
        finally:
            self.busy -= 1
            self._abort_rids.difference_update(req.rids)
        outs = []
        for rid, prompt, row in zip(req.rids, req.input_ids, rows):
            fr: dict[str, Any] = {"type": row.finish_type}
            if row.finish_type == "stop":
                fr["matched"] = row.matched
            elif row.finish_type == "length":
                fr["length"] = len(row.output_ids)
            else:
                fr.update(message="aborted by /abort_request", status_code=None, err_type=None)
            outs.append(self.output(rid, prompt, row.output_ids, row.logprobs, fr, version, req.return_logprob))
        return outs

    def output(self, rid: str, prompt: list[int], output_ids: list[int], logprobs: list[float],
               finish_reason: dict[str, Any] | None, version: str, return_logprob: bool) -> dict[str, Any]:
        """One row's answer; a stream's frames before the last carry finish_reason None."""
        meta: dict[str, Any] = {"id": rid, "finish_reason": finish_reason, "prompt_tokens": len(prompt),
                "completion_tokens": len(output_ids), "cached_tokens": 0, "weight_version": version}
        if return_logprob:
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(logprobs, output_ids)]
            meta["input_token_logprobs"] = []
        return {"text": self.tokenizer.decode(output_ids, skip_special_tokens=True),
                "output_ids": list(output_ids), "meta_info": meta}

    def abort(self, rid: str = "", abort_all: bool = False) -> None:
        if abort_all:
            self._abort_epoch += 1
        elif rid:
            self._abort_rids.add(rid)

    def flush_cache(self) -> None:
        # No cross-request prefix cache is kept; refuse while busy like SGLang (clients retry).
        if self.busy:
            raise EngineError("cannot flush the cache while requests are running", 400)

    # -- weights -----------------------------------------------------------------------------
    def _enter_committed(self) -> None:
        """Enter the gate as a request once no update is half applied. The wait happens outside
        the gate: a request holding it would keep the update's next bucket out (a deadlock)."""
        while True:
            with self.lock:
                self._wait_for_commit()
            self._gate.enter()
            if self._partial_version is None:  # no writer can run while we are inside
                return
            self._gate.leave()

    def _wait_for_commit(self) -> None:
        """Called holding self.lock: wait (releasing it, so buckets can land) while an update is
        half applied."""
        while self._partial_version is not None:
            if not self._committed.wait(timeout=self.partial_update_timeout_s):
                raise EngineError(f"weight update to version {self._partial_version} is still half applied after "
                                  f"{self.partial_update_timeout_s:g} s (its last bucket never came); "
                                  f"refusing to sample on mixed weights", 503)

    def _check_version(self, version: Any) -> str:
        new = parse_version(version)
        if new is None:
            raise EngineError(f"weight_version must be an integer string, got {version!r}")
        cur = parse_version(self.weight_version)
        if self._partial_version is not None and str(new) == self._partial_version:
            return str(new)  # next bucket of the update in progress
        if cur is not None and new <= cur:
            raise EngineError(f"stale weight_version {new}: the engine already serves version {cur}; "
                              f"versions must increase")
        return str(new)

    def update_from_named(self, named: dict[str, torch.Tensor], version: Any, last_bucket: bool) -> None:
        v = self._check_version(version)
        with self._gate, self.lock:
            load_checkpoint_tensors(self.model, named, strict=False)
            self._partial_version = None if last_bucket else v
            if last_bucket:
                self.weight_version = v
                self._committed.notify_all()

    def update_from_disk(self, model_path: str, version: Any) -> None:
        v = self._check_version(version)
        named = read_weights_dir(model_path)
        with self._gate, self.lock:
            load_checkpoint_tensors(self.model, named, strict=True)
            self.weight_version = v
            self._partial_version = None
            self._committed.notify_all()

    def update_from_bytes(self, payload: bytes, version: Any, last_bucket: bool) -> None:
        self.update_from_named(decode_bucket(payload), version, last_bucket)

    # -- memory ------------------------------------------------------------------------------
    def release(self, tags: list[str] | None) -> None:
        """Drop the weights (tags None or containing 'weights'); they come back uninitialised on
        resume and must be refilled by a weight update, as in SGLang without a CPU backup."""
        if self.busy:
            raise EngineError("cannot release memory while requests are running", 400)
        if tags is None or "weights" in tags:
            with self._gate, self.lock:
                self.batcher.reset()  # the KV cache and captured graphs go with the weights
                # Buffers (rotary inv_freq, ...) are derived state, not weights: keep a copy.
                self._buffers = {n: b.detach().cpu().clone() for n, b in self.model.named_buffers()}
                self.model.to("meta")
                self.released = True
                if self.device.type == "cuda":  # give the freed blocks back to the colocated trainer
                    torch.cuda.empty_cache()

    def resume(self, tags: list[str] | None) -> None:
        if self.released and (tags is None or "weights" in tags):
            with self._gate, self.lock:
                self.model.to_empty(device=self.device)
                for name, saved in self._buffers.items():
                    mod_name, _, attr = name.rpartition(".")
                    setattr(self.model.get_submodule(mod_name), attr, saved.to(self.device))
                self.released = False

    # -- info --------------------------------------------------------------------------------
    def model_info(self) -> dict[str, Any]:
        cfg = self.model.config
        return {"model_path": self.hf_checkpoint, "tokenizer_path": self.hf_checkpoint,
                "is_generation": True, "weight_version": self.weight_version,
                "model_type": cfg.model_type, "architectures": list(cfg.architectures or [])}


def engine_dtype(device: torch.device, name: str | None = None) -> torch.dtype:
    """bf16 on a GPU (what the trainer exports and SGLang serves), float32 on the CPU (the CPU
    runs check the engine against the trainer at ~1e-7); --sglang-dtype overrides."""
    if name and name != "auto":
        return {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "half": torch.float16,
                "float32": torch.float32, "float": torch.float32}[name]
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def new_rid() -> str:
    return uuid.uuid4().hex
