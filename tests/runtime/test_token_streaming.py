"""Token streaming (`stream: true` on /generate): the embedded engine sends one cumulative SSE frame
per token (or small group), `data: [DONE]` last; the last frame of a row is the non-streamed
answer; an abort mid-stream ends it with SGLang's `abort` finish_reason. Checked on the engine
itself, through our router (RouterServer, what RouterActor hosts) and through the real
sglang-router 0.3.2."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from slime.rollout.client import RouterAdmin
from slime.rollout.router import RouterServer, SGLangRouterProcess

PROMPT = [2, 8, 11, 6, 3]
TOKENS = 12


@pytest.fixture(scope="module")
def ours(two_servers) -> Iterator[str]:
    router = RouterServer(retry_timeout=10)
    url = router.start()
    for s in two_servers:
        RouterAdmin(url).add_worker(s.url)
    yield url
    router.stop()


@pytest.fixture(scope="module")
def sglang_router(two_servers, tmp_path_factory) -> Iterator[str]:
    proc = SGLangRouterProcess(policy="round_robin", log_path=str(tmp_path_factory.mktemp("r") / "router.log"))
    url = proc.start()
    admin = RouterAdmin(url)
    for s in two_servers:
        admin.add_worker(s.url)
    admin.wait_workers([s.url for s in two_servers], timeout=60)
    yield url
    proc.stop()


def _urls(which: str, two_servers, request) -> str:
    return two_servers[0].url if which == "engine" else request.getfixturevalue(which)


def _body(seed: int, **extra) -> dict:
    return {"input_ids": PROMPT, "return_logprob": True,
            "sampling_params": {"max_new_tokens": TOKENS, "ignore_eos": True, "sampling_seed": seed,
                                "temperature": 1.0}, **extra}


def _frames(url: str, body: dict) -> list[str]:
    with httpx.stream("POST", url + "/generate", json={**body, "stream": True}, timeout=120,
                      trust_env=False) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        return [line for line in r.iter_lines() if line]


def _answer_fields(out: dict) -> tuple:
    meta = out["meta_info"]
    return out["text"], out["output_ids"], meta["output_token_logprobs"], meta["finish_reason"]


@pytest.mark.parametrize("which", ["engine", "ours", "sglang_router"])
def test_stream_sends_a_frame_per_token_and_its_last_frame_is_the_non_streamed_answer(which, two_servers, request):
    url = _urls(which, two_servers, request)
    whole = httpx.post(url + "/generate", json=_body(7), timeout=120, trust_env=False).json()
    frames = _frames(url, _body(7))
    assert all(f.startswith("data: ") for f in frames) and frames[-1] == "data: [DONE]"
    chunks = [json.loads(f.removeprefix("data: ")) for f in frames[:-1]]
    assert len(chunks) > 1, chunks  # not one frame holding everything
    # Cumulative frames (SGLang without --stream-output): each extends the one before; the
    # increments, concatenated, are the whole answer.
    ids = [c["output_ids"] for c in chunks]
    assert all(b[:len(a)] == a and len(b) >= len(a) for a, b in zip(ids, ids[1:])), ids
    increments = [tok for a, b in zip([[]] + ids, ids) for tok in b[len(a):]]
    assert increments == whole["output_ids"] and len(whole["output_ids"]) == TOKENS
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert _answer_fields(chunks[-1]) == _answer_fields(whole)
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"


@pytest.mark.parametrize("which", ["engine", "ours", "sglang_router"])
def test_an_abort_mid_stream_ends_it_with_the_abort_finish_reason(which, two_servers, request):
    """The engines decode slowly here (step delay) so that the abort lands while the stream runs;
    the abort is sent to both engines (whichever the router picked), by rid, after the first frame."""
    url = _urls(which, two_servers, request)
    rid = f"stream-abort-{which}"
    body = _body(3, rid=rid)
    body["sampling_params"]["max_new_tokens"] = 50
    for s in two_servers:
        s.core.step_delay_s = 0.05
    try:
        chunks, done = [], False
        with httpx.stream("POST", url + "/generate", json={**body, "stream": True}, timeout=120,
                          trust_env=False) as r:
            for line in r.iter_lines():
                if not line:
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                chunks.append(json.loads(line.removeprefix("data: ")))
                if len(chunks) == 1:
                    for s in two_servers:
                        httpx.post(s.url + "/abort_request", json={"rid": rid}, timeout=30, trust_env=False)
    finally:
        for s in two_servers:
            s.core.step_delay_s = 0.0
    assert done and len(chunks) >= 2
    last = chunks[-1]
    assert last["meta_info"]["finish_reason"]["type"] == "abort", last["meta_info"]
    assert 0 < len(last["output_ids"]) < 50 and last["meta_info"]["completion_tokens"] == len(last["output_ids"])


@pytest.mark.parametrize("which", ["engine", "ours"])
def test_a_client_that_disconnects_mid_stream_aborts_its_request(which, two_servers, request):
    """With a step delay of 0.2 s the 50-token answer needs at least 10 s of decoding; the client
    reads one frame and goes away. The engine must stop the request long before its 50 tokens:
    counted in decode steps (the tiny engines run nothing else meanwhile), not in seconds."""
    url = _urls(which, two_servers, request)
    body = _body(5)
    body["sampling_params"]["max_new_tokens"] = 50
    steps = {id(s): s.core.batcher.steps for s in two_servers}
    for s in two_servers:
        s.core.step_delay_s = 0.2
    try:
        with httpx.stream("POST", url + "/generate", json={**body, "stream": True}, timeout=120,
                          trust_env=False) as r:
            first = next(line for line in r.iter_lines() if line)
            assert json.loads(first.removeprefix("data: "))["meta_info"]["finish_reason"] is None
        deadline = time.monotonic() + 60
        while any(s.core.busy for s in two_servers):
            assert time.monotonic() < deadline, "the request kept running after its client left"
            time.sleep(0.05)
    finally:
        for s in two_servers:
            s.core.step_delay_s = 0.0
    ran = sum(s.core.batcher.steps - steps[id(s)] for s in two_servers)
    assert ran < 49, ran  # a request that ran to its end takes 49 decode steps after its prefill
