"""straw with fully async: distributed producers (docs/en/fully-async.md#straw-with-fully-async).

train_async.py with --rollout-queue-dir runs --num-rollout-producers producer actors (default:
one per engine group), each placed beside its engine group. The rollout manager draws a rollout's
prompts, splits its groups over the producers, and assembles the rollout from what they wrote.

Layout: DIR/producers/<producer id>/ is an ordinary straw queue (slime/rollout/queue.py) of the run
id, owned by that producer. One queue per producer keeps straw's guarantees (a put that returned is
on disk until acked; sequence numbers unique) without any lock shared across nodes.

A record is one prompt group: {"rollout_id", "group_index", "prompt_id", "producer", "samples"};
every sample carries its run-unique `sample_id`. A producer skips the groups already durable in its
queue, so a producer killed mid-rollout is restarted on its queue and generates only the groups it
had not written (the one in flight is generated again, once). The consumer keeps one copy of each
group and acknowledges any other, so neither a kill nor a restarted consumer loses or duplicates a
group. The manager acknowledges a rollout's groups once the assembled rollout is durable in the
run's own queue (DIR/index.json).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from slime.rollout.queue import RolloutQueue

# (rollout id, group index, the group's samples as dicts) -> the generated samples as dicts
Generate = Callable[[int, int, list[dict[str, Any]]], list[dict[str, Any]]]


def producer_count(cfg) -> int:
    """Producer actors of this run: --num-rollout-producers, else one per engine group under
    straw + train_async.py with the plain rollout, else 1 (the rollout manager generates itself)."""
    r, c = cfg.rollout, cfg.cluster
    if r.num_producers is not None:
        return r.num_producers
    if not (cfg.async_mode and r.queue_dir and r.queue_run_id) or r.dynamic:
        return 1
    if not c.external and c.rollout_num_gpus_per_engine < 1:
        return 1
    return c.num_engines


def producer_engine(k: int, n: int, engines: int) -> int:
    """The engine group producer k of n sits beside (spread evenly over the engines)."""
    return k * max(engines, 1) // max(n, 1)


def producer_ids(n: int) -> list[str]:
    return [f"p{k}" for k in range(n)]


def producer_actor_name(run_id: str, producer_id: str) -> str:
    """The Ray actor name of a producer (ray.get_actor finds it, e.g. to watch or stop it)."""
    return f"slime-producer-{run_id}-{producer_id}"


def producer_dir(root: str | Path, producer_id: str) -> Path:
    return Path(root) / "producers" / producer_id


def sample_id(rollout_id: int, group_index: int, k: int) -> str:
    return f"r{rollout_id}/g{group_index}/s{k}"


class ProducerStore:
    """One producer's durable queue of groups."""

    def __init__(self, root: str | Path, run_id: str, producer_id: str):
        self.producer_id = producer_id
        self.queue = RolloutQueue(producer_dir(root, producer_id), run_id)

    def records(self, rollout_id: int | None = None) -> list[tuple[int, dict[str, Any]]]:
        return [(seq, p) for seq, p in self.queue.pending() if rollout_id is None or p["rollout_id"] == rollout_id]

    def put_group(self, rollout_id: int, group_index: int, prompt_id: Any, samples: list[dict[str, Any]]) -> int:
        return self.queue.put({"rollout_id": rollout_id, "group_index": group_index, "prompt_id": prompt_id,
                               "producer": self.producer_id, "samples": samples})

    def ack(self, seqs: list[int]) -> None:
        for seq in seqs:
            self.queue.ack(seq)

    def close(self) -> None:
        self.queue.close()


class Producer:
    """The Ray actor body: generates its share of a rollout's groups into its store, `workers`
    groups at a time (a group is durable before its thread takes the next one)."""

    def __init__(self, root: str, run_id: str, producer_id: str, generate: Generate, workers: int = 1):
        self.store = ProducerStore(root, run_id, producer_id)
        self.generate, self.workers = generate, max(1, workers)
        prepare = getattr(generate, "prepare", None)
        if prepare is not None:  # imports and hook loading now, not in the first rollout
            prepare()

    def describe(self) -> dict[str, Any]:
        import ray

        return {"producer": self.store.producer_id, "pid": os.getpid(),
                "node": ray.get_runtime_context().get_node_id()}

    def produce(self, rollout_id: int, tasks: dict[int, list[dict[str, Any]]]) -> list[int]:
        """Generate and durably put every group of `tasks` (group index -> its samples) that is not
        in the queue yet; returns the groups this call generated. A durable copy made for another
        prompt (a rollout drawn differently before a restart) is dropped and made again."""
        done: set[int] = set()
        for seq, rec in self.store.records(rollout_id):
            task = tasks.get(rec["group_index"])
            if task is not None and rec.get("prompt_id") == task[0]["prompt_id"] and \
                    len(rec["samples"]) == len(task):
                done.add(rec["group_index"])
            elif task is not None:
                self.store.ack([seq])
        todo = [g for g in sorted(tasks) if g not in done]

        def one(g: int) -> int:
            self.store.put_group(rollout_id, g, tasks[g][0]["prompt_id"], self.generate(rollout_id, g, tasks[g]))
            return g

        with ThreadPoolExecutor(min(self.workers, max(len(todo), 1))) as pool:
            return list(pool.map(one, todo))

    def take(self, rollout_id: int) -> list[tuple[int, dict[str, Any]]]:
        return self.store.records(rollout_id)

    def ack_rollouts(self, below: int, also: list[int]) -> int:
        """Drop every record of a rollout id < `below` or in `also` (trained, or kept elsewhere)."""
        seqs = [seq for seq, p in self.store.records() if p["rollout_id"] < below or p["rollout_id"] in also]
        self.store.ack(seqs)
        return len(seqs)

    def ack(self, seqs: list[int]) -> None:
        self.store.ack(seqs)

    def close(self) -> None:
        self.store.close()


class RouterGenerator:
    """What a producer generates with: a group through the router, exactly as the rollout manager
    sends it (one request of n samples, the same seeds), or the --custom-generate-function-path hook."""

    def __init__(self, rollout, hf_checkpoint: str, router_url: str):
        self.rollout, self.hf_checkpoint, self.router_url = rollout, hf_checkpoint, router_url
        self._ctx = None
        self._hook = None

    def __getstate__(self) -> dict[str, Any]:  # the connections are made in the producer's process
        return {**self.__dict__, "_ctx": None, "_hook": None}

    def prepare(self) -> None:
        self._setup()

    def _setup(self):
        if self._ctx is None:
            from slime.rollout.client import EngineClient, RouterAdmin
            from slime.rollout.generate import LazyTokenizerContext

            if self.rollout.custom_generate_function_path:
                from slime.rewards.hooks import load_function

                self._hook = load_function(self.rollout.custom_generate_function_path, kind="generate")
            self._ctx = LazyTokenizerContext(self.rollout, None, EngineClient(self.router_url, retries=8),
                                             RouterAdmin(self.router_url))
            self._ctx.hf_checkpoint = self.hf_checkpoint
        return self._ctx

    def __call__(self, rollout_id: int, group_index: int, samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
        from slime.data.sample import Sample
        from slime.rollout.generate import fill_sample, run_generate_hook, sample_seed, sampling_params

        ctx, r = self._setup(), self.rollout
        group = [Sample.from_dict(d) for d in samples]
        seed_of = lambda s: sample_seed(r.seed, rollout_id, s.prompt_id)  # noqa: E731
        if self._hook is not None:
            run_generate_hook(self._hook, ctx, group, r.sampling, seed_of, first=group_index * len(group))
            for s, d in zip(group, samples):  # the ids are the consumer's, whatever the hook returned
                s.prompt_id, s.group_index, s.sample_id = d["prompt_id"], d["group_index"], d["sample_id"]
        else:
            outs = ctx.client.generate([list(group[0].prompt_tokens)],
                                       sampling_params(r.sampling, len(group), seed_of(group[0])))
            if len(outs) != len(group):
                raise RuntimeError(f"router returned {len(outs)} outputs for a group of {len(group)}")
            for s, out in zip(group, outs):
                fill_sample(s, out)
        return [s.to_dict() for s in group]


class ProducerGroup:
    """The consumer: one producer actor per id (placed by `actor_options`, one dict per producer),
    a rollout's groups split over them round-robin, a dead producer restarted with the same id on
    the same queue and given its share again."""

    def __init__(self, root: str | Path, run_id: str, ids: list[str], generate: Generate,
                 actor_options: list[dict[str, Any]] | None = None, max_restarts: int = 3, workers: int = 1):
        import ray

        self.root, self.run_id, self.ids, self.generate = str(root), run_id, list(ids), generate
        self.options = {pid: {"num_cpus": 0, **((actor_options or [{}] * len(self.ids))[k] or {}),
                              "name": producer_actor_name(run_id, pid)} for k, pid in enumerate(self.ids)}
        self.workers = workers
        self.remote = ray.remote(Producer)
        self.max_restarts = max_restarts
        self.restarts = {pid: 0 for pid in self.ids}  # over the run (rollout/producer_restarts)
        self._rollout_restarts = dict(self.restarts)  # within the rollout being collected: bounded
        self.actors = {pid: self._start(pid) for pid in self.ids}
        self._taken: dict[int, dict[str, list[int]]] = {}

    def _start(self, pid: str):
        return self.remote.options(**self.options[pid]).remote(self.root, self.run_id, pid, self.generate,
                                                              self.workers)

    def _restart(self, pid: str) -> None:
        import ray

        self.restarts[pid] += 1
        self._rollout_restarts[pid] += 1
        if self._rollout_restarts[pid] > self.max_restarts:
            raise RuntimeError(f"straw producer {pid} died {self._rollout_restarts[pid]} times in one rollout; "
                               f"giving up (its node or its engine group is failing: see the Ray logs)")
        ray.kill(self.actors[pid], no_restart=True)
        deadline = time.monotonic() + 60
        while True:  # the dead process's name and queue lock are released once it is gone
            try:
                actor = self._start(pid)
                ray.get(actor.take.remote(-1))
                break
            except (ray.exceptions.RayActorError, ValueError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self.actors[pid] = actor
        print(f"[slime] straw producer {pid} died; restarted on its queue ({self.restarts[pid]} restart(s))",
              flush=True)

    def share(self, groups: list[int]) -> dict[str, list[int]]:
        return {pid: [g for i, g in enumerate(sorted(groups)) if i % len(self.ids) == k]
                for k, pid in enumerate(self.ids)}

    def _call(self, pid: str, method: str, *args: Any) -> Any:
        import ray

        while True:
            try:
                return ray.get(getattr(self.actors[pid], method).remote(*args))
            except ray.exceptions.RayActorError:
                self._restart(pid)

    def collect(self, rollout_id: int, tasks: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
        """Every group of `tasks` exactly once, in group order (producing what is missing)."""
        import ray

        self._rollout_restarts = {pid: 0 for pid in self.ids}
        shares = {pid: {g: tasks[g] for g in gs} for pid, gs in self.share(list(tasks)).items()}
        pending = {pid: self.actors[pid].produce.remote(rollout_id, share) for pid, share in shares.items()}
        for pid, ref in pending.items():
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:  # killed mid-share: restart, give it the rest again
                self._call(pid, "produce", rollout_id, shares[pid])
        best: dict[int, dict[str, Any]] = {}
        taken: dict[str, list[int]] = {}
        extra: dict[str, list[int]] = {}
        for pid in self.ids:
            for seq, rec in self._call(pid, "take", rollout_id):
                g = rec["group_index"]
                if g in best or g not in tasks or rec.get("prompt_id") != tasks[g][0]["prompt_id"]:
                    extra.setdefault(pid, []).append(seq)  # a second copy, or not this rollout's: drop
                    continue
                best[g] = rec
                taken.setdefault(pid, []).append(seq)
        for pid, seqs in extra.items():
            self._call(pid, "ack", seqs)
        missing = sorted(set(tasks) - set(best))
        if missing:
            raise RuntimeError(f"rollout {rollout_id}: groups {missing} were not produced")
        self._taken[rollout_id] = taken
        return [best[g] for g in sorted(tasks)]

    def ack(self, rollout_id: int) -> None:
        """The rollout is safe elsewhere (trained, or durable in the run's queue): its groups leave
        every producer's queue, including copies collect() never saw."""
        self._taken.pop(rollout_id, None)
        for pid in self.ids:
            self._call(pid, "ack_rollouts", -1, [rollout_id])

    def discard(self, below: int, also: list[int]) -> int:
        """On start: drop groups of rollouts already trained (< below) or already assembled (`also`)."""
        return sum(self._call(pid, "ack_rollouts", below, list(also)) for pid in self.ids)

    def close(self) -> None:
        import ray

        for actor in self.actors.values():
            try:
                ray.get(actor.close.remote(), timeout=10)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                pass
            ray.kill(actor, no_restart=True)
