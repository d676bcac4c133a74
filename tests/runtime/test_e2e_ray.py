"""Real runs on a local Ray cluster (127.0.0.1) with the tiny model: the loop, its modes,
resume, and failures that name their cause."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from tests.runtime.conftest import tiny_flags

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _prompt_ids(pattern: str, rollouts: range) -> list[list[int]]:
    ids = []
    for r in rollouts:
        rows = [json.loads(x) for x in Path(pattern.format(rollout_id=r)).read_text().splitlines()]
        ids.append([row["prompt_id"] for row in rows])
    return ids


def _run(argv: list[str], entry: str = "train") -> str:
    """Run the loop in this process; returns what it printed (the run summary is its end)."""
    import importlib

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        importlib.import_module(entry).main(argv)
    return printed.getvalue()


def _assert_phases_add_up(rows: list[dict]) -> None:
    """Every step has every phase of the timeline, none negative, adding up to the step time within 5 %."""
    from slime.timeline import PHASES

    for r in rows:
        phases = {p: r[f"phase/{p}"] for p in PHASES}
        assert all(v >= 0.0 for v in phases.values()), (r["step"], phases)
        total = sum(phases.values())
        assert abs(total - r["perf/step_time"]) <= 0.05 * r["perf/step_time"], (r["step"], total, r["perf/step_time"])


@pytest.fixture(scope="module")
def uninterrupted(tiny, ray_cluster, tmp_path_factory):
    """4 rollouts straight through, with eval, save and the debug dump of every rollout."""
    out = tmp_path_factory.mktemp("full")
    dump = str(out / "rollouts" / "{rollout_id}.jsonl")
    printed = _run(tiny_flags(tiny, out, "--num-rollout", "4", "--eval-interval", "2", "--eval-prompt-data",
                              "held_out", str(tiny["eval"]), "--save", str(out / "ckpt"), "--save-interval", "2",
                              "--save-debug-rollout-data", dump, "--use-kl-loss", "--kl-loss-coef", "0.001"))
    (out / "printed.txt").write_text(printed)
    return out, dump


def test_every_step_has_a_phase_timeline_that_adds_up_to_the_step_time(uninterrupted):
    rows = _metrics(uninterrupted[0])
    _assert_phases_add_up(rows)
    assert rows[0]["phase/eval"] > 0 and rows[0]["phase/rollout"] == 0  # step 0: the eval before training
    for r in rows[1:]:  # each phase is timed where it runs: the loop, the runtime, the trainer rank
        for p in ("rollout", "reward", "old_log_probs", "ref_log_probs", "packing", "train_fwd_bwd",
                  "train_optimizer", "sync"):
            assert r[f"phase/{p}"] > 0, (r["step"], p)
        # the trainer's sub-phases ran inside the runtime's train call
        trainer = sum(r[f"phase/{p}"] for p in ("old_log_probs", "ref_log_probs", "packing", "train_fwd_bwd",
                                                "train_optimizer"))
        assert trainer <= r["perf/train_time"]
    assert [r["step"] for r in rows if r["phase/checkpoint"] > 0] == [2, 4]  # --save-interval 2
    assert [r["step"] for r in rows if r["phase/eval"] > 0] == [0, 2, 4]


def test_run_summary_names_the_largest_phase(uninterrupted):
    from slime.timeline import PHASES, run_summary

    rows = _metrics(uninterrupted[0])
    printed = (uninterrupted[0] / "printed.txt").read_text()
    summary = run_summary(rows)
    totals = {p: sum(r[f"phase/{p}"] for r in rows) for p in PHASES}
    assert summary["largest"] == max(totals, key=totals.get)
    assert f"largest phase: {summary['largest']} (" in printed
    assert "run summary: 5 steps" in printed


def test_metrics_jsonl_holds_one_line_per_step_with_every_prefix(uninterrupted):
    out, _ = uninterrupted
    rows = _metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4] and [r["rollout_id"] for r in rows] == [-1, 0, 1, 2, 3]
    step1 = rows[1]
    for key in ("rollout/raw_reward", "rollout/response_length", "rollout/no_think_block_ratio",
                "rollout/truncated_ratio", "train/pg_loss", "train/entropy", "train/grad_norm",
                "train/train_rollout_kl", "perf/rollout_time", "perf/train_time", "perf/sync_time",
                "perf/rollout_tokens_per_s"):
        assert key in step1, key


def test_eval_is_logged_as_eval_name(uninterrupted):
    rows = _metrics(uninterrupted[0])
    assert [r["step"] for r in rows if "eval/held_out" in r] == [0, 2, 4]
    assert all(0.0 <= r["eval/held_out"] <= 1.0 for r in rows if "eval/held_out" in r)


def test_train_rollout_kl_is_zero_at_step_one_of_a_real_run(uninterrupted):
    rows = _metrics(uninterrupted[0])
    assert abs(rows[1]["train/train_rollout_kl"]) <= 1e-6


def test_reference_sanity_thresholds_hold_at_step_one(uninterrupted):
    """slime's own checks: at step 1 the policy is the old policy and the reference."""
    step1 = _metrics(uninterrupted[0])[1]
    assert abs(step1["train/ppo_kl"]) < 1e-8 and abs(step1["train/kl_loss"]) < 1e-8
    assert step1["train/train_rollout_logp_abs_diff"] <= 0.1
    assert step1["rollout/staleness_mean"] == 0.0


def test_resume_continues_at_next_rollout_id_with_no_prompt_repeated_or_skipped(tiny, uninterrupted, tmp_path):
    _, full_dump = uninterrupted
    dump = str(tmp_path / "rollouts" / "{rollout_id}.jsonl")
    ckpt = str(tmp_path / "ckpt")
    # Stop right after the save of rollout 1 ...
    _run(tiny_flags(tiny, tmp_path, "--num-rollout", "2", "--save", ckpt, "--save-interval", "2",
                    "--save-debug-rollout-data", dump))
    assert (Path(ckpt) / "latest_checkpointed_iteration.txt").read_text() == "2"
    # ... and resume it for the remaining two.
    _run(tiny_flags(tiny, tmp_path, "--num-rollout", "4", "--load", ckpt, "--save", ckpt, "--save-interval", "2",
                    "--save-debug-rollout-data", dump))
    rows = _metrics(tmp_path)
    assert [r["rollout_id"] for r in rows] == [0, 1, 2, 3]  # the resumed run started at 2, not 0
    assert _prompt_ids(dump, range(4)) == _prompt_ids(full_dump, range(4))
    state = json.loads((Path(ckpt) / "iter_0000004" / "state.json").read_text())
    # Versions never go back: 3 when saved at rollout 2, the resumed start-up sync made 4, then 2 updates.
    assert state["next_rollout_id"] == 4 and state["weight_version"] == 6


def test_colocated_mode_with_two_ddp_ranks_runs_a_step(tiny, ray_cluster, tmp_path):
    flags = tiny_flags(tiny, tmp_path, "--num-rollout", "1", "--colocate")
    flags[flags.index("--actor-num-gpus-per-node") + 1] = "2"
    _run(flags)
    (row,) = _metrics(tmp_path)
    assert row["rollout/num_samples"] == 16 and "train/pg_loss" in row and row["perf/sync_time"] > 0
    _assert_phases_add_up([row])  # colocated: the engines' release (offload) and resume (onload) are timed
    assert row["phase/offload"] > 0 and row["phase/onload"] > 0


def test_fully_async_runs_with_one_step_of_staleness(tiny, ray_cluster, tmp_path):
    _run(tiny_flags(tiny, tmp_path, "--num-rollout", "2"), entry="train_async")
    rows = _metrics(tmp_path)
    assert [r["rollout_id"] for r in rows] == [0, 1]
    assert rows[0]["rollout/staleness_mean"] == 0 and rows[1]["rollout/staleness_mean"] == 1
    _assert_phases_add_up(rows)  # rollout overlaps training here: phase/rollout is the loop's wait for it
    assert all(r["phase/reward"] == 0 and r["phase/train_fwd_bwd"] > 0 for r in rows)


def test_async_staleness_limit_0_drops_and_counts_where_1_keeps(tiny, ray_cluster, tmp_path):
    out0, out1 = tmp_path / "limit0", tmp_path / "limit1"
    _run(tiny_flags(tiny, out0, "--num-rollout", "3", "--max-weight-staleness", "0"), entry="train_async")
    _run(tiny_flags(tiny, out1, "--num-rollout", "3", "--max-weight-staleness", "1"), entry="train_async")
    rows0, rows1 = _metrics(out0), _metrics(out1)
    assert [r["rollout/staleness_mean"] for r in rows0] == [0, 0, 0]
    assert [r["rollout/stale_dropped_samples"] for r in rows0] == [0, 16, 16]
    assert [r["rollout/staleness_mean"] for r in rows1] == [0, 1, 1]
    assert [r["rollout/stale_dropped_samples"] for r in rows1] == [0, 0, 0]


def test_update_weights_interval_2_syncs_every_other_rollout(tiny, ray_cluster, tmp_path):
    _run(tiny_flags(tiny, tmp_path, "--num-rollout", "3", "--update-weights-interval", "2"))
    rows = _metrics(tmp_path)
    assert [r["rollout/staleness_mean"] for r in rows] == [0, 1, 0]
    assert ["perf/sync_time" in r for r in rows] == [False, True, True]  # and after the last rollout


def test_failing_reward_hook_names_the_hook_and_the_sample(tiny, ray_cluster, tmp_path):
    hook = tmp_path / "my_rm.py"
    hook.write_text("def reward(sample):\n    raise ValueError('grader crashed')\n")
    flags = tiny_flags(tiny, tmp_path, "--num-rollout", "1", "--custom-rm-path", f"{hook}:reward")
    with pytest.raises(Exception) as info:
        _run(flags)
    msg = str(info.value)
    assert f"{hook}:reward" in msg and "prompt_id=" in msg and "grader crashed" in msg
