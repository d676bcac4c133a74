"""Shared fixtures for the runtime tests: the tiny recipe (built once) and one Ray cluster."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """Tiny model + data + converted --ref-load dir, built locally by tools/tiny/prepare.py."""
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("tiny")
    sys.path.insert(0, str(REPO / "tools" / "tiny"))
    import prepare  # tools/tiny/prepare.py

    prepare.main(["--model-dir", str(root / "model"), "--data-dir", str(root / "data")])
    sys.path.insert(0, str(REPO / "tools"))
    import convert_hf_to_torch_dist as conv

    conv.main(["--backend", "embedded", "--hf-checkpoint", str(root / "model"), "--save", str(root / "ref")])
    return {"root": root, "model": root / "model", "data": root / "data", "ref": root / "ref",
            "train": root / "data" / "train.jsonl", "eval": root / "data" / "eval.jsonl"}


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray instance on 127.0.0.1 for all Ray tests; shut down at the end."""
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private in-process test cluster
    started = not ray.is_initialized()
    if started:
        from tests.runtime.ray_local import start_local_ray

        # address="local": always our own instance, even when someone else runs a head here;
        # retried when a loaded machine makes the raylet miss Ray's start-up wait (ray_local.py)
        start_local_ray(ray, str(REPO))
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def two_servers(tiny):
    """Two embedded engines on 127.0.0.1 (seeds 0 and 1), serving SGLang's HTTP protocol."""
    torch = pytest.importorskip("torch")
    from slime.inference.engine_core import EngineCore
    from slime.rollout.engines.embedded import EngineServer

    torch.set_num_threads(1)
    servers = [EngineServer(EngineCore(str(tiny["model"]), seed=i)) for i in range(2)]
    for s in servers:
        s.start()
    yield servers
    for s in servers:
        s.stop()


def tiny_flags(tiny: dict[str, Path], out: Path, *extra: str) -> list[str]:
    """The tiny recipe's flags, scaled down for tests (few rollouts, small batches)."""
    return [
        "--hf-checkpoint", str(tiny["model"]), "--ref-load", str(tiny["ref"]),
        "--prompt-data", str(tiny["train"]), "--input-key", "prompt", "--label-key", "label",
        "--apply-chat-template", "--rollout-shuffle", "--rm-type", "math",
        "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "2",
        "--actor-num-gpus-per-node", "1", "--rollout-num-gpus", "1", "--micro-batch-size", "16",
        "--global-batch-size", "16", "--lr", "1e-3", "--output-dir", str(out),
        *extra,
    ]
