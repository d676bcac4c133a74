"""Step 6 ("Did it work?") in Chromium: a real run's metrics.jsonl (tests/fixtures/run_metrics, made by a
tiny CPU run through Ray), chosen or dropped on the page, is plotted offline: reward, held-out reward, KL,
|Δ log-prob|, MFU and one stacked bar per step of the phase timeline. SLIME_LAB_SHOTS=DIR keeps the
screenshot there (to look at); otherwise it goes to the test's tmp_path."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import assert_clean, wait_until

from slime.timeline import PHASES, run_summary

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "run_metrics" / "metrics.jsonl"
ROWS = [json.loads(line) for line in FIXTURE.read_text().splitlines()]

pytestmark = pytest.mark.browser


def _plotted(page) -> dict:
    return page.evaluate("""() => {
        const q = (s) => Array.from(document.querySelectorAll(s));
        return {
          bars: q('#run-charts svg[data-chart="phases"] g[data-bar-step]').map((g) => ({
            step: Number(g.dataset.barStep), phases: Array.from(g.querySelectorAll('rect')).map((r) => r.dataset.phase),
            height: Array.from(g.querySelectorAll('rect')).reduce((a, r) => a + Number(r.getAttribute('height')), 0)})),
          legend: q('#run-charts ul.phases li[data-phase]').map((li) => li.dataset.phase),
          series: Object.fromEntries(q('#run-charts svg[data-chart] path[data-series]').map(
            (p) => [p.closest('svg').dataset.chart + ':' + p.dataset.series, Number(p.dataset.points)])),
          absent: q('#run-charts [data-absent]').map((e) => e.dataset.absent),
          largest: document.querySelector('#run-charts [data-largest]')?.dataset.largest,
        };
    }""")


def _drop(page, name: str, text: str) -> None:
    """What a drag from the file manager delivers: a drop event whose DataTransfer holds the file."""
    page.evaluate("""([name, text]) => {
        const dt = new DataTransfer();
        dt.items.add(new File([text], name, { type: 'application/json' }));
        const zone = document.querySelector('#run-drop');
        zone.dispatchEvent(new DragEvent('dragover', { dataTransfer: dt, bubbles: true, cancelable: true }));
        zone.dispatchEvent(new DragEvent('drop', { dataTransfer: dt, bubbles: true, cancelable: true }));
    }""", [name, text])


def test_a_real_runs_file_is_plotted_with_one_stacked_bar_per_step(new_page, tmp_path):
    page = new_page(width=1280, height=1000)
    page.locator('[data-goto="step-6"]').first.click()
    page.set_input_files("#run-file", str(FIXTURE))
    wait_until(page, f"document.querySelector('#run-charts').dataset.plotted === '{len(ROWS)}'")
    got = _plotted(page)
    assert [b["step"] for b in got["bars"]] == [r["step"] for r in ROWS]
    for bar, row in zip(got["bars"], ROWS):  # each bar stacks exactly the phases its step spent time in
        assert bar["phases"] == [p for p in PHASES if row[f"phase/{p}"] > 0]
    assert got["legend"] == [p for p in PHASES if any(r[f"phase/{p}"] > 0 for r in ROWS)]
    assert got["largest"] == run_summary(ROWS)["largest"]
    tallest = max(range(len(ROWS)), key=lambda i: ROWS[i]["perf/step_time"])
    assert max(got["bars"], key=lambda b: b["height"])["step"] == ROWS[tallest]["step"]
    assert got["series"] == {
        "reward:rollout/raw_reward": sum("rollout/raw_reward" in r for r in ROWS),
        "eval:eval/held_out": sum("eval/held_out" in r for r in ROWS),
        "kl:train/kl_loss": sum("train/kl_loss" in r for r in ROWS),
        "kl:train/train_rollout_kl": sum("train/train_rollout_kl" in r for r in ROWS),
        "logp_diff:train/train_rollout_logp_abs_diff": sum("train/train_rollout_logp_abs_diff" in r for r in ROWS),
    }
    assert got["absent"] == ["mfu"]  # the embedded trainer logs no perf/mfu: said, not drawn empty
    shots = Path(os.environ.get("SLIME_LAB_SHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    page.evaluate("document.querySelector('header.top').hidden = true")  # the sticky bar would cover the plot
    page.locator("#runplot").screenshot(path=str(shots / "run_plot_en.png"))
    assert_clean(page)  # nothing fetched outside the lab, no console error


def test_a_dropped_file_is_plotted_and_a_bad_one_is_named_by_line_in_chinese(new_page, tmp_path):
    page = new_page(lang="zh", width=1280, height=1000)
    page.locator('[data-goto="step-6"]').first.click()
    _drop(page, "metrics.jsonl", FIXTURE.read_text())
    wait_until(page, f"document.querySelector('#run-charts').dataset.plotted === '{len(ROWS)}'")
    assert len(_plotted(page)["bars"]) == len(ROWS)
    assert "最大的阶段" in page.locator("#run-charts .run-largest").inner_text()
    shots = Path(os.environ.get("SLIME_LAB_SHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    page.evaluate("document.querySelector('header.top').hidden = true")
    page.locator("#runplot").screenshot(path=str(shots / "run_plot_zh.png"))
    broken = "\n".join(FIXTURE.read_text().splitlines()[:2] + ["{oops"])
    _drop(page, "broken.jsonl", broken)
    wait_until(page, "!document.querySelector('#run-error').hidden")
    error = page.locator("#run-error").inner_text()
    assert "broken.jsonl" in error and "第 3 行" in error, error
    page.lab.errors.clear()  # Chromium logs the 422 as a failed resource load
    assert_clean(page)


def test_a_file_from_before_the_timeline_says_it_has_none_and_still_plots_mfu(new_page):
    page = new_page()
    page.locator('[data-goto="step-6"]').first.click()
    page.set_input_files("#run-file", str(FIXTURE.parent / "gpu_loop_before_timeline.jsonl"))
    wait_until(page, "document.querySelector('#run-charts').dataset.plotted !== undefined")
    got = _plotted(page)
    assert got["absent"] == ["phases"] and got["bars"] == []
    assert got["series"]["mfu:perf/mfu"] > 0
    assert_clean(page)


def test_a_gpu_runs_file_plots_its_mfu_and_names_its_largest_phase(new_page):
    gpu = FIXTURE.parent / "gpu_3b_timeline.jsonl"
    rows = [json.loads(line) for line in gpu.read_text().splitlines()]
    page = new_page(width=1280, height=1000)
    page.locator('[data-goto="step-6"]').first.click()
    page.set_input_files("#run-file", str(gpu))
    wait_until(page, f"document.querySelector('#run-charts').dataset.plotted === '{len(rows)}'")
    got = _plotted(page)
    assert not any("eval/held_out" in r for r in rows)
    assert got["absent"] == ["eval"]  # that run had evaluation off: said, not drawn empty
    assert got["series"]["mfu:perf/mfu"] == sum("perf/mfu" in r for r in rows) > 0
    for bar, row in zip(got["bars"], rows):
        assert bar["phases"] == [p for p in PHASES if row.get(f"phase/{p}", 0) > 0]
    assert got["largest"] == run_summary(rows)["largest"]
    tallest = max(range(len(rows)), key=lambda i: rows[i]["perf/step_time"])
    assert max(got["bars"], key=lambda b: b["height"])["step"] == rows[tallest]["step"]
    assert_clean(page)
