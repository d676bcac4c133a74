"""slime/timeline.py's clock: how nested phases, containers and phases measured elsewhere are booked
(the e2e runs in test_e2e_ray.py check the timeline of real steps adds up)."""
from __future__ import annotations

from slime.timeline import PHASES, PhaseClock, format_summary, run_summary


def _work() -> None:
    sum(i * i for i in range(20_000))  # a little real time, no sleep


def test_a_phase_nested_in_another_is_booked_once_to_the_inner_one():
    clock = PhaseClock()
    with clock.phase("sync"):
        _work()
        with clock.phase("onload"):
            _work()
    m = clock.metrics()
    assert m["phase/onload"] > 0 and m["phase/sync"] > 0
    assert m["phase/sync"] + m["phase/onload"] <= m["perf/step_time"]
    assert abs(sum(m[f"phase/{p}"] for p in PHASES) - m["perf/step_time"]) < 1e-9


def test_a_container_books_only_what_its_inner_phases_name_and_the_rest_is_idle():
    clock = PhaseClock()
    with clock.phase(None):
        _work()
        clock.absorb({"train_fwd_bwd": 0.0})
    m = clock.metrics()
    assert all(m[f"phase/{p}"] == 0.0 for p in PHASES if p != "idle")
    assert m["phase/idle"] == m["perf/step_time"] > 0


def test_absorbed_phases_are_taken_out_of_the_enclosing_phase():
    clock = PhaseClock()
    with clock.phase("sync"):
        _work()
        took = clock.elapsed()
        clock.absorb({"offload": took / 2})
    assert clock.seconds["offload"] == took / 2
    assert clock.seconds["sync"] + took / 2 <= clock.elapsed()


def test_move_rebooks_at_most_what_the_source_phase_holds():
    clock = PhaseClock()
    clock.absorb({"rollout": 2.0})
    clock.move("rollout", "reward", 5.0)  # a stale reward time larger than the wait
    assert clock.seconds == {"rollout": 0.0, "reward": 2.0}


def test_every_clock_reading_waits_for_the_device_first():
    """On a GPU the trainers pass torch.cuda.synchronize: queued kernels count in the phase that queued them."""
    calls = []
    clock = PhaseClock(sync=lambda: calls.append(1))
    with clock.phase("train_fwd_bwd"):
        pass
    assert len(calls) == 3  # construction, phase start, phase end


def test_the_run_summary_names_the_largest_phase_over_all_steps():
    rows = [{"perf/step_time": 3.0, "phase/rollout": 2.0, "phase/idle": 1.0},
            {"perf/step_time": 4.0, "phase/train_fwd_bwd": 3.5, "phase/idle": 0.5}]
    s = run_summary(rows)
    assert s["largest"] == "train_fwd_bwd" and s["steps"] == 2 and s["step_time"] == 7.0
    assert "largest phase: train_fwd_bwd (3.50 s, 50.0% of step time)" in format_summary(s)
