"""straw with fully async: distributed producers on local Ray. A producer killed mid-rollout is
restarted on its own queue; no sample is lost or duplicated, and the run goes on.

The building-block test makes groups with a small deterministic function standing in for the engines
(the property under test is the queue's, not the sampler's); the train_async.py test runs the whole
loop on the tiny model with two embedded engines. Actors, kills, files and locks are real.
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.refusal_codes import codes, has
from tests.runtime.conftest import tiny_flags

HOOK = "tests.runtime.fixtures_hooks.producer_hooks.slow_generate"


# -- the flag: read by the runtime, refused where it makes no sense --------------------------------

def _cfg(*extra: str, async_mode: bool = True, engines: int = 2):
    from slime.args import parse_args

    return parse_args(["--hf-checkpoint", "/m", "--prompt-data", "/d.jsonl", "--rm-type", "math",
                       "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--num-rollout", "2",
                       "--rollout-num-gpus", str(engines), *extra], async_mode=async_mode)


def _errors(cfg) -> list[str]:
    from slime.args import validate

    return [e for e in validate(cfg, environment=False) if "producer" in e]


def test_straw_with_fully_async_runs_one_producer_per_engine_group_by_default(tmp_path):
    from slime.rollout.producers import producer_count

    straw = ("--rollout-queue-dir", str(tmp_path / "q"), "--rollout-queue-run-id", "run-1")
    assert producer_count(_cfg(*straw)) == 2
    assert producer_count(_cfg(*straw, engines=3)) == 3
    assert producer_count(_cfg()) == 1  # no queue: the rollout manager generates
    assert producer_count(_cfg(*straw, async_mode=False)) == 1  # train.py
    assert producer_count(_cfg(*straw, "--over-sampling-batch-size", "8")) == 1  # aborts span the rollout
    assert producer_count(_cfg(*straw, "--num-rollout-producers", "1")) == 1


def test_a_producer_count_that_makes_no_sense_is_refused_with_the_fix(tmp_path):
    straw = ("--rollout-queue-dir", str(tmp_path / "q"), "--rollout-queue-run-id", "run-1")
    assert _errors(_cfg(*straw, "--num-rollout-producers", "2")) == []
    assert codes(_errors(_cfg(*straw, "--num-rollout-producers", "2", async_mode=False)))[:1] == ["args.producers_sync"]
    assert codes(_errors(_cfg("--num-rollout-producers", "2")))[:1] == ["args.producers_queue"]
    assert has(_errors(_cfg(*straw, "--num-rollout-producers", "3"))[:1], "args.producers_engines", n=3, engines=2)
    assert codes(_errors(_cfg(*straw, "--num-rollout-producers", "0")))[:1] == ["args.producers_min"]
    assert codes(_errors(_cfg(*straw, "--num-rollout-producers", "2", "--partial-rollout")))[:1] == ["args.producers_dynamic"]


def test_the_placement_plan_lists_each_producer_beside_its_engine_group(tmp_path):
    from slime.dry_run import dry_run
    from slime.ray.placement import format_plan

    argv = ["--hf-checkpoint", "/m", "--prompt-data", "/d.jsonl", "--rm-type", "math", "--num-rollout", "2",
            "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--actor-num-gpus-per-node", "2",
            "--rollout-num-gpus", "4", "--rollout-num-gpus-per-engine", "2", "--rollout-backend", "sglang",
            "--rollout-queue-dir", str(tmp_path / "q"), "--rollout-queue-run-id", "run-1"]
    plan = dry_run(argv, async_mode=True, environment=False).plan
    engines = {s.index: s.node for s in plan if s.role == "engine"}
    producers = [s for s in plan if s.role == "producer"]
    assert [(p.index, p.beside) for p in producers] == [(0, 0), (1, 1)]
    assert all(p.node == engines[p.beside] and p.gpus == () for p in producers)
    assert "straw producer 1" in "\n".join(format_plan(plan))
    assert not [s for s in dry_run(argv, async_mode=False, environment=False).plan if s.role == "producer"]


# -- the building block: ProducerGroup with a stand-in generator -----------------------------------

def _make_generate(markers: Path, slow: float):
    def generate(rollout_id: int, group: int, task: list[dict]) -> list[dict]:
        (markers / f"{rollout_id}-{group}-{os.getpid()}-{time.monotonic_ns()}").touch()
        time.sleep(slow)
        return [{**d, "response": f"r{rollout_id}g{group}s{k}"} for k, d in enumerate(task)]
    return generate


def _tasks(rollout_id: int, n_groups: int) -> dict[int, list[dict]]:
    return {g: [{"prompt_id": 100 * rollout_id + g, "sample_id": f"r{rollout_id}/g{g}/s{k}"} for k in range(4)]
            for g in range(n_groups)}


@pytest.mark.ray
@pytest.mark.slow
def test_a_producer_killed_mid_rollout_loses_and_duplicates_no_group(ray_cluster, tmp_path):
    from slime.rollout.producers import ProducerGroup

    ray = ray_cluster
    markers = tmp_path / "markers"
    markers.mkdir()
    group = ProducerGroup(tmp_path / "queue", "run-1", ["node0", "node1"], _make_generate(markers, 0.4))
    n = 8
    tasks = _tasks(0, n)
    shares = group.share(list(tasks))
    refs = {pid: group.actors[pid].produce.remote(0, {g: tasks[g] for g in gs}) for pid, gs in shares.items()}
    victim_groups = set(shares["node1"])

    def made(gs):
        return [m for m in markers.iterdir() if int(m.name.split("-")[1]) in gs]

    deadline = time.monotonic() + 60
    while len(made(victim_groups)) < 3:  # two of node1's groups are on disk, the third is being made
        assert time.monotonic() < deadline, "node1 never started producing"
        time.sleep(0.05)
    ray.kill(group.actors["node1"], no_restart=True)
    ray.get(refs["node0"])
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(refs["node1"])

    records = group.collect(0, tasks)  # restarts node1 on its queue and lets it finish its share
    assert [r["group_index"] for r in records] == list(range(n))
    ids = [s["sample_id"] for r in records for s in r["samples"]]
    assert sorted(ids) == sorted(d["sample_id"] for t in tasks.values() for d in t)
    assert group.restarts["node1"] == 1
    per_group = {g: len(made({g})) for g in range(n)}
    # groups durable before the kill were not made again; the one in flight was made exactly twice
    assert sorted(per_group.values()) == [1] * (n - 1) + [2]

    # a consumer that restarts before acking sees the same groups, generated by nobody again
    before = len(list(markers.iterdir()))
    group.close()
    again = ProducerGroup(tmp_path / "queue", "run-1", ["node0", "node1"], _make_generate(markers, 0.0))
    assert again.collect(0, tasks) == records
    assert len(list(markers.iterdir())) == before
    again.ack(0)
    assert again.collect(1, _tasks(1, 2))[0]["rollout_id"] == 1  # acked rollout 0 is gone; the next is new
    assert again._call("node0", "take", 0) == [] and again._call("node1", "take", 0) == []
    again.close()


# -- the done-when: train_async.py with two producers, one killed mid-rollout ----------------------

def _kill_mid_rollout(ray, run_id: str, markers: Path, rollout_id: int, out: dict) -> None:
    """Wait for producer p1 to be generating its second group of `rollout_id` (so its first one is
    durable), then kill it; `out` says which process died and when."""
    from slime.rollout.producers import producer_actor_name

    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                victim = ray.get_actor(producer_actor_name(run_id, "p1"))
                pid = ray.get(victim.describe.remote())["pid"]
                break
            except ValueError:
                assert time.monotonic() < deadline, "producer p1 never started"
                time.sleep(0.1)
        prefix = f"r{rollout_id}_"
        while True:
            groups = {m.name.split("_")[1] for m in markers.glob(f"{prefix}*-{pid}-*")} if markers.is_dir() else set()
            if len(groups) >= 2:
                break
            assert time.monotonic() < deadline, f"producer p1 never reached its second group of rollout {rollout_id}"
            time.sleep(0.01)
        ray.kill(victim, no_restart=True)
        out.update(pid=pid, groups=groups)
    except BaseException as e:  # noqa: BLE001 - reported by the test thread
        out["error"] = e


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_train_async_with_two_producers_loses_and_duplicates_nothing_when_one_is_killed(tiny, ray_cluster, tmp_path):
    import importlib

    from slime.rollout.queue import RolloutQueue

    ray = ray_cluster
    q, markers, dump = tmp_path / "straw", tmp_path / "markers", str(tmp_path / "dump" / "rollout_{rollout_id}.jsonl")
    flags = tiny_flags(tiny, tmp_path, "--num-rollout", "3", "--rollout-queue-dir", str(q),
                       "--rollout-queue-run-id", "prod-1", "--num-rollout-producers", "2",
                       "--custom-generate-function-path", HOOK, "--sglang-server-concurrency", "4",
                       "--save-debug-rollout-data", dump)
    flags[flags.index("--rollout-num-gpus") + 1] = "2"  # two engine groups: one producer beside each
    killed: dict = {}
    watcher = threading.Thread(target=_kill_mid_rollout, args=(ray, "prod-1", markers, 1, killed), daemon=True)
    watcher.start()
    importlib.import_module("train_async").main(flags)
    watcher.join(timeout=5)
    assert "error" not in killed, killed.get("error")
    assert killed.get("pid"), "the producer was never killed"

    # the run went on: every rollout trained, the restart counted in the rollout it hit
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout_id"] for r in rows] == [0, 1, 2]
    assert [r["rollout/producer_restarts"] for r in rows] == [0.0, 1.0, 0.0]
    assert all(r["rollout/producers"] == 2.0 for r in rows)

    # what the trainer consumed: every prompt of every rollout once, each with its 4 samples once
    seen_prompts: list[int] = []
    for r in range(3):
        lines = [json.loads(x) for x in Path(dump.format(rollout_id=r)).read_text().splitlines()]
        groups = Counter((s["group_index"], s["prompt_id"]) for s in lines)
        assert sorted(g for g, _ in groups) == [0, 1, 2, 3] and set(groups.values()) == {4}
        assert sorted(s["sample_id"] for s in lines) == sorted(f"r{r}/g{g}/s{k}" for g in range(4) for k in range(4))
        assert all(s["response_tokens"] for s in lines)
        seen_prompts += [p for _, p in groups]
    assert len(seen_prompts) == len(set(seen_prompts)) == 12  # no prompt lost or repeated across rollouts

    # rollout 1's in-flight group was generated again exactly once, by the restarted producer;
    # the victim's durable group and the other producer's groups were generated once
    attempts: dict[str, set[str]] = {}
    for m in markers.glob("r1_*"):
        group, pid = m.name.split("_")[1], m.name.rsplit("-", 2)[1]
        attempts.setdefault(group, set()).add(pid)
    in_flight = sorted(killed["groups"])[-1]
    assert {g: len(p) for g, p in attempts.items()} == {f"g{g}": 2 if f"g{g}" == in_flight else 1 for g in range(4)}

    # nothing is left in any queue: trained rollouts were acked, assembled groups dropped
    for path in [q, q / "producers" / "p0", q / "producers" / "p1"]:
        queue = RolloutQueue(path, "prod-1")
        assert list(queue.pending()) == [], path
        queue.close()


# -- the lab: one field, exported as the flag, judged by the runtime --------------------------------

def test_the_lab_exports_the_producer_count_and_shows_the_runtimes_verdict_and_plan():
    from lab.core.argv import runtime_argv
    from lab.rules.applicability import folded_fields
    from lab.rules.dependents import apply_change, new_experiment
    from lab.rules.runtime_verdict import placement, runtime_findings

    exp = new_experiment("glm4-9b")
    assert "rollout.producers" in folded_fields(exp, None)  # no straw + fully async: nothing to set
    for path, value in {"placement.scheduling": "async", "rollout.queue": True,
                        "rollout.queue_state_dir": "/tmp/straw"}.items():
        exp, _ = apply_change(exp, path, value)
    assert "rollout.producers" not in folded_fields(exp, None)
    plan = placement(exp)
    engines = [s for s in plan if s["role"] in ("engine", "prefill", "decode")]
    producers = [s for s in plan if s["role"] == "producer"]
    assert len(producers) == len(engines) >= 2  # the runtime's default: one beside each engine group
    assert all("beside engine" in s["where"] for s in producers)
    assert "--num-rollout-producers" not in runtime_argv(exp)

    exp, _ = apply_change(exp, "rollout.producers", len(engines) + 1)
    argv = runtime_argv(exp)
    assert argv[argv.index("--num-rollout-producers") + 1] == str(len(engines) + 1)
    refused = [f for f in runtime_findings(exp) if f.id == "RUNTIME" and "rollout.producers" in f.fields]
    assert refused and refused[0].level == "error" and refused[0].params["code"] == "args.producers_engines"


# -- placement on GPU bundles: a separate Ray instance that declares logical GPUs -------------------

_GPU_PLACEMENT = r"""
import json, os, sys
import ray
os.environ["RAY_AUTH_MODE"] = "disabled"
# 4 logical GPUs: Ray only counts them, which is all placement needs (no CUDA is touched)
sys.path.insert(0, sys.argv[1])
from tests.runtime.ray_local import start_local_ray
start_local_ray(ray, sys.argv[1], num_gpus=4)
from slime.config import ClusterConfig
from slime.ray.placement import create_pools, placement_plan, producer_actor_options
from slime.rollout.producers import Producer

c = ClusterConfig(actor_num_gpus_per_node=1, rollout_num_gpus=2, rollout_num_gpus_per_engine=1,
                  num_gpus_per_node=4, cpus_per_bundle=0.25, use_gpu=True)
train, rollout = create_pools(c)
opts = producer_actor_options(c, rollout, 2, c.num_engines)
def make(rollout_id, group, task):
    return task
actors = [ray.remote(Producer).options(**o).remote(sys.argv[2], "run-1", f"p{k}", make) for k, o in enumerate(opts)]
where = ray.get([a.__ray_call__.remote(lambda self: (ray.get_gpu_ids(), ray.get_runtime_context().get_placement_group_id()))
                 for a in actors])
made = ray.get(actors[1].produce.remote(0, {3: [{"prompt_id": 7, "sample_id": "r0/g3/s0"}]}))
print(json.dumps({"gpus": [w[0] for w in where], "pgs": [w[1] for w in where], "rollout_pg": rollout.pg.id.hex(),
                  "bundles": [o["scheduling_strategy"].placement_group_bundle_index for o in opts],
                  "made": made, "free": ray.available_resources().get("GPU")}))
"""


@pytest.mark.ray
@pytest.mark.slow
def test_producers_sit_in_their_engine_groups_gpu_bundles_without_taking_a_gpu(tmp_path):
    import subprocess
    import sys

    from tests.runtime.conftest import REPO

    out = subprocess.run([sys.executable, "-c", _GPU_PLACEMENT, str(REPO), str(tmp_path / "q")], capture_output=True,
                         text=True, timeout=240, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["bundles"] == [0, 1]  # producer k in engine k's bundle
    assert got["pgs"] == [got["rollout_pg"]] * 2 and got["gpus"] == [[], []]
    assert got["made"] == [3] and got["free"] == 4 - 1 - 2  # the trainer's and the engines' GPUs only
