"""The rollout manager: prompts -> engines -> samples -> rewards, one rollout at a time.

Runs inside a Ray actor (slime/ray/actors.py) but is a plain class: it talks to engines only
through slime.rollout.client, and only to the router's address (slime/rollout/router.py, or
sglang-router), which spreads requests over the engines and retries those an engine dropped. Sampling seeds are a pure function of (--rollout-seed, rollout id,
prompt), so a resumed run samples what the uninterrupted run would have.
"""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

from slime.config import DataConfig, EvalConfig, RolloutConfig, SamplingConfig
from slime.data.dataset import DataPosition, PromptRecord, PromptSource, load_prompts
from slime.data.sample import Sample, Status
from slime.rollout.client import EngineClient, EngineRequestError, GenerateResult, RouterAdmin
from slime.rollout.generate import (
    GenerateContext,
    extend_sample,
    fill_sample,
    plan_requests,
    run_generate_hook,
    sample_seed,
    sampling_params,
)
from slime.rollout.producers import sample_id
from slime.rollout.rewards import RewardScorer
from slime.rollout.router import split_evenly

if TYPE_CHECKING:
    from slime.rollout.producers import ProducerGroup
    from slime.rollout.queue import RolloutQueue

PD_RETRY_S = 300.0  # how long a PD request is retried (see RolloutManager._send)


class RolloutManager:
    def __init__(self, data: DataConfig, rollout: RolloutConfig, eval_cfg: EvalConfig,
                 hf_checkpoint: str, router_url: str, position: dict[str, int] | None = None,
                 partial_buffer: list[list[dict]] | None = None, start_rollout_id: int = 0,
                 batched: bool = True, producers: list[dict[str, Any]] | None = None):
        from slime.hf.model import load_tokenizer

        # batched: a sampling_params list, one seed per prompt (our router and the engines take it).
        # Otherwise (sglang-router) one sampling_params per request (_run_engines). A router that
        # refuses the list (422) switches this off for the rest of the run.
        self.batched = batched
        self.pd = False  # PD router in front (wait_engines): 5xx answers are retried (_send)
        self.pd_retries = 0
        self.data, self.rollout, self.eval_cfg = data, rollout, eval_cfg
        # straw + fully async: producer actors generate the groups (one options dict each: placement);
        # started first, so that their processes come up while this one loads the tokenizer and data
        self.producers: ProducerGroup | None = None
        if producers and rollout.queue_dir:
            self._start_producers(producers, hf_checkpoint, router_url)
        self.tokenizer = load_tokenizer(hf_checkpoint)
        assert data.prompt_data is not None  # validate() refuses a missing --prompt-data
        self.records = self._load(data.prompt_data, "--prompt-data")
        start = DataPosition.from_dict(position) if position else DataPosition()
        self.source = PromptSource(self.records, data.rollout_shuffle, data.rollout_seed, start)
        self.positions: dict[int, DataPosition] = {}
        self.router = RouterAdmin(router_url)
        self.client = EngineClient(router_url, retries=8)
        self.ctx = GenerateContext(rollout, self.tokenizer, self.client, self.router)
        self.scorer = RewardScorer(rollout.rm_type, rollout.custom_rm_path, rollout.group_rm,
                                   rollout.reward_key, self.ctx, rollout.rm_url, rollout.rm_timeout,
                                   rollout.rm_max_retries)
        self.generate_hook = None
        if rollout.custom_generate_function_path:
            from slime.rewards.hooks import load_function

            self.generate_hook = load_function(rollout.custom_generate_function_path, kind="generate")
        self.eval_sets = {name: self._load(path, f"--eval-prompt-data {name}") for name, path in eval_cfg.datasets}
        # Partial rollout: groups aborted (or finished unused) at the end of a rollout, oldest first.
        self.buffer: list[list[Sample]] = [[Sample.from_dict(d) for d in g] for g in (partial_buffer or [])]
        self.buffers: dict[int, list[list[dict]]] = {}
        self.filter_hook = None
        if rollout.dynamic_sampling_filter_path:
            from slime.rewards.hooks import load_function

            self.filter_hook = load_function(rollout.dynamic_sampling_filter_path, kind="dynamic_sampling_filter")
        self.queue: RolloutQueue | None = None
        self.queued: dict[int, int] = {}  # rollout id -> queue seq of a generated, not yet trained rollout
        if rollout.queue_dir:
            self._open_queue(start_rollout_id)
        self.wait_engines()
        if self.producers is not None:
            self._discard_produced(start_rollout_id)

    # -- straw queue -----------------------------------------------------------------------------
    def _open_queue(self, start_rollout_id: int) -> None:
        from slime.rollout.queue import RolloutQueue

        r = self.rollout
        assert r.queue_dir and r.queue_run_id  # validate(): both or neither
        self.queue = queue = RolloutQueue(r.queue_dir, r.queue_run_id)
        for seq, payload in queue.pending():
            rid = int(payload["rollout_id"])
            if rid < start_rollout_id:  # trained and checkpointed already: its ack was lost
                queue.ack(seq)
            else:
                self.queued[rid] = seq
        if self.queued or any(queue.recovered.values()):
            print(f"[slime] straw queue {self.rollout.queue_dir} (run {self.rollout.queue_run_id}): resumed with "
                  f"rollouts {sorted(self.queued)} generated and not trained yet; recovered {self.queue.recovered}",
                  flush=True)

    def _start_producers(self, options: list[dict[str, Any]], hf_checkpoint: str, router_url: str) -> None:
        from slime.rollout.producers import ProducerGroup, RouterGenerator, producer_ids

        r = self.rollout
        assert r.queue_dir and r.queue_run_id  # validate(): both or neither
        self.producers = ProducerGroup(r.queue_dir, r.queue_run_id, producer_ids(len(options)),
                                       RouterGenerator(r, hf_checkpoint, router_url), options,
                                       workers=max(1, r.server_concurrency // max(r.n_samples_per_prompt, 1)))

    def _discard_produced(self, start_rollout_id: int) -> None:
        """Producer groups of rollouts trained before the checkpoint, or already in the run's queue, go."""
        r, producers = self.rollout, self.producers
        assert producers is not None  # called only when they were started
        dropped = producers.discard(start_rollout_id, sorted(self.queued))
        print(f"[slime] straw producers: {len(producers.ids)} Ray actors ({', '.join(producers.ids)}), "
              f"each placed beside an engine group, writing under {r.queue_dir}/producers/", flush=True)
        if dropped:
            print(f"[slime] straw producers: dropped {dropped} group(s) of rollouts already trained or assembled",
                  flush=True)

    def _produce(self, rollout_id: int, samples: list[Sample], n: int) -> tuple[list[Sample], dict[str, float]]:
        """The rollout's groups generated by the producers, each exactly once, in group order."""
        producers = self.producers
        assert producers is not None  # called only when they were started
        before = sum(producers.restarts.values())
        tasks = {g: [s.to_dict() for s in samples[g * n:(g + 1) * n]] for g in range(len(samples) // n)}
        records = producers.collect(rollout_id, tasks)
        out, seen = [], set()
        for rec in records:
            for d in rec["samples"]:
                if d["sample_id"] not in seen:  # one copy per sample id, whatever the producers did
                    seen.add(d["sample_id"])
                    out.append(Sample.from_dict(d))
        return out, {"rollout/producers": float(len(producers.ids)),
                     "rollout/producer_restarts": float(sum(producers.restarts.values()) - before)}

    def ack(self, rollout_id: int) -> None:
        """The trainer consumed rollout `rollout_id`: drop it from the queue (durably)."""
        seq = self.queued.pop(rollout_id, None)
        if self.queue is not None and seq is not None:
            self.queue.ack(seq)

    def close(self) -> None:
        """Release the straw queue (its lock) before the actor goes away."""
        if self.producers is not None:
            self.producers.close()
        if self.queue is not None:
            self.queue.close()

    def state_for(self, rollout_id: int) -> dict[str, Any]:
        """What a checkpoint saved before rollout `rollout_id` needs: data position + partial buffer."""
        buf = self.buffers.get(rollout_id)
        if buf is None:
            buf = [[s.to_dict() for s in g] for g in self.buffer]
        return {"data_position": self.position_for(rollout_id), "partial_buffer": buf}

    def wait_engines(self, timeout: float = 300.0) -> list[str]:
        """Every registered engine healthy (they were registered after their readiness probe)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ws = self.router.list_workers()
            if ws and all(w["is_healthy"] for w in ws):
                self.pd = any(w.get("worker_type") == "prefill" for w in ws)
                return [w["url"] for w in ws]
            time.sleep(0.2)
        raise TimeoutError(f"no healthy engines behind the router {self.client.url} after {timeout} s")

    def _load(self, path: str, flag: str) -> list[PromptRecord]:
        d = self.data
        return load_prompts(path, self.tokenizer, d.input_key, d.label_key, d.metadata_key,
                            d.apply_chat_template, d.apply_chat_template_kwargs, d.rollout_max_prompt_len, flag,
                            d.tool_key)

    # -- positions (saved with checkpoints) ------------------------------------------------------
    def position_for(self, rollout_id: int) -> dict[str, int]:
        """The data position at which rollout `rollout_id` starts (the current one if it has not
        been generated yet; in async mode it may already be in flight)."""
        return self.positions.get(rollout_id, self.source.position).to_dict()

    # -- generation ------------------------------------------------------------------------------
    def _samples_for(self, batch: list[tuple[int, PromptRecord]], n: int) -> list[Sample]:
        return [Sample(rec.prompt_id, g, rec.prompt, list(rec.prompt_tokens), rec.label, dict(rec.metadata), epoch)
                for g, (epoch, rec) in enumerate(batch) for _ in range(n)]

    def _send(self, fn):
        """fn() (one generate request). Behind a PD router a 5xx answer (a prefill engine died
        mid-request, a KV transfer failed or met other weights: slime/rollout/engines/pd.py) is sent
        again for up to PD_RETRY_S seconds, while the fault monitor replaces the engine; the seeds
        make the retried request sample what the first would have, so no sample is lost or changed."""
        deadline = time.monotonic() + PD_RETRY_S
        delay = 0.5
        while True:
            try:
                return fn()
            except EngineRequestError as e:
                if not getattr(self, "pd", False) or e.status < 500 or time.monotonic() + delay > deadline:
                    raise
                self.pd_retries += 1
                print(f"[slime] PD request failed ({e}); sending it again in {delay:g} s", flush=True)
                time.sleep(delay)
                delay = min(delay * 2, 8.0)

    def _list_refused(self, e: EngineRequestError) -> bool:
        """A router that takes one sampling_params dict per request (sglang-router 0.3.x answers
        422 to a list): switch to shared-dict requests for the rest of the run."""
        if e.status != 422 or "sampling_params" not in e.message:
            return False
        if self.batched:
            print(f"[slime] the router {self.client.url} refuses a list of sampling_params ({e.message}); "
                  f"sending one sampling_params per request from now on", flush=True)
        self.batched = False
        return True

    def _generate_rows(self, prompts: list[list[int]], params: list[dict[str, Any]]) -> list[GenerateResult]:
        """Outputs of rows (prompt + its own params, each expanded by its n), in row order: one
        request when batched, else one request per set of equal params (plan_requests)."""
        if self.batched:
            try:
                return self.client.generate(prompts, params)
            except EngineRequestError as e:
                if not self._list_refused(e):
                    raise
        per_row: dict[int, list[GenerateResult]] = {}
        for rows in plan_requests(params):
            outs = self.client.generate([prompts[i] for i in rows], params[rows[0]])
            k = int(params[rows[0]].get("n", 1))
            if len(outs) != len(rows) * k:
                raise RuntimeError(f"router returned {len(outs)} outputs for {len(rows) * k} samples")
            for j, i in enumerate(rows):
                per_row[i] = outs[j * k:(j + 1) * k]
        return [o for i in range(len(prompts)) for o in per_row[i]]

    def _run_engines(self, samples: list[Sample], n: int, sp: SamplingConfig, seed_of) -> None:
        """Fill samples (groups of n consecutive) with responses: one request per engine share (at
        most --sglang-server-concurrency samples each), all through the router. Batched (our
        router): a sampling_params list with a seed per prompt. Otherwise (sglang-router) one
        sampling_params for the share, seeded by its first prompt; the engine offsets the seed per
        row. Either way a request the router retries on another engine samples the same."""
        groups = list(range(0, len(samples), n))
        limit = max(1, self.rollout.server_concurrency // n)
        # engines that generate: a PD pair counts once (its decode engine), as a regular engine does
        workers = max(1, sum(w["is_healthy"] for w in self.router.list_workers() if w.get("worker_type") != "prefill"))
        chunks = [list(r)[c:c + limit] for r in split_evenly(len(groups), workers)
                  for c in range(0, len(r), limit)]

        def run(chunk: list[int]) -> None:
            firsts = [samples[groups[i]] for i in chunk]
            prompts = [s.prompt_tokens for s in firsts]
            outs = None
            if self.batched:
                try:
                    outs = self._send(lambda: self.client.generate(
                        prompts, [sampling_params(sp, n, seed_of(s)) for s in firsts]))
                except EngineRequestError as e:
                    if not self._list_refused(e):
                        raise
            if outs is None:
                outs = self._send(lambda: self.client.generate(prompts, sampling_params(sp, n, seed_of(firsts[0]))))
            if len(outs) != len(chunk) * n:
                raise RuntimeError(f"router returned {len(outs)} outputs for {len(chunk) * n} samples")
            for k, i in enumerate(chunk):
                for j in range(n):
                    fill_sample(samples[groups[i] + j], outs[k * n + j])

        with ThreadPoolExecutor(max(1, len(chunks))) as pool:
            list(pool.map(run, chunks))

    def _run_hook(self, samples: list[Sample], sp: SamplingConfig, seed_of) -> None:
        run_generate_hook(self.generate_hook, self.ctx, samples, sp, seed_of)

    def generate(self, rollout_id: int) -> tuple[list[Sample], dict[str, float]]:
        if rollout_id in self.queued:  # generated before a restart, never trained: no regeneration
            assert self.queue is not None  # self.queued is filled from it
            payload = self.queue.get(self.queued[rollout_id])
            self.positions[rollout_id] = self.source.position
            self.buffers[rollout_id] = [[s.to_dict() for s in g] for g in self.buffer]
            self.source.position = DataPosition.from_dict(payload["position_after"])
            self.buffer = [[Sample.from_dict(d) for d in g] for g in payload["partial_after"]]
            if self.producers is not None:
                self.producers.ack(rollout_id)
            return [Sample.from_dict(d) for d in payload["samples"]], {**payload["metrics"], "rollout/from_queue": 1.0}
        t0 = time.monotonic()
        r = self.rollout
        pd_retries = self.pd_retries
        self.positions[rollout_id] = self.source.position
        self.buffers[rollout_id] = [[s.to_dict() for s in g] for g in self.buffer]
        seed_of = lambda s: sample_seed(r.seed, rollout_id, s.prompt_id)  # noqa: E731
        extra: dict[str, float] = {}
        if r.dynamic:
            samples, metrics, extra = self._generate_dynamic(rollout_id, seed_of)
            for i, s in enumerate(samples):  # ids of the rollout that trains them (resumed ones too)
                s.sample_id = sample_id(rollout_id, s.group_index, i % r.n_samples_per_prompt)
            t1 = time.monotonic()
        else:
            batch = self.source.next_batch(r.rollout_batch_size)
            samples = self._samples_for(batch, r.n_samples_per_prompt)
            for i, s in enumerate(samples):
                s.sample_id = sample_id(rollout_id, s.group_index, i % r.n_samples_per_prompt)
            if self.producers is not None:
                samples, extra = self._produce(rollout_id, samples, r.n_samples_per_prompt)
            elif self.generate_hook:
                self._run_hook(samples, r.sampling, seed_of)
            else:
                self._run_engines(samples, r.n_samples_per_prompt, r.sampling, seed_of)
            t1 = time.monotonic()
            metrics = self.scorer.score(samples, r.n_samples_per_prompt)
        from slime.metrics import rollout_metrics

        tokens = sum(s.response_length for s in samples)
        metrics = {**rollout_metrics(samples, metrics), **extra, "perf/rollout_time": t1 - t0,
                   "perf/reward_time": time.monotonic() - t1,
                   "perf/rollout_tokens_per_s": tokens / max(t1 - t0, 1e-9)}
        if self.pd:  # PD requests sent again after a 5xx (_send): an engine of a pair failed mid-request
            metrics["rollout/pd_retries"] = float(self.pd_retries - pd_retries)
        if r.rm_type == "deepscaler" and not r.custom_rm_path and metrics.get("rollout/no_think_block_ratio", 0) > 0:
            print(f"[slime] warning: rollout {rollout_id}: {metrics['rollout/no_think_block_ratio']:.0%} of responses "
                  f"have no </think>; deepscaler scores them 0 (use --rm-type math for non-reasoning models)",
                  flush=True)
        if self.queue is not None:  # durable before the trainer sees it (acked after the train step)
            self.queued[rollout_id] = self.queue.put({
                "kind": "rollout", "rollout_id": rollout_id, "samples": [s.to_dict() for s in samples],
                "metrics": metrics, "position_after": self.source.position.to_dict(),
                "partial_after": [[s.to_dict() for s in g] for g in self.buffer]})
            if self.producers is not None:  # the rollout is durable in the run's queue: groups may go
                self.producers.ack(rollout_id)
        return samples, metrics

    # -- over-sampling, dynamic filter, partial rollout ------------------------------------------
    def _generate_dynamic(self, rollout_id: int, seed_of) -> tuple[list[Sample], dict[str, float], dict[str, float]]:
        """Submit groups (one request each) in rounds of --over-sampling-batch-size; keep the first
        rollout_batch_size that finish and pass the filter; abort the rest on every engine, collect
        their partial outputs, and (--partial-rollout) buffer them for a later rollout."""
        r = self.rollout
        n, target = r.n_samples_per_prompt, r.rollout_batch_size
        per_round = max(r.over_sampling_batch_size or target, target)
        kept: list[list[Sample]] = []
        leftovers: list[list[Sample]] = []
        summaries: list[tuple[int, dict[str, float]]] = []
        st = {"filtered": 0, "rounds": 0, "resumed": 0, "fresh": 0}
        pending: set[Future] = set()
        budget = 4 * len(self.records) + 4 * per_round  # prompts this rollout may draw before giving up
        with ThreadPoolExecutor(max(1, min(64, r.server_concurrency // n, per_round))) as pool:
            while len(kept) < target:
                if not pending:
                    if st["fresh"] >= budget:
                        raise RuntimeError(
                            f"rollout {rollout_id}: {st['fresh']} prompts drawn and only {len(kept)} of {target} "
                            f"groups passed --dynamic-sampling-filter-path {r.dynamic_sampling_filter_path} "
                            f"({st['filtered']} dropped); the filter rejects nearly every group of this data")
                    st["rounds"] += 1
                    groups = [self.buffer.pop(0) for _ in range(min(per_round, len(self.buffer)))]
                    st["resumed"] += sum(s.status == Status.ABORTED for g in groups for s in g)
                    fresh = per_round - len(groups)
                    if fresh:
                        groups += [self._samples_for([b], n) for b in self.source.next_batch(fresh)]
                        st["fresh"] += fresh
                    pending = {pool.submit(self._run_group, g, seed_of) for g in groups}
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    group = f.result()
                    if len(kept) >= target:
                        leftovers.append(group)
                        continue
                    summaries.append((len(group), self.scorer.score(group, n)))
                    if self._keep(group):
                        kept.append(group)
                    else:
                        st["filtered"] += 1
            if pending:  # the target is reached: abort everything still running (partial output comes back)
                self._abort_engines()
                for f in wait(pending).done:
                    leftovers.append(f.result())
        aborted = sum(s.status == Status.ABORTED for g in leftovers for s in g)
        if r.partial_rollout:
            self.buffer.extend(leftovers)
        samples = []
        for g, group in enumerate(kept):
            for s in group:
                s.group_index = g
                samples.append(s)
        total = sum(k for k, _ in summaries) or 1
        keys = {key for _, d in summaries for key in d}
        metrics = {key: sum(k * d.get(key, 0.0) for k, d in summaries) / total for key in keys}
        newest = max((v for s in samples for v in s.token_versions), default=0)
        tokens = sum(len(s.token_versions) for s in samples)
        old = sum(v < newest for s in samples for v in s.token_versions)
        if r.mask_offpolicy_in_partial_rollout:
            for s in samples:
                s.loss_mask = [int(v >= newest) for v in s.token_versions]
        extra = {"rollout/filtered_groups": float(st["filtered"]), "rollout/aborted_samples": float(aborted),
                 "rollout/over_sampling_rounds": float(st["rounds"]),
                 "rollout/partial_resumed_samples": float(st["resumed"]),
                 "rollout/offpolicy_token_frac": old / max(tokens, 1),
                 "rollout/partial_buffer_groups": float(len(self.buffer))}
        return samples, metrics, extra

    def _keep(self, group: list[Sample]) -> bool:
        if self.filter_hook is None:
            return True
        from slime.rollout.filters import filter_keeps

        return filter_keeps(self.filter_hook(self.ctx, group))

    def _abort_engines(self) -> None:
        """POST /abort_request {"abort_all": true} to every engine (sglang-protocol.md section 3)."""
        for url in self.engine_urls():
            c = EngineClient(url, retries=2)
            try:
                c.abort(abort_all=True)
            finally:
                c.close()

    def _run_group(self, group: list[Sample], seed_of) -> list[Sample]:
        """Generate (or continue) one group. Fresh: one request, n samples. Resumed: each unfinished
        sample sends prompt + its partial tokens with the remaining budget, and is extended."""
        sp = self.rollout.sampling
        todo = [s for s in group if s.status in (Status.PENDING, Status.ABORTED)]
        if not todo:
            return group
        if all(s.status == Status.PENDING and not s.response_tokens for s in group):
            outs = self.client.generate([list(group[0].prompt_tokens)],
                                        sampling_params(sp, len(group), seed_of(group[0])))
            if len(outs) != len(group):
                raise RuntimeError(f"router returned {len(outs)} outputs for a group of {len(group)}")
            for s, out in zip(group, outs):
                extend_sample(s, out, self.tokenizer)
            return group
        rows, params = [], []
        for s in todo:
            left = sp.max_response_len - s.response_length
            if left <= 0:
                s.status = Status.TRUNCATED
                continue
            k = group.index(s)
            rows.append(s)
            params.append({**sampling_params(sp, 1, seed_of(s) + 7_919 * (k + 1) + s.response_length),
                           "max_new_tokens": left})
        if rows:
            outs = self._generate_rows([list(s.prompt_tokens) + list(s.response_tokens) for s in rows], params)
            if len(outs) != len(rows):
                raise RuntimeError(f"router returned {len(outs)} outputs for {len(rows)} resumed samples")
            for s, out in zip(rows, outs):
                extend_sample(s, out, self.tokenizer)
        return group

    def evaluate(self, rollout_id: int) -> dict[str, float]:
        from slime.metrics import EVAL_LENGTH_SUFFIX

        out = {}
        n = self.eval_cfg.n_samples_per_prompt
        for name, records in self.eval_sets.items():
            samples = self._samples_for([(0, rec) for rec in records], n)
            self._run_engines(samples, n, self.eval_cfg.sampling,
                              lambda s: sample_seed(self.rollout.seed + 1, rollout_id, s.prompt_id))
            scorer = self.scorer
            if self.rollout.group_rm:  # group hooks do not apply to eval: score with the sample form
                raise ValueError("--group-rm is not supported in evaluation; use --rm-type for eval")
            scorer.score(samples, n)
            out[f"eval/{name}"] = sum(s.reward or 0.0 for s in samples) / max(len(samples), 1)  # scored above
            out[f"eval/{name}{EVAL_LENGTH_SUFFIX}"] = sum(s.response_length for s in samples) / max(len(samples), 1)
        return out

    # -- engines (colocated phases) --------------------------------------------------------------
    def engine_urls(self) -> list[str]:
        return [w["url"] for w in self.router.list_workers()]
