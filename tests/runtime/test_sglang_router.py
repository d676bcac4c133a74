"""The real sglang-router (0.3.2, PyPI) in front of embedded engines: the requests the rollout
client sends, streaming, load reporting, PD refusal, worker ids, abort, and whole runs through it
(engine killed mid-rollout, weight sync while generation is in flight)."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import httpx
import pytest

pytest.importorskip("sglang_router")

from slime.rollout.client import EngineClient, EngineRequestError, RouterAdmin  # noqa: E402
from slime.rollout.router import SGLangRouterProcess, sglang_router_argv  # noqa: E402
from tests.refusal_codes import has  # noqa: E402
from tests.runtime.conftest import tiny_flags  # noqa: E402

PROMPT = [2, 8, 11, 6, 3]


@pytest.fixture(scope="module")
def engines(two_servers):
    return two_servers


@pytest.fixture(scope="module")
def router(engines, tmp_path_factory):
    proc = SGLangRouterProcess(policy="round_robin", log_path=str(tmp_path_factory.mktemp("router") / "router.log"))
    url = proc.start()
    admin = RouterAdmin(url)
    ids = [admin.add_worker(s.url) for s in engines]
    admin.wait_workers([s.url for s in engines], timeout=60)
    yield {"url": url, "admin": admin, "ids": ids, "proc": proc}
    proc.stop()


def test_router_policy_belongs_to_the_chosen_router(tiny, tmp_path):
    from slime.args import parse_args, validate

    cfg = parse_args(tiny_flags(tiny, tmp_path, "--use-sglang-router", "--num-rollout", "1"))
    assert cfg.cluster.use_sglang_router and cfg.cluster.router_policy == "cache_aware" and not validate(cfg)
    assert parse_args(tiny_flags(tiny, tmp_path)).cluster.router_policy == "least_load"
    errors = validate(parse_args(tiny_flags(tiny, tmp_path, "--router-policy", "cache_aware")))
    assert has(errors, "args.router_slime", policy="cache_aware"), errors
    errors = validate(parse_args(tiny_flags(tiny, tmp_path, "--use-sglang-router", "--router-policy", "least_load")))
    assert has(errors, "args.router_sglang", policy="least_load"), errors


def test_router_command_carries_policy_workers_and_health_settings():
    argv = sglang_router_argv("127.0.0.1", 30001, "power_of_two", ["http://a:1", "http://b:2"], 0.5, 7)
    flag = {k: v for k, v in zip(argv, argv[1:]) if k.startswith("--")}
    assert flag["--policy"] == "power_of_two" and flag["--health-check-endpoint"] == "/health"
    assert flag["--health-check-interval-secs"] == "1" and flag["--health-check-timeout-secs"] == "7"
    assert argv[argv.index("--worker-urls") + 1:] == ["http://a:1", "http://b:2"]
    assert "--disable-circuit-breaker" in argv and flag["--request-timeout-secs"] == "14400"


def test_router_answers_worker_id_and_the_client_reads_it(router, engines):
    listed = {w["url"]: w["id"] for w in router["admin"].list_workers()}
    assert sorted(router["ids"]) == sorted(listed[s.url] for s in engines)


def test_router_refuses_a_list_of_sampling_params_and_takes_one_request_per_group(router):
    """Failure 1 of issue 18: the batched request (one sampling_params dict per prompt) is refused
    with 422; one request per prompt group (input_ids + its n) passes, and so does a list of
    prompts sharing one dict (plan_requests merges rows with equal params)."""
    from slime.rollout.generate import plan_requests

    client = EngineClient(router["url"])
    sp = {"max_new_tokens": 2, "n": 3, "sampling_seed": 5}
    with pytest.raises(EngineRequestError) as e:
        client.generate([PROMPT, PROMPT], [sp, {**sp, "sampling_seed": 6}])
    assert e.value.status == 422 and "sampling_params" in e.value.message
    assert len(client.generate([PROMPT], sp)) == 3
    assert len(client.generate([PROMPT, PROMPT[:4]], sp)) == 6
    assert plan_requests([sp, {**sp, "sampling_seed": 6}, dict(sp)]) == [[0, 2], [1]]


def test_rows_sharing_one_seed_sample_differently_and_repeatably(router):
    """Through sglang-router a request carries one sampling_params for all its prompts: the engine
    offsets the seed per row, so equal prompts differ and a retried request samples the same."""
    client = EngineClient(router["url"])
    sp = {"max_new_tokens": 6, "sampling_seed": 11, "ignore_eos": True}
    first = [o.output_ids for o in client.generate([PROMPT] * 4, sp)]
    again = [o.output_ids for o in client.generate([PROMPT] * 4, sp)]
    assert first == again and len({tuple(x) for x in first}) > 1, first


def test_rollout_manager_falls_back_to_requests_per_group_behind_sglang_router(router, tiny, tmp_path):
    """The manager told to batch (as with our router) meets the 422 once, then sends one
    sampling_params per request for the rest of the run; every sample comes back, groups differ."""
    from slime.args import parse_args
    from slime.rollout.manager import RolloutManager

    cfg = parse_args(tiny_flags(tiny, tmp_path))
    m = RolloutManager(cfg.data, cfg.rollout, cfg.eval, str(tiny["model"]), router["url"], batched=True)
    samples, metrics = m.generate(0)
    assert m.batched is False
    assert len(samples) == 16 and all(s.response_tokens for s in samples)
    assert Counter(s.group_index for s in samples) == {g: 4 for g in range(4)}
    assert len({tuple(s.response_tokens) for s in samples}) > 1
    assert metrics["perf/rollout_tokens_per_s"] > 0


def test_stream_through_the_router_is_sse_frames_ending_with_done(router):
    """Failure 2 of issue 18: `stream: true` came back as one plain JSON object."""
    with httpx.stream("POST", router["url"] + "/generate", timeout=60,
                      json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2, "n": 2, "ignore_eos": True},
                            "return_logprob": True, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        frames = [line for line in r.iter_lines() if line]
    assert all(f.startswith("data: ") for f in frames) and frames[-1] == "data: [DONE]"
    chunks = [json.loads(f.removeprefix("data: ")) for f in frames[:-1]]
    final = [c for c in chunks if c["meta_info"]["finish_reason"] is not None]  # before: per-token frames
    assert sorted(c["index"] for c in final) == [0, 1] and {c["index"] for c in chunks} == {0, 1}
    assert all(len(c["output_ids"]) == 2 and c["meta_info"]["finish_reason"]["type"] == "length" for c in final)


def test_router_reads_each_engines_load(router, engines):
    """Failure 3 of issue 18: the router polls GET /get_load; without it every engine reported -1."""
    loads = httpx.get(router["url"] + "/get_loads").json()["workers"]
    assert {w["worker"] for w in loads} == {s.url for s in engines}
    assert all(w["load"] >= 0 for w in loads), loads
    direct = httpx.get(engines[0].url + "/get_load").json()
    assert isinstance(direct, list) and {"dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens"} <= set(direct[0])


def test_abort_goes_to_the_workers_the_router_lists(router, engines):
    """sglang-router does not forward /abort_request (404): the client aborts each listed worker,
    and the request sent through the router comes back aborted with its partial output."""
    for path in ("/abort_request", "/pause_generation", "/continue_generation", "/update_weights_from_disk",
                 "/update_weights_from_distributed", "/init_weights_update_group", "/update_weights_from_tensor",
                 "/init_weights_transfer_engine", "/release_memory_occupation"):  # docs/en/rollout-engines.md
        assert httpx.post(router["url"] + path, json={}).status_code == 404, path
    for s in engines:
        s.core.step_delay_s = 0.05
    try:
        out: dict = {}
        t = threading.Thread(target=lambda: out.update(r=EngineClient(router["url"]).generate(
            [PROMPT], {"max_new_tokens": 400, "ignore_eos": True})[0]))
        t.start()
        deadline = time.monotonic() + 30
        # Decoding, not just received: a row aborted while it still queues has no tokens to return.
        while not any(s.core.batcher.running() for s in engines) and time.monotonic() < deadline:
            time.sleep(0.02)
        for w in router["admin"].list_workers():  # what RolloutManager._abort_engines does
            EngineClient(w["url"]).abort(abort_all=True)
        t.join(timeout=60)
    finally:
        for s in engines:
            s.core.step_delay_s = 0.0
    r = out["r"]
    assert r.finish_type == "abort" and 0 < len(r.output_ids) < 400


def test_pd_router_gets_an_error_not_doubled_work(engines, tmp_path):
    """In PD mode the router sends each request to a prefill and a decode worker with bootstrap
    fields; an embedded engine cannot serve PD, says so in /server_info, and refuses the fields."""
    assert httpx.get(engines[0].url + "/server_info").json()["disaggregation_mode"] == "null"
    from slime.rollout.http_thread import free_port

    port = free_port()
    argv = sglang_router_argv("127.0.0.1", port, "round_robin")
    argv += ["--pd-disaggregation", "--prefill", engines[0].url, "--decode", engines[1].url]
    import subprocess

    proc = subprocess.Popen(argv, stdout=open(tmp_path / "pd.log", "wb"), stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                RouterAdmin(url).wait_workers([s.url for s in engines], timeout=1)
                break
            except (httpx.HTTPError, TimeoutError):
                time.sleep(0.3)
        r = httpx.post(url + "/generate", json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}},
                       timeout=60)
        assert r.status_code == 400 and "disaggregation" in r.text, r.text
    finally:
        proc.terminate()
        proc.wait(timeout=15)


# -- Ray: whole runs through sglang-router -------------------------------------------------------------
def _metrics(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.ray
@pytest.mark.timeout(240)
def test_tiny_run_through_sglang_router_and_the_router_stops_with_the_run(tiny, ray_cluster, tmp_path):
    import os

    import ray

    from slime.args import parse_args
    from slime.ray.runtime import Runtime

    rt = Runtime.start(parse_args(tiny_flags(tiny, tmp_path, "--num-rollout", "2", "--use-sglang-router",
                                             "--router-policy", "round_robin", "--update-weight-transport", "gloo")))
    try:
        pid = ray.get(rt.router.pid.remote())
        assert {w["url"] for w in RouterAdmin(rt.router_url).list_workers()} == {h.url for h in rt.engines}
        for rollout_id in range(2):
            samples, metrics = rt.generate(rollout_id)
            assert len(samples) == 16 and all(s.response_tokens for s in samples)
            assert {s.weight_version for s in samples} == {str(rt.version)}
            rt.train(rt.build_records(samples))
            rt.sync_weights()
    finally:
        rt.shutdown()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"sglang-router (pid {pid}) still runs after the run stopped")


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_through_sglang_router_an_engine_killed_mid_rollout_and_a_sync_mid_rollout_lose_no_sample(
        tiny, ray_cluster, tmp_path):
    import ray

    from slime.args import parse_args
    from slime.ray.runtime import Runtime

    flags = tiny_flags(tiny, tmp_path, "--num-rollout", "3", "--use-sglang-router", "--router-policy",
                       "round_robin", "--update-weight-transport", "gloo", "--use-fault-tolerance",
                       "--rollout-health-check-interval", "0.5", "--rollout-health-check-timeout", "10")
    flags[flags.index("--rollout-num-gpus") + 1] = "2"
    rt = Runtime.start(parse_args(flags))
    try:
        admin = RouterAdmin(rt.router_url)
        # 1. Weight sync while a rollout is in flight: generation pauses (running requests finish,
        # new ones wait), resumes after the sync; every sample comes back.
        ray.get([h.actor.set_step_delay.remote(0.05) for h in rt.engines])
        fut = rt.generate_async(0)
        time.sleep(1.0)
        rt.sync_weights()
        samples, _ = ray.get(fut)
        assert len(samples) == 16 and all(s.response_tokens for s in samples)
        assert all(s.status.value != "aborted" for s in samples)
        # 2. An engine killed while it holds requests: the router and the client retry them.
        victim = rt.engines[0]
        ray.get([h.actor.set_step_delay.remote(0.2) for h in rt.engines])
        fut = rt.generate_async(1)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if httpx.get(victim.url + "/get_load", timeout=5).json()[0]["num_reqs"] > 0:
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
        deadline = time.monotonic() + 90
        while rt.monitor.restarts < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert rt.monitor.restarts == 1, rt.monitor.errors
        new = rt.engines[0]
        assert new.url != victim.url
        listed = {w["url"] for w in admin.list_workers()}
        assert new.url in listed and victim.url not in listed
        rt.train(rt.build_records(samples))
        rt.sync_weights()
        samples, _ = rt.generate(2)
        assert len(samples) == 16 and {s.weight_version for s in samples} == {str(rt.version)}
    finally:
        rt.shutdown()
