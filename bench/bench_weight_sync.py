"""Weight-sync throughput per transport, and rollout tokens/s through the router.

    python bench/bench_weight_sync.py [--out bench/results/weight_sync.json] [--repeats 2]

Weight sync: a randomly initialised Qwen2-shaped model of ~104M parameters (vocab 40,000, hidden
768, 12 layers, FFN 2,048, 12 heads / 2 KV heads, tied embeddings), **float32** (~0.42 GB), one
trainer actor and one embedded engine actor on a local Ray cluster (127.0.0.1), pushed through
slime/sync/weight_sync.py exactly as a run does (pause, flush, buckets of
--update-weight-buffer-size = 128 MiB, continue) for each transport: disk (safetensors shards in
a temp dir), tensor (Ray object store, "ray_staged"), broadcast (gloo process group), http
(inline base64 safetensors) and mooncake (Mooncake transfer engine, TCP on 127.0.0.1, buffers
registered at the first sync). GB/s = parameter bytes / wall time of one sync (best of repeats);
the post-sync log-prob check runs once per transport, outside the timing.

Rollout: the tiny recipe model (tools/tiny/prepare.py) behind our router and behind sglang-router
0.3.2 (when installed) with 1 and 2 embedded engine actors (1 torch thread each); 32 requests of
4 prompts, 32 new tokens each (ignore_eos), 8 in flight; tokens/s = generated tokens / wall time.

Request shape: one rollout of the tiny recipe's shape (16 prompts x 8 samples, 32 new tokens) on
one engine behind our router, in three shapes: one request with a sampling_params list (what
the manager sends our router), one request with one shared sampling_params (what it sends
sglang-router), and one request per prompt group with its n, all in flight at once.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools" / "tiny"))

QWEN2_100M = dict(vocab_size=40_000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                  num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=2048,
                  tie_word_embeddings=True, architectures=["Qwen2ForCausalLM"])


def build_models(root: Path) -> tuple[Path, Path, int]:
    import prepare  # tools/tiny/prepare.py
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tiny = root / "tiny"
    prepare.main(["--model-dir", str(tiny / "model"), "--data-dir", str(tiny / "data")])
    big = root / "qwen2-100m"
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**QWEN2_100M)).to(torch.float32)
    model.save_pretrained(big)
    AutoTokenizer.from_pretrained(tiny / "model").save_pretrained(big)
    n = sum(p.numel() for p in model.parameters())
    return tiny / "model", big, n


def bench_sync(ray, model: Path, n_params: int, repeats: int) -> dict:
    from slime.config import SyncConfig
    from slime.ray.actors import EngineActor, TrainerActor
    from slime.sync.weight_sync import EngineHandle, WeightSync

    trainer = TrainerActor.options(num_cpus=0).remote(0, 1, threads=1)
    master = ray.get(trainer.master_address.remote())
    from slime.args import parse_args

    cfg = parse_args(["--hf-checkpoint", str(model), "--prompt-data", str(model / "config.json"),
                      "--rollout-batch-size", "1", "--seed", "0"])
    ray.get(trainer.init.remote(master, cfg))
    engine = EngineActor.options(num_cpus=0).remote(str(model), 0, 1)
    handle = EngineHandle(ray.get(engine.get_url.remote()), engine)
    handle.client.wait_healthy(timeout=600)
    nbytes = n_params * 4
    out, version = {}, 0
    with tempfile.TemporaryDirectory() as disk:
        for transport in ("disk", "tensor", "gloo", "http", "mooncake"):
            cfg = SyncConfig(transport=transport, disk_dir=os.path.join(disk, transport), buffer_size=128 * 2**20)
            sync = WeightSync(cfg, False, trainer, [handle], disk, use_gpu=False, check_tol=None)
            sync.version = version
            times = []
            for _ in range(repeats):
                version += 1
                times.append(sync.sync(version))
            sync.check_tol = 1e-4
            sync.check(version, [handle])  # the engine serves what the trainer holds
            best = min(times)
            out[sync.transport if transport != "gloo" else "broadcast_gloo"] = {
                "seconds": round(best, 3), "GB_per_s": round(nbytes / best / 1e9, 3),
                "all_seconds": [round(t, 3) for t in times], "logprob_max_diff": sync.last_check[handle.url]}
            print(f"[bench] {transport}: {best:.2f} s, {nbytes / best / 1e9:.3f} GB/s", flush=True)
    for a in (engine, trainer):
        ray.kill(a)
    return {"params": n_params, "dtype": "float32", "bytes": nbytes, "buffer_size": 128 * 2**20,
            "transports": out}


def _start_router(kind: str, urls: list[str]):
    from slime.rollout.client import EngineClient, RouterAdmin
    from slime.rollout.router import RouterServer, SGLangRouterProcess

    router = RouterServer() if kind == "slime" else SGLangRouterProcess(policy="round_robin")
    url = router.start()
    admin = RouterAdmin(url)
    for u in urls:
        EngineClient(u).wait_healthy(timeout=300)
        admin.add_worker(u)
    admin.wait_workers(urls, timeout=120)
    return router, url, admin


def bench_rollout(ray, model: Path, engines: int, router_kind: str = "slime", requests: int = 32,
                  per_request: int = 4, new_tokens: int = 32, in_flight: int = 8) -> dict:
    from slime.ray.actors import EngineActor
    from slime.rollout.client import EngineClient

    actors = [EngineActor.options(num_cpus=0).remote(str(model), i, 1) for i in range(engines)]
    urls = ray.get([a.get_url.remote() for a in actors])
    router, url, admin = _start_router(router_kind, urls)
    client = EngineClient(url)
    prompt = [2, 8, 11, 6, 3]
    params = {"max_new_tokens": new_tokens, "ignore_eos": True, "temperature": 1.0}
    client.generate([prompt], params)  # warm-up
    t0 = time.monotonic()
    with ThreadPoolExecutor(in_flight) as pool:
        outs = list(pool.map(lambda i: client.generate([prompt] * per_request, {**params, "sampling_seed": i}),
                             range(requests)))
    dt = time.monotonic() - t0
    tokens = sum(len(o.output_ids) for batch in outs for o in batch)
    served = [w.get("served") for w in admin.list_workers()]
    router.stop()
    for a in actors:
        ray.kill(a)
    print(f"[bench] rollout through {router_kind} with {engines} engine(s): {tokens / dt:.0f} tokens/s", flush=True)
    return {"router": router_kind, "engines": engines, "tokens": tokens, "seconds": round(dt, 3),
            "tokens_per_s": round(tokens / dt, 1),
            **({"requests_per_engine": served} if router_kind == "slime" else {})}


def bench_request_shape(ray, model: Path, prompts: int = 16, n: int = 8, new_tokens: int = 32,
                        repeats: int = 3) -> dict:
    """The rollout manager's two request shapes on one embedded engine (behind our router)."""
    from slime.ray.actors import EngineActor
    from slime.rollout.client import EngineClient

    actor = EngineActor.options(num_cpus=0).remote(str(model), 0, 1)
    router, url, _ = _start_router("slime", [ray.get(actor.get_url.remote())])
    client = EngineClient(url)
    rows = [[2, 8, 11 - i % 3, 6, 3] for i in range(prompts)]
    params = [{"max_new_tokens": new_tokens, "ignore_eos": True, "n": n, "sampling_seed": 100 + i}
              for i in range(prompts)]
    client.generate(rows[:1], params[0])  # warm-up

    def batched() -> int:
        return len(client.generate(rows, params))

    def shared() -> int:  # what goes through sglang-router: one request, one sampling_params
        return len(client.generate(rows, params[0]))

    def per_group() -> int:
        with ThreadPoolExecutor(prompts) as pool:
            return sum(pool.map(lambda i: len(client.generate([rows[i]], params[i])), range(prompts)))

    out = {}
    for name, fn in (("batched", batched), ("shared_params", shared), ("per_group", per_group)):
        times = []
        for _ in range(repeats):
            t0 = time.monotonic()
            assert fn() == prompts * n
            times.append(time.monotonic() - t0)
        best = min(times)
        out[name] = {"seconds": round(best, 3), "tokens_per_s": round(prompts * n * new_tokens / best, 1),
                     "all_seconds": [round(t, 3) for t in times]}
        print(f"[bench] request shape {name}: {prompts * n * new_tokens / best:.0f} tokens/s", flush=True)
    router.stop()
    ray.kill(actor)
    return {"prompts": prompts, "n": n, "new_tokens": new_tokens, **out}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "weight_sync.json"))
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import importlib.util

    routers = ["slime"] + (["sglang-router"] if importlib.util.find_spec("sglang_router") else [])
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    try:
        with tempfile.TemporaryDirectory() as root:
            tiny, big, n = build_models(Path(root))
            result = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                  "note": "2 shared CPU cores, loaded by other jobs: figures are lower bounds"},
                      "weight_sync": bench_sync(ray, big, n, a.repeats),
                      "rollout": [bench_rollout(ray, tiny, k, r) for r in routers for k in (1, 2)],
                      "request_shape": bench_request_shape(ray, tiny)}
    finally:
        ray.shutdown()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
