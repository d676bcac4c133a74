"""The embedded engine speaks the SGLang protocol subset (real HTTP, real tiny model)."""

from __future__ import annotations

import httpx
import pytest
import torch

from slime.hf.weights import encode_bucket, named_weights, write_weights_dir
from slime.inference.engine_core import EngineCore
from slime.rollout.client import EngineClient, EngineRequestError
from slime.rollout.engines.embedded import EngineServer


@pytest.fixture(scope="module")
def engine(tiny):
    torch.set_num_threads(1)
    core = EngineCore(str(tiny["model"]), seed=0)
    server = EngineServer(core)
    server.start()
    yield core, server.url
    server.stop()


PROMPT = [2, 8, 11, 6, 3]  # <|user|>472<|assistant|>


def test_generate_answers_the_protocol_shape(engine):
    _, url = engine
    r = httpx.post(f"{url}/generate", json={"input_ids": PROMPT, "return_logprob": True,
                                            "sampling_params": {"max_new_tokens": 3, "temperature": 0.8}})
    assert r.status_code == 200
    body = r.json()
    meta = body["meta_info"]
    assert set(body) == {"text", "output_ids", "meta_info"}
    assert meta["finish_reason"]["type"] in ("stop", "length")
    assert meta["prompt_tokens"] == len(PROMPT) and meta["completion_tokens"] == len(body["output_ids"])
    assert [t[1] for t in meta["output_token_logprobs"]] == body["output_ids"]
    assert all(t[0] <= 0 and t[2] is None for t in meta["output_token_logprobs"])
    assert isinstance(meta["weight_version"], str) and meta["id"]


def test_batch_and_n_give_a_list_in_request_order(engine):
    _, url = engine
    out = EngineClient(url).generate([PROMPT, PROMPT[:4] + [3]], {"max_new_tokens": 2, "n": 3, "sampling_seed": 7})
    assert len(out) == 6 and all(o.finish_type in ("stop", "length") for o in out)
    again = EngineClient(url).generate([PROMPT, PROMPT[:4] + [3]], {"max_new_tokens": 2, "n": 3, "sampling_seed": 7})
    assert [o.output_ids for o in out] == [o.output_ids for o in again]  # sampling_seed is honoured


def test_control_endpoints_answer(engine):
    core, url = engine
    assert httpx.get(f"{url}/health").status_code == 200
    assert httpx.get(f"{url}/health_generate").status_code == 200
    info = httpx.get(f"{url}/server_info").json()
    assert info["model_path"] == core.hf_checkpoint and "weight_version" in info
    assert {"update_weights_from_disk", "update_weights_from_tensor", "update_weights_from_distributed"} <= set(info["weight_update_endpoints"])
    assert httpx.get(f"{url}/get_server_info").json()["tp_size"] == 1
    assert httpx.get(f"{url}/get_model_info").json()["is_generation"] is True
    assert httpx.post(f"{url}/flush_cache").status_code == 200
    assert httpx.post(f"{url}/abort_request", json={"abort_all": True}).status_code == 200


def test_schema_errors_use_the_protocol_error_shape(engine):
    _, url = engine
    r = httpx.post(f"{url}/generate", json={"sampling_params": {}})
    assert r.status_code == 400 and r.json()["object"] == "error" and "input_ids" in r.json()["message"]


def test_engine_refuses_stale_weight_version(engine, tmp_path):
    core, url = engine
    client = EngineClient(url)
    cur = int(core.weight_version)
    path = write_weights_dir(named_weights(core.model), tmp_path / "w", 1 << 20)
    client.update_weights_from_disk(str(path), cur + 1)
    assert httpx.get(f"{url}/model_info").json()["weight_version"] == str(cur + 1)
    for stale in (cur + 1, cur):
        r = httpx.post(f"{url}/update_weights_from_disk", json={"model_path": str(path), "weight_version": str(stale)})
        assert r.status_code == 400 and r.json()["success"] is False and "stale weight_version" in r.json()["message"]
        with pytest.raises(EngineRequestError, match=f"stale weight_version {stale}"):
            client.update_weights_from_disk(str(path), stale)


def test_tensor_update_in_buckets_changes_what_is_sampled(engine):
    core, url = engine
    client = EngineClient(url)
    before = {k: v.clone() for k, v in named_weights(core.model).items()}
    new = {k: torch.zeros_like(v) for k, v in before.items()}  # all-zero logits: uniform sampling
    from slime.hf.weights import bucketize

    buckets = bucketize(new, 4096)
    v = int(core.weight_version) + 1
    for i, b in enumerate(buckets):
        client.update_weights_from_tensor(encode_bucket(b), v, "safetensors", i == len(buckets) - 1)
    out = client.generate([PROMPT], {"max_new_tokens": 1})
    assert out[0].weight_version == str(v)
    assert abs(out[0].output_logprobs[0] - (-torch.log(torch.tensor(14.0)).item())) < 1e-5
    client.update_weights_from_tensor(encode_bucket(before), v + 1, "safetensors")  # restore


def test_release_then_resume_memory(engine):
    core, url = engine
    client = EngineClient(url)
    saved = {k: v.clone() for k, v in named_weights(core.model).items()}
    client.release_memory()
    assert httpx.post(f"{url}/generate", json={"input_ids": PROMPT}).status_code == 503
    client.resume_memory()
    client.update_weights_from_tensor(encode_bucket(saved), int(core.weight_version) + 1, "safetensors")
    assert client.generate([PROMPT], {"max_new_tokens": 1})[0].finish_type in ("stop", "length")
