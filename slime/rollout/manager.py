"""The rollout manager: prompts -> engines -> samples -> rewards, one rollout at a time.

Runs inside a Ray actor (slime/ray/actors.py) but is a plain class: it talks to engines only
through slime.rollout.client, and only to the router's address (slime/rollout/router.py, or
sglang-router), which spreads requests over the engines and retries those an engine dropped. Sampling seeds are a pure function of (--rollout-seed, rollout id,
prompt), so a resumed run samples what the uninterrupted run would have.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from slime.config import DataConfig, EvalConfig, RolloutConfig, SamplingConfig
from slime.data.dataset import DataPosition, PromptRecord, PromptSource, load_prompts
from slime.data.sample import FINISH_TO_STATUS, Sample
from slime.rollout.client import EngineClient, GenerateResult, RouterAdmin
from slime.rollout.rewards import RewardScorer
from slime.rollout.router import split_evenly


@dataclass
class GenerateContext:
    """What a --custom-generate-function-path hook receives as `args`: `client` talks to the
    router (pass routing_key=<session id> for multi-turn affinity), `router` lists the workers."""

    rollout: RolloutConfig
    tokenizer: Any
    client: EngineClient
    router: RouterAdmin

    @property
    def clients(self) -> dict[str, EngineClient]:
        return {self.client.url: self.client}


def sampling_params(s: SamplingConfig, n: int, seed: int) -> dict[str, Any]:
    p = {"max_new_tokens": s.max_response_len, "temperature": s.temperature, "top_p": s.top_p,
         "top_k": s.top_k, "n": n, "sampling_seed": seed, "no_stop_trim": True,
         "spaces_between_special_tokens": False}
    if s.stop_token_ids:
        p["stop_token_ids"] = list(s.stop_token_ids)
    return p


def _seed(base: int, rollout_id: int, prompt_id: int) -> int:
    return (base * 1_000_003 + rollout_id * 7_919 + prompt_id * 104_729) % (2**31 - 1)


class RolloutManager:
    def __init__(self, data: DataConfig, rollout: RolloutConfig, eval_cfg: EvalConfig,
                 hf_checkpoint: str, router_url: str, position: dict[str, int] | None = None):
        from slime.backends.embedded.model import load_tokenizer

        self.data, self.rollout, self.eval_cfg = data, rollout, eval_cfg
        self.tokenizer = load_tokenizer(hf_checkpoint)
        self.records = self._load(data.prompt_data, "--prompt-data")
        start = DataPosition.from_dict(position) if position else DataPosition()
        self.source = PromptSource(self.records, data.rollout_shuffle, data.rollout_seed, start)
        self.positions: dict[int, DataPosition] = {}
        self.router = RouterAdmin(router_url)
        self.client = EngineClient(router_url, retries=8)
        self.ctx = GenerateContext(rollout, self.tokenizer, self.client, self.router)
        self.scorer = RewardScorer(rollout.rm_type, rollout.custom_rm_path, rollout.group_rm,
                                   rollout.reward_key, self.ctx)
        self.generate_hook = None
        if rollout.custom_generate_function_path:
            from slime.rewards.hooks import load_function

            self.generate_hook = load_function(rollout.custom_generate_function_path, kind="generate")
        self.eval_sets = {name: self._load(path, f"--eval-prompt-data {name}") for name, path in eval_cfg.datasets}
        self.wait_engines()

    def wait_engines(self, timeout: float = 300.0) -> list[str]:
        """Every registered engine healthy (they were registered after their readiness probe)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ws = self.router.list_workers()
            if ws and all(w["is_healthy"] for w in ws):
                return [w["url"] for w in ws]
            time.sleep(0.2)
        raise TimeoutError(f"no healthy engines behind the router {self.client.url} after {timeout} s")

    def _load(self, path: str, flag: str) -> list[PromptRecord]:
        d = self.data
        return load_prompts(path, self.tokenizer, d.input_key, d.label_key, d.metadata_key,
                            d.apply_chat_template, d.apply_chat_template_kwargs, d.rollout_max_prompt_len, flag)

    # -- positions (saved with checkpoints) ------------------------------------------------------
    def position_for(self, rollout_id: int) -> dict[str, int]:
        """The data position at which rollout `rollout_id` starts (the current one if it has not
        been generated yet; in async mode it may already be in flight)."""
        return self.positions.get(rollout_id, self.source.position).to_dict()

    # -- generation ------------------------------------------------------------------------------
    def _samples_for(self, batch: list[tuple[int, PromptRecord]], n: int) -> list[Sample]:
        return [Sample(rec.prompt_id, g, rec.prompt, list(rec.prompt_tokens), rec.label, dict(rec.metadata), epoch)
                for g, (epoch, rec) in enumerate(batch) for _ in range(n)]

    def _run_engines(self, samples: list[Sample], n: int, sp: SamplingConfig, seed_of) -> None:
        """Fill samples (groups of n consecutive) with responses: one batched request per engine
        share (at most --sglang-server-concurrency samples each), all through the router. Seeds
        are per prompt, so a request the router retries on another engine samples the same."""
        groups = list(range(0, len(samples), n))
        limit = max(1, self.rollout.server_concurrency // n)
        workers = max(1, sum(w["is_healthy"] for w in self.router.list_workers()))
        chunks = [list(r)[c:c + limit] for r in split_evenly(len(groups), workers)
                  for c in range(0, len(r), limit)]

        def run(chunk: list[int]) -> None:
            firsts = [samples[groups[i]] for i in chunk]
            params = [sampling_params(sp, n, seed_of(s)) for s in firsts]
            outs = self.client.generate([s.prompt_tokens for s in firsts], params)
            if len(outs) != len(chunk) * n:
                raise RuntimeError(f"router returned {len(outs)} outputs for {len(chunk) * n} samples")
            for k, i in enumerate(chunk):
                for j in range(n):
                    _fill(samples[groups[i] + j], outs[k * n + j])

        with ThreadPoolExecutor(max(1, len(chunks))) as pool:
            list(pool.map(run, chunks))

    def _run_hook(self, samples: list[Sample], sp: SamplingConfig, seed_of) -> None:
        from slime.rewards.hooks import HookError, hook_path

        async def one(s: Sample, k: int):
            try:
                return await self.generate_hook(self.ctx, s, sampling_params(sp, 1, seed_of(s) + k))
            except Exception as e:  # noqa: BLE001 - name the hook and the sample, keep the cause
                raise HookError(f"[generate hook] {hook_path(self.generate_hook)!r} raised on {s.describe()}: {e!r}",
                                kind="generate", path=hook_path(self.generate_hook)) from e

        async def all_():
            return await asyncio.gather(*(one(s, i) for i, s in enumerate(samples)))

        out = asyncio.run(all_())
        for i, s in enumerate(out):
            if not isinstance(s, Sample):
                raise TypeError(f"[generate hook] {hook_path(self.generate_hook)!r} returned "
                                f"{type(s).__name__} for {samples[i].describe()}, expected the Sample")
            samples[i] = s

    def generate(self, rollout_id: int) -> tuple[list[Sample], dict[str, float]]:
        t0 = time.monotonic()
        r = self.rollout
        self.positions[rollout_id] = self.source.position
        batch = self.source.next_batch(r.rollout_batch_size)
        samples = self._samples_for(batch, r.n_samples_per_prompt)
        seed_of = lambda s: _seed(r.seed, rollout_id, s.prompt_id)  # noqa: E731
        if self.generate_hook:
            self._run_hook(samples, r.sampling, seed_of)
        else:
            self._run_engines(samples, r.n_samples_per_prompt, r.sampling, seed_of)
        t1 = time.monotonic()
        metrics = self.scorer.score(samples, r.n_samples_per_prompt)
        from slime.metrics import rollout_metrics

        tokens = sum(s.response_length for s in samples)
        metrics = {**rollout_metrics(samples, metrics), "perf/rollout_time": t1 - t0,
                   "perf/reward_time": time.monotonic() - t1,
                   "perf/rollout_tokens_per_s": tokens / max(t1 - t0, 1e-9)}
        if r.rm_type == "deepscaler" and not r.custom_rm_path and metrics.get("rollout/no_think_block_ratio", 0) > 0:
            print(f"[slime] warning: rollout {rollout_id}: {metrics['rollout/no_think_block_ratio']:.0%} of responses "
                  f"have no </think>; deepscaler scores them 0 (use --rm-type math for non-reasoning models)",
                  flush=True)
        return samples, metrics

    def evaluate(self, rollout_id: int) -> dict[str, float]:
        out = {}
        n = self.eval_cfg.n_samples_per_prompt
        for name, records in self.eval_sets.items():
            samples = self._samples_for([(0, rec) for rec in records], n)
            self._run_engines(samples, n, self.eval_cfg.sampling,
                              lambda s: _seed(self.rollout.seed + 1, rollout_id, s.prompt_id))
            scorer = self.scorer
            if self.rollout.group_rm:  # group hooks do not apply to eval: score with the sample form
                raise ValueError("--group-rm is not supported in evaluation; use --rm-type for eval")
            scorer.score(samples, n)
            out[f"eval/{name}"] = sum(s.reward for s in samples) / max(len(samples), 1)
            out[f"eval/{name}_response_length"] = sum(s.response_length for s in samples) / max(len(samples), 1)
        return out

    # -- engines (colocated phases) --------------------------------------------------------------
    def engine_urls(self) -> list[str]:
        return [w["url"] for w in self.router.list_workers()]


def _fill(s: Sample, out: GenerateResult) -> None:
    s.response_tokens = out.output_ids
    s.rollout_log_probs = out.output_logprobs
    s.response = out.text
    s.status = FINISH_TO_STATUS.get(out.finish_type, FINISH_TO_STATUS["abort"])
    s.weight_version = out.weight_version
