"""The tiny recipe learns (held-out reward +0.3 or more) with the real parts swapped in: the
sglang-router 0.3.2 in front of the engine, and weight sync over Mooncake's transfer engine.
Long runs (CI skips them); each prints its rollout tokens/s for docs/benchmarks.md.

Run them with:  SLIME_RUN_SLOW=1 python -m pytest -s tests/runtime/test_tiny_learning_real_parts.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(1800),
              pytest.mark.skipif(not os.environ.get("SLIME_RUN_SLOW"), reason="long learning run: set SLIME_RUN_SLOW=1")]

REPO = Path(__file__).resolve().parents[2]


def _recipe(tiny, out: Path) -> list[str]:
    env = {"MODEL_DIR": str(tiny["model"]), "REF_DIR": str(tiny["ref"]), "DATA_DIR": str(tiny["data"]),
           "OUTPUT_DIR": str(out)}
    argv = [str(a) for a in yaml.safe_load((REPO / "tools" / "tiny" / "TRAIN_ARGS.yaml").read_text())["train_args"]]
    for k, v in env.items():
        argv = [a.replace("${" + k + "}", v) for a in argv]
    return argv


def _without(argv: list[str], flag: str, nargs: int = 1) -> list[str]:
    i = argv.index(flag)
    return argv[:i] + argv[i + 1 + nargs:]


def _learn(argv: list[str], out: Path, label: str) -> list[float]:
    import train

    train.main(argv)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    curve = [r["eval/held_out"] for r in rows if "eval/held_out" in r]
    tps = sorted(r["perf/rollout_tokens_per_s"] for r in rows if "perf/rollout_tokens_per_s" in r)
    sync = sorted(r["perf/sync_time"] for r in rows if "perf/sync_time" in r)
    summary = {"run": label, "held_out_first": curve[0], "held_out_last": curve[-1], "rollouts": len(tps),
               "rollout_tokens_per_s_median": round(tps[len(tps) // 2], 1),
               "sync_time_median_s": round(sync[len(sync) // 2], 4)}
    print("[tiny-real-parts]", json.dumps(summary), flush=True)
    (out / "summary.json").write_text(json.dumps(summary))
    return curve


@pytest.mark.parametrize("router", ["slime", "sglang-router"])
def test_tiny_recipe_learns_through_either_router(router, tiny, ray_cluster, tmp_path):
    extra = ["--use-sglang-router"] if router == "sglang-router" else []
    curve = _learn(_recipe(tiny, tmp_path) + extra, tmp_path, router)
    assert curve[-1] - curve[0] >= 0.3, curve


def test_tiny_recipe_learns_with_mooncake_weight_sync(tiny, ray_cluster, tmp_path):
    argv = _without(_recipe(tiny, tmp_path), "--update-weight-disk-dir")
    argv[argv.index("--update-weight-transport") + 1] = "mooncake"
    curve = _learn(argv, tmp_path, "mooncake")
    assert curve[-1] - curve[0] >= 0.3, curve


def test_tiny_recipe_learns_through_sglang_router_with_mooncake_weight_sync(tiny, ray_cluster, tmp_path):
    """Both real parts in one run (what fits a loaded 2-core machine in one go)."""
    argv = _without(_recipe(tiny, tmp_path), "--update-weight-disk-dir")
    argv[argv.index("--update-weight-transport") + 1] = "mooncake"
    curve = _learn(argv + ["--use-sglang-router"], tmp_path, "sglang-router + mooncake")
    assert curve[-1] - curve[0] >= 0.3, curve
