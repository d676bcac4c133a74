"""The tiny recipe learns, synchronous and async: held-out reward rises by >= 0.3 (the long runs;
CI skips them).

Run it with:  SLIME_RUN_SLOW=1 python -m pytest -m slow tests/runtime/test_tiny_learning.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(900),
              pytest.mark.skipif(not os.environ.get("SLIME_RUN_SLOW"), reason="long learning run: set SLIME_RUN_SLOW=1")]

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("entry", ["train", "train_async"])
def test_tiny_recipe_held_out_reward_rises_by_at_least_0_3(tiny, ray_cluster, tmp_path, entry):
    import importlib

    env = {"MODEL_DIR": str(tiny["model"]), "REF_DIR": str(tiny["ref"]), "DATA_DIR": str(tiny["data"]),
           "OUTPUT_DIR": str(tmp_path)}
    args = yaml.safe_load((REPO / "tools" / "tiny" / "TRAIN_ARGS.yaml").read_text())["train_args"]
    argv = [a.replace("${" + k + "}", v) if isinstance(a, str) else a for a in args for k, v in [("", "")]]
    for k, v in env.items():
        argv = [a.replace("${" + k + "}", v) for a in argv]
    importlib.import_module(entry).main(argv)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    curve = [r["eval/held_out"] for r in rows if "eval/held_out" in r]
    print(f"{entry}: eval/held_out {curve}")
    assert curve[-1] - curve[0] >= 0.3, curve
    trained = [r for r in rows if r["rollout_id"] >= 0]
    staleness = sorted({r["rollout/staleness_mean"] for r in trained})
    # synchronous: always on-policy; async: the first rollout is fresh, every later one 1 version behind
    assert staleness == ([0.0] if entry == "train" else [0.0, 1.0]), staleness
    # slime's sanity thresholds, at the first step
    assert abs(trained[0]["train/ppo_kl"]) < 1e-8 and trained[0]["train/train_rollout_logp_abs_diff"] <= 0.1
