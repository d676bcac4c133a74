"""POST /api/run-metrics: a real run's metrics.jsonl (tests/fixtures/run_metrics, made by a tiny CPU
run through Ray) as the series the "Did it work?" step plots; bad files are 4xx naming the line."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from lab.web.app import create_app
from lab.web.body import MAX_BODY_BYTES, RUN_METRICS_MAX_BYTES
from slime.timeline import PHASES, run_summary

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "run_metrics" / "metrics.jsonl"
ROWS = [json.loads(line) for line in FIXTURE.read_text().splitlines()]


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app(), base_url="http://127.0.0.1")


def _post(client: TestClient, text: str, lang: str = "en"):
    return client.post("/api/run-metrics", json={"text": text, "lang": lang})


def test_a_real_runs_file_gives_one_point_per_logged_step_of_each_chart(client):
    got = _post(client, FIXTURE.read_text()).json()
    assert got["steps"] == [r["step"] for r in ROWS]
    charts = got["charts"]
    reward = charts["reward"][0]
    assert reward["key"] == "rollout/raw_reward"
    assert reward["points"] == [[r["step"], r["rollout/raw_reward"]] for r in ROWS if "rollout/raw_reward" in r]
    assert [s["key"] for s in charts["eval"]] == ["eval/held_out"]  # the reward, not eval/held_out_response_length
    assert [p[0] for p in charts["eval"][0]["points"]] == [r["step"] for r in ROWS if "eval/held_out" in r]
    assert [s["key"] for s in charts["kl"]] == ["train/kl_loss", "train/train_rollout_kl"]  # --use-kl-loss run
    assert [s["key"] for s in charts["logp_diff"]] == ["train/train_rollout_logp_abs_diff"]
    assert charts["mfu"] == []  # the embedded trainer reports no FLOPs: the page says the file lacks it


def test_the_phase_timeline_is_one_bar_per_step_in_the_runtimes_phase_order(client):
    phases = _post(client, FIXTURE.read_text()).json()["phases"]
    assert phases["names"] == list(PHASES)
    assert [b["step"] for b in phases["bars"]] == [r["step"] for r in ROWS]
    for bar, row in zip(phases["bars"], ROWS):
        assert bar["seconds"] == [row[f"phase/{p}"] for p in PHASES]
        assert bar["step_time"] == row["perf/step_time"]
    assert phases["largest"] == run_summary(ROWS)["largest"]


def test_a_step_logged_twice_keeps_its_last_line_and_nan_is_a_gap(client):
    lines = ['{"step": 1, "rollout/raw_reward": 0.1}', '{"step": 2, "rollout/raw_reward": NaN}', "",
             '{"step": 1, "rollout/raw_reward": 0.5}']
    got = _post(client, "\n".join(lines)).json()
    assert got["steps"] == [1, 2]
    assert got["charts"]["reward"][0]["points"] == [[1, 0.5], [2, None]]
    assert got["phases"]["bars"] == []  # no timeline in this file: the page says so


@pytest.mark.parametrize(("line", "key", "zh_word"), [
    ("{not json", "runs.not_json", "不是 JSON"),
    ("[1, 2]", "runs.not_object", "不是 JSON 对象"),
    ('{"rollout_id": 3}', "runs.no_step", "没有整数"),
    ('{"step": 1.5}', "runs.no_step", "没有整数"),
])
def test_a_bad_line_is_a_422_naming_the_line_in_the_pages_language(client, line, key, zh_word):
    text = "\n".join([*FIXTURE.read_text().splitlines()[:3], line])
    for lang, word in (("en", "line 4"), ("zh", "第 4 行")):
        res = _post(client, text, lang)
        assert res.status_code == 422
        (detail,) = res.json()["detail"]
        assert detail["type"] == key and detail["loc"] == ["body", "text", 4]
        assert word in detail["msg"]
        if lang == "zh":
            assert zh_word in detail["msg"]


def test_an_empty_file_is_refused_by_name(client):
    res = _post(client, "\n\n")
    assert res.status_code == 422 and res.json()["detail"][0]["type"] == "runs.empty"


def test_a_long_runs_file_above_the_usual_body_cap_is_plotted(client):
    """Each line of the real file, renumbered, until the file exceeds the 1 MB cap of other routes."""
    lines, step = [], 0
    while sum(len(x) + 1 for x in lines) <= MAX_BODY_BYTES:
        lines.append(json.dumps({**ROWS[step % len(ROWS)], "step": step}))
        step += 1
    res = _post(client, "\n".join(lines))
    assert res.status_code == 200 and len(res.json()["phases"]["bars"]) == step


def test_a_file_above_the_run_metrics_cap_is_a_413_before_reading(client):
    res = client.post("/api/run-metrics", content=b"{}",
                      headers={"content-type": "application/json", "content-length": str(RUN_METRICS_MAX_BYTES + 1)})
    assert res.status_code == 413 and res.json()["detail"][0]["type"] == "input.too_large"


def test_a_resumed_gpu_runs_file_from_before_the_timeline_plots_its_mfu_without_bars(client):
    """A real H200 run (tools/run_gpu_loop.sh) written before phase/* existed, resumed into the same file."""
    path = FIXTURE.parent / "gpu_loop_before_timeline.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    last = {r["step"]: r for r in lines}  # a repeated step: its last line
    got = _post(client, path.read_text()).json()
    assert got["steps"] == sorted(last) and len(got["steps"]) < len(lines)
    (mfu,) = got["charts"]["mfu"]
    assert mfu["points"] == [[s, last[s]["perf/mfu"]] for s in sorted(last) if "perf/mfu" in last[s]]
    assert got["phases"]["bars"] == []
