"""Engines behind one protocol: the router, external engines, broadcast/disk weight sync in the
three ownership modes, and an engine killed mid-rollout (real embedded engines over HTTP)."""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter

import httpx
import pytest
import torch

from slime.inference.engine_core import EngineCore
from slime.rollout.client import EngineClient, RouterAdmin
from slime.rollout.engines.embedded import EngineServer
from slime.rollout.engines.external import check_engine
from slime.rollout.router import RouterServer
from tests.refusal_codes import has
from tests.runtime.conftest import tiny_flags

PROMPT = [2, 8, 11, 6, 3]


def test_router_spreads_caps_keeps_sessions_and_retries_a_dead_engine(tiny, two_servers):
    router = RouterServer(concurrency=1, retry_timeout=10)
    url = router.start()
    try:
        admin = RouterAdmin(url)
        for s in two_servers:
            admin.add_worker(s.url)
        client = EngineClient(url)
        params = {"max_new_tokens": 2, "sampling_seed": 1}
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(6) as pool:
            outs = list(pool.map(lambda _: client.generate([PROMPT], params)[0], range(6)))
        assert all(o.finish_type in ("stop", "length") for o in outs)
        served = {w["url"]: w["served"] for w in admin.list_workers()}
        assert all(v >= 1 for v in served.values()), served  # least-load spread both
        # Session affinity: one key always lands on one engine.
        for key in ("session-a", "session-b", "session-c"):
            before = {w["url"]: w["served"] for w in admin.list_workers()}
            for _ in range(3):
                client.generate([PROMPT], params, routing_key=key)
            after = {w["url"]: w["served"] for w in admin.list_workers()}
            assert sorted(after[u] - before[u] for u in after) == [0, 3]
        # An engine whose server is gone: its requests are retried on the other one.
        dead = EngineServer(EngineCore(str(tiny["model"]), seed=5))
        dead.start()
        admin.add_worker(dead.url)
        dead.stop()
        for _ in range(4):
            assert client.generate([PROMPT], params)[0].finish_type in ("stop", "length")
        ws = {w["url"]: w for w in admin.list_workers()}
        assert ws[dead.url]["is_healthy"] is False
        assert httpx.get(url + "/workers").json()["stats"]["retried_requests"] >= 1
        admin.remove_worker(dead.url)
        assert dead.url not in {w["url"] for w in admin.list_workers()}
    finally:
        router.stop()


def test_external_engine_check_names_the_engine_and_the_mismatch(tiny, two_servers, tmp_path):
    addr = two_servers[0].url.removeprefix("http://")
    assert check_engine(addr, str(tiny["model"]), "broadcast") == []
    other = tmp_path / "other-model"
    shutil.copytree(tiny["model"], other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLM"]
    (other / "config.json").write_text(json.dumps(cfg))
    problems = check_engine(addr, str(other), "tensor")
    assert any(addr in p and "LlamaForCausalLM" in p for p in problems), problems
    assert has(problems, "external.model_path", addr=addr) and has(problems, "external.tensor", addr=addr)
    assert "unreachable" in check_engine("127.0.0.1:1", str(tiny["model"]), "disk")[0]


# -- Ray: the loop in the three ownership modes -------------------------------------------------------
def _metrics(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.ray
@pytest.mark.timeout(240)
def test_disaggregated_broadcast_sync_and_engine_killed_mid_rollout_loses_no_sample(tiny, ray_cluster, tmp_path):
    import ray

    from slime.args import parse_args
    from slime.ray.runtime import Runtime

    flags = tiny_flags(tiny, tmp_path, "--num-rollout", "2", "--update-weight-transport", "nccl",
                       "--use-fault-tolerance", "--rollout-health-check-interval", "0.5",
                       "--rollout-health-check-timeout", "10", "--update-weight-buffer-size", "65536")
    flags[flags.index("--rollout-num-gpus") + 1] = "2"
    rt = Runtime.start(parse_args(flags))
    try:
        assert rt.sync.transport == "broadcast" and rt.sync.backend == "gloo"
        assert all(d <= 1e-4 for d in rt.sync.last_check.values()) and len(rt.sync.last_check) == 2
        victim = rt.engines[0]
        # The victim decodes so slowly that a request it holds cannot finish before the kill lands
        # (at 0.2 s a step it once finished first, and nothing was left to retry).
        ray.get([victim.actor.set_step_delay.remote(3.0), rt.engines[1].actor.set_step_delay.remote(0.2)])
        fut = rt.generate_async(0)
        admin = RouterAdmin(rt.router_url)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # kill it while it holds a request
            if any(w["url"] == victim.url and w["load"] > 0 for w in admin.list_workers()):
                break
            time.sleep(0.01)
        else:
            pytest.fail("engine 0 never received a request")
        ray.kill(victim.actor)
        ray.get(rt.engines[1].actor.set_step_delay.remote(0.0))
        samples, _ = ray.get(fut)
        ids = Counter((s.prompt_id, s.group_index) for s in samples)
        assert len(samples) == 16 and len(ids) == 4 and set(ids.values()) == {4}
        assert all(s.response_tokens and s.status.value != "aborted" for s in samples)
        assert httpx.get(rt.router_url + "/workers").json()["stats"]["retried_requests"] >= 1
        deadline = time.monotonic() + 90
        while rt.monitor.restarts < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert rt.monitor.restarts == 1, rt.monitor.errors
        new = rt.engines[0]
        assert new.url != victim.url and new.url in {w["url"] for w in admin.list_workers()}
        assert new.client.model_info()["weight_version"] == str(rt.version)  # re-synced
        # The loop goes on: train, broadcast to a group rebuilt with the new engine, sample.
        rt.train(rt.build_records(samples))
        rt.sync_weights()
        samples, metrics = rt.generate(1)
        assert len(samples) == 16 and {s.weight_version for s in samples} == {str(rt.version)}
    finally:
        rt.shutdown()


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_colocated_with_disk_sync(tiny, ray_cluster, tmp_path):
    from train import main

    main(tiny_flags(tiny, tmp_path, "--num-rollout", "1", "--colocate", "--update-weight-transport", "disk",
                    "--update-weight-disk-dir", str(tmp_path / "weights"), "--update-weight-buffer-size", "65536"))
    (row,) = _metrics(tmp_path)
    assert row["rollout/num_samples"] == 16 and row["perf/sync_time"] > 0


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_external_engine_with_broadcast_sync(tiny, ray_cluster, tmp_path):
    """An engine the test starts itself, outside the trainer's placement, on 127.0.0.1."""
    from train import main

    torch.set_num_threads(1)
    core = EngineCore(str(tiny["model"]), seed=9)
    server = EngineServer(core)
    server.start()
    try:
        flags = tiny_flags(tiny, tmp_path, "--num-rollout", "2", "--update-weight-transport", "nccl",
                           "--rollout-external-engine-addrs", server.url.removeprefix("http://"))
        i = flags.index("--rollout-num-gpus")
        del flags[i:i + 2]
        main(flags)
        rows = _metrics(tmp_path)
        assert [r["rollout/num_samples"] for r in rows] == [16, 16]
        assert core.weight_version == "3"  # start-up sync + one per rollout, by broadcast
    finally:
        server.stop()
