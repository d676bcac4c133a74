"""Prefill/decode disaggregation through the real sglang-router (0.3.2, PyPI) in PD mode, in front
of embedded engines serving SGLang's bootstrap protocol, with the prompt's KV cache moved over
Mooncake's transfer engine (TCP on 127.0.0.1): a rollout equals the non-PD run, the decode engine
runs no forward over the prompt, the KV bytes are counted; under Ray, the runtime launches the PD
router from sglang.yaml, a prefill engine killed mid-rollout loses no sample, and weight sync
reaches both groups with one version. No part is faked."""

from __future__ import annotations

import time
from collections import Counter

import httpx
import pytest

pytest.importorskip("sglang_router")
pytest.importorskip("mooncake.engine", exc_type=ImportError)

from slime.rollout.client import RouterAdmin  # noqa: E402
from slime.rollout.router import SGLangRouterProcess, sglang_router_argv  # noqa: E402
from tests.refusal_codes import has  # noqa: E402
from tests.runtime.conftest import tiny_flags  # noqa: E402

PD_YAML = """sglang:
  - name: actor
    server_groups:
      - {worker_type: prefill, num_gpus: 1}
      - {worker_type: decode, num_gpus: 1}
"""


def _info(url: str) -> dict:
    return httpx.get(url + "/server_info", timeout=30).json()


@pytest.fixture(scope="module")
def engines(tiny):
    """A prefill, a decode and a regular embedded engine of the tiny model on 127.0.0.1."""
    torch = pytest.importorskip("torch")
    from slime.inference.engine_core import EngineCore
    from slime.rollout.engines.embedded import EngineServer

    torch.set_num_threads(1)
    servers = {role: EngineServer(EngineCore(str(tiny["model"]), seed=0),
                                  server_args={"disaggregation_mode": role} if role != "regular" else None)
               for role in ("prefill", "decode", "regular")}
    for s in servers.values():
        s.start()
    yield servers
    for s in servers.values():
        s.stop()


@pytest.fixture(scope="module")
def routers(engines, tmp_path_factory):
    """sglang-router in PD mode (prefill + its bootstrap port, decode), and one in front of the
    regular engine (the non-PD run)."""
    log = tmp_path_factory.mktemp("routers")
    pre, dec = engines["prefill"], engines["decode"]
    pd = SGLangRouterProcess(policy="round_robin", log_path=str(log / "pd.log"),
                             prefill=[(pre.url, _info(pre.url)["disaggregation_bootstrap_port"])], decode=[dec.url])
    regular = SGLangRouterProcess(policy="round_robin", log_path=str(log / "regular.log"),
                                  worker_urls=[engines["regular"].url])
    urls = {"pd": pd.start(), "regular": regular.start()}
    RouterAdmin(urls["pd"]).wait_workers([pre.url, dec.url], timeout=120)
    RouterAdmin(urls["regular"]).wait_workers([engines["regular"].url], timeout=120)
    yield urls
    pd.stop()
    regular.stop()


def test_pd_router_command_pairs_each_prefill_with_its_bootstrap_port():
    argv = sglang_router_argv("127.0.0.1", 30001, "round_robin", prefill=[("http://p:1", 4242), ("http://q:2", None)],
                              decode=["http://d:3"])
    assert "--pd-disaggregation" in argv and "--worker-urls" not in argv
    i = argv.index("--prefill")
    assert argv[i:i + 3] == ["--prefill", "http://p:1", "4242"]
    assert argv[argv.index("--prefill", i + 1) + 1] == "http://q:2" and argv[-2:] == ["--decode", "http://d:3"]


def test_engines_report_their_pd_role_and_the_router_lists_the_pair(engines, routers):
    pre, dec = _info(engines["prefill"].url), _info(engines["decode"].url)
    assert pre["disaggregation_mode"] == "prefill" and isinstance(pre["disaggregation_bootstrap_port"], int)
    assert dec["disaggregation_mode"] == "decode" and dec["disaggregation_bootstrap_port"] is None
    assert _info(engines["regular"].url)["disaggregation_mode"] == "null"
    listed = {w["url"]: w for w in RouterAdmin(routers["pd"]).list_workers()}
    assert listed[engines["prefill"].url]["worker_type"] == "prefill"
    assert listed[engines["prefill"].url]["bootstrap_port"] == pre["disaggregation_bootstrap_port"]
    assert listed[engines["decode"].url]["worker_type"] == "decode"


def test_rollout_through_the_pd_router_equals_the_non_pd_run_and_moves_the_kv_over_mooncake(
        engines, routers, tiny, tmp_path):
    from slime.args import parse_args
    from slime.rollout.manager import RolloutManager

    cfg = parse_args(tiny_flags(tiny, tmp_path, "--rollout-max-response-len", "8"))
    dec = engines["decode"]
    before = {r: _info(engines[r].url)["kv_transfer"] for r in ("prefill", "decode")}
    runs = {}
    for name in ("pd", "regular"):
        m = RolloutManager(cfg.data, cfg.rollout, cfg.eval, str(tiny["model"]), routers[name], batched=False)
        runs[name], _ = m.generate(0)
        assert m.pd is (name == "pd")
    pd_run, plain = ({s.sample_id: s for s in runs[k]} for k in ("pd", "regular"))
    assert len(pd_run) == 16 and pd_run.keys() == plain.keys()
    for sid, s in pd_run.items():
        ref = plain[sid]
        assert s.response_tokens == ref.response_tokens, sid
        assert s.rollout_log_probs == pytest.approx(ref.rollout_log_probs, abs=1e-5), sid
    assert len({tuple(s.response_tokens) for s in pd_run.values()}) > 1  # sampled, not one greedy answer

    after = {r: _info(engines[r].url)["kv_transfer"] for r in ("prefill", "decode")}
    moved = {r: {k: after[r][k] - before[r][k] for k in ("bytes_sent", "bytes_received", "transfers",
                                                         "prefill_forward_tokens")} for r in after}
    groups = {s.group_index: s for s in pd_run.values()}  # one KV transfer per prompt; n samples share it
    expected = sum(dec.pd.kv_nbytes(len(s.prompt_tokens)) for s in groups.values())
    assert moved["prefill"]["bytes_sent"] == moved["decode"]["bytes_received"] == expected > 0
    assert moved["prefill"]["transfers"] == moved["decode"]["transfers"] == len(groups)
    assert moved["prefill"]["prefill_forward_tokens"] == sum(len(s.prompt_tokens) for s in groups.values())
    assert moved["decode"]["prefill_forward_tokens"] == 0  # it continued from the transferred cache
    assert after["decode"]["protocol"] == "tcp" and after["decode"]["failures"] == 0
    worst = max(abs(a - b) for sid, s in pd_run.items() for a, b in zip(s.rollout_log_probs, plain[sid].rollout_log_probs))
    print(f"[pd] {len(pd_run)} samples, {sum(len(s.response_tokens) for s in pd_run.values())} tokens equal to the "
          f"non-PD run, log-prob max |diff| {worst:.3g}; KV over Mooncake ({after['decode']['protocol']}): {expected} "
          f"bytes in {len(groups)} transfers; prefill forward tokens: prefill engine "
          f"{moved['prefill']['prefill_forward_tokens']}, decode engine {moved['decode']['prefill_forward_tokens']}")


def test_a_regular_engine_still_refuses_the_bootstrap_fields(engines):
    r = httpx.post(engines["regular"].url + "/generate", timeout=30, json={
        "input_ids": [2, 8, 11], "sampling_params": {"max_new_tokens": 2}, "bootstrap_room": 7})
    assert r.status_code == 400 and "disaggregation" in r.text


def test_a_failed_mooncake_write_fails_both_sides_with_a_retryable_error_and_is_counted(engines):
    """A pull naming a receiver no transfer engine listens on: the prefill engine's write fails, the
    pull and the prefill request answer 503 (not a hang until the timeout), the failure is counted."""
    import threading

    pre = engines["prefill"]
    before = _info(pre.url)["kv_transfer"]["failures"]
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(p=httpx.post(pre.url + "/generate", timeout=120, json={
        "input_ids": [2, 8, 11], "sampling_params": {"max_new_tokens": 2}, "bootstrap_host": "127.0.0.1",
        "bootstrap_port": pre.pd.bootstrap_port, "bootstrap_room": 77})))
    t.start()
    r = httpx.post(f"http://127.0.0.1:{pre.pd.bootstrap_port}/kv/pull", timeout=120,
                   json={"room": 77, "session_id": "127.0.0.1:1", "ptr": 4096, "nbytes": 1 << 20})
    t.join()
    assert r.status_code == 503 and "Mooncake write" in r.text, r.text
    assert out["p"].status_code == 503 and "room 77" in out["p"].text
    assert _info(pre.url)["kv_transfer"]["failures"] == before + 1


def test_kv_computed_on_other_weights_is_refused_by_the_decode_engine_with_a_retryable_error(engines, tiny):
    """The prefill engine moved to weight version 1, the decode engine still serves 0: the decode
    engine answers 503 naming both versions (the rollout manager retries a 5xx behind a PD router);
    once both serve version 1 the same request succeeds."""
    import threading

    pre, dec = engines["prefill"], engines["decode"]
    body = {"input_ids": [2, 8, 11, 6, 3], "sampling_params": {"max_new_tokens": 3, "sampling_seed": 1},
            "bootstrap_host": "127.0.0.1", "bootstrap_port": pre.pd.bootstrap_port}

    def pair(room: int) -> tuple[httpx.Response, httpx.Response]:
        out: dict = {}
        t = threading.Thread(target=lambda: out.update(p=httpx.post(pre.url + "/generate", timeout=120,
                                                                    json={**body, "bootstrap_room": room})))
        t.start()
        d = httpx.post(dec.url + "/generate", json={**body, "bootstrap_room": room}, timeout=120)
        t.join()
        return out["p"], d

    old = dec.core.weight_version
    new = str(int(old) + 1)
    assert httpx.post(pre.url + "/update_weights_from_disk", timeout=120,
                      json={"model_path": str(tiny["model"]), "weight_version": new}).json()["success"]
    p, d = pair(101)
    assert p.status_code == 200 and d.status_code == 503, d.text
    assert f"weight version {new}" in d.text and f"serves {old}" in d.text
    assert httpx.post(dec.url + "/update_weights_from_disk", timeout=120,
                      json={"model_path": str(tiny["model"]), "weight_version": new}).json()["success"]
    p, d = pair(102)
    assert d.status_code == 200 and d.json()["meta_info"]["weight_version"] == new


def test_embedded_pd_flags_are_checked_before_start(tiny, tmp_path):
    from slime.args import parse_args, validate

    (tmp_path / "pd.yaml").write_text(PD_YAML)
    (tmp_path / "regular.yaml").write_text(PD_YAML.replace("prefill", "regular").replace("decode", "regular"))

    def check(config: str, *extra: str, router: bool = True) -> list[str]:
        flags = tiny_flags(tiny, tmp_path, "--num-rollout", "1", "--sglang-config", str(tmp_path / config),
                           *(["--use-sglang-router", "--router-policy", "round_robin"] if router else []), *extra)
        flags[flags.index("--rollout-num-gpus") + 1] = "2"
        return validate(parse_args(flags))

    assert check("pd.yaml") == []
    errors = check("pd.yaml", router=False)
    assert has(errors, "embedded.engine_pd_router"), errors
    errors = check("pd.yaml", "--sglang-disaggregation-transfer-backend", "nixl")
    assert has(errors, "embedded.engine_pd_backend", backend="nixl"), errors
    errors = check("regular.yaml")
    assert has(errors, "embedded.engine_groups"), errors
    (tmp_path / "wide.yaml").write_text(PD_YAML.replace("{worker_type: prefill, num_gpus: 1}",
                                                        "{worker_type: prefill, num_gpus: 2, num_gpus_per_engine: 2}"))
    errors = check("wide.yaml")
    assert has(errors, "embedded.engine_group_size", worker_type="prefill", size=2), errors
    import json
    import shutil

    other = tmp_path / "gpt2"
    shutil.copytree(tiny["model"], other)
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    errors = check("pd.yaml", "--hf-checkpoint", str(other))
    assert has(errors, "embedded.engine_pd_model", model_type="gpt2"), errors


# -- Ray: the runtime launches the PD pair and the router -------------------------------------------
@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_runtime_serves_pd_from_sglang_yaml_a_killed_prefill_engine_loses_no_sample_and_sync_reaches_both(
        tiny, ray_cluster, tmp_path):
    import ray

    from slime.args import parse_args
    from slime.ray.runtime import Runtime

    (tmp_path / "pd.yaml").write_text(PD_YAML)
    flags = tiny_flags(tiny, tmp_path, "--num-rollout", "3", "--sglang-config", str(tmp_path / "pd.yaml"),
                       "--use-sglang-router", "--router-policy", "round_robin", "--update-weight-transport", "gloo",
                       "--use-fault-tolerance", "--rollout-health-check-interval", "0.5",
                       "--rollout-health-check-timeout", "10")
    flags[flags.index("--rollout-num-gpus") + 1] = "2"
    rt = Runtime.start(parse_args(flags))
    try:
        admin = RouterAdmin(rt.router_url)
        kinds = {w["url"]: w["worker_type"] for w in admin.list_workers()}
        assert sorted(kinds.values()) == ["decode", "prefill"] and kinds[rt.engines[0].url] == "prefill"
        samples, metrics = rt.generate(0)
        assert len(samples) == 16 and all(s.response_tokens for s in samples) and metrics["rollout/pd_retries"] == 0
        assert {s.weight_version for s in samples} == {str(rt.version)}
        rt.train(rt.build_records(samples))
        rt.sync_weights()  # one version on both groups
        assert {h.client.model_info()["weight_version"] for h in rt.engines} == {str(rt.version)}

        # The prefill engine killed while it holds the rollout's requests: the decode engine and the
        # router answer an error, the rollout manager sends the requests again; the fault monitor
        # starts a new prefill engine and registers it with its bootstrap port.
        victim = rt.engines[0]
        ray.get(victim.actor.set_step_delay.remote(0.5))
        fut = rt.generate_async(1)
        deadline = time.monotonic() + 60
        while httpx.get(victim.url + "/get_load", timeout=5).json()[0]["num_reqs"] == 0:
            assert time.monotonic() < deadline, "the prefill engine never received a request"
            time.sleep(0.01)
        ray.kill(victim.actor)
        samples, metrics = ray.get(fut)
        # Who sends a failed request again depends on when the kill lands: the manager (counted in
        # rollout/pd_retries) after the router's 5xx, or sglang-router's own retry once the monitor has
        # registered the new prefill engine. Either way no sample may be lost or aborted (below).
        assert "rollout/pd_retries" in metrics  # reported, whoever retried
        ids = Counter((s.prompt_id, s.group_index) for s in samples)
        assert len(samples) == 16 and len(ids) == 4 and set(ids.values()) == {4}
        assert all(s.response_tokens and s.status.value != "aborted" for s in samples)
        assert {s.weight_version for s in samples} == {str(rt.version)}
        # The rollout can finish on the decode engine before the monitor notices the dead prefill engine
        # (its KV was already sent): wait, bounded, for the restart.
        deadline = time.monotonic() + 120
        while rt.monitor.restarts == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert rt.monitor.restarts == 1, rt.monitor.errors
        new = rt.engines[0]
        listed = {w["url"]: w for w in admin.list_workers()}
        assert new.url != victim.url and victim.url not in listed
        assert listed[new.url]["worker_type"] == "prefill"
        assert listed[new.url]["bootstrap_port"] == new.client.server_info()["disaggregation_bootstrap_port"]
        rt.train(rt.build_records(samples))
        rt.sync_weights()
        assert {h.client.model_info()["weight_version"] for h in rt.engines} == {str(rt.version)}
        rt.monitor.stop()  # its /health_generate probes run one-token prefills of their own
        decode = rt.engines[1].client
        before = decode.server_info()["kv_transfer"]
        samples, _ = rt.generate(2)
        assert len(samples) == 16 and {s.weight_version for s in samples} == {str(rt.version)}
        after = decode.server_info()["kv_transfer"]
        assert after["prefill_forward_tokens"] == before["prefill_forward_tokens"]  # no prompt recomputed
        assert after["bytes_received"] > before["bytes_received"]
        assert new.client.server_info()["kv_transfer"]["bytes_sent"] > 0
    finally:
        rt.shutdown()
