"""Over-sampling, the dynamic filter, partial rollout and R3 flags: real embedded engines behind
our router (in-process, no Ray) for the manager; one real tiny run on Ray for the loop + queue."""

from __future__ import annotations

import json
import subprocess
import threading
import time

import pytest

from slime.args import UsageError, parse_args, validate, warnings
from slime.config import DataConfig, EvalConfig, RolloutConfig, SamplingConfig
from slime.data.sample import Sample, Status
from slime.data.train_data import build_records
from tests.refusal_codes import codes, has, raised
from tests.runtime.conftest import tiny_flags

pytestmark = pytest.mark.timeout(120)

_HOOK = """
import time
def group_reward(samples):
    time.sleep({sleep})  # the engine keeps decoding the next group meanwhile
    if samples[0].prompt_id % 2 == 0:
        return [float(i % 2) for i in range(len(samples))]
    return [1.0] * len(samples)
"""

# The same reward, then a call the test installs (AFTER): it runs in the manager's thread once a
# group is scored, before the manager decides whether the batch is complete.
_GATE_HOOK = _HOOK.format(sleep=0.0) + """
AFTER = None

def gated_reward(samples):
    rewards = group_reward(samples)
    if AFTER is not None:
        AFTER(samples)
    return rewards
"""


class Lockstep:
    """Makes the test's orderings certain instead of likely (timing alone raced under CI load: the
    engine once finished every row before the batch was complete, so the abort found nothing).

    Rows ignore EOS, so every row runs its full budget. The engine may not start an iteration while
    a finished group waits to be scored, so groups finish one at a time and nothing runs ahead of
    the scorer. When the group that completes the batch is scored (the `armed`-th even one), the
    engine is let on until the next group is decoding, then held until the manager's abort has
    landed: the abort always finds a row mid-decode, with tokens to return."""

    def __init__(self, core, armed: int) -> None:
        self.core, self.batcher, self.armed, self.seen = core, core.batcher, armed, 0
        self.go = threading.Event()
        self.go.set()
        self._iteration, self._finish = self.batcher._iteration, self.batcher._finish
        self.batcher._iteration, self.batcher._finish = self._gated_iteration, self._held_finish

    def close(self) -> None:
        self.batcher._iteration, self.batcher._finish = self._iteration, self._finish
        self.go.set()

    def _gated_iteration(self) -> None:
        assert self.go.wait(60), "the engine was held for 60 s"
        self._iteration()

    def _held_finish(self, r, kind: str, matched=None) -> None:
        self._finish(r, kind, matched)
        if r.batch.left == 0 and kind != "abort":
            self.go.clear()  # this group is on its way to the scorer: wait for it

    def scored(self, samples) -> None:
        self.seen += samples[0].prompt_id % 2 == 0
        if self.seen != self.armed:
            self.go.set()
            return
        epoch = self.core._abort_epoch
        self.go.set()
        deadline = time.monotonic() + 30
        while self.batcher.running() == 0:  # a running row holds at least its prefill token
            assert time.monotonic() < deadline, "no group was left to decode after the batch was complete"
            time.sleep(0.002)
        self.go.clear()

        def release() -> None:
            end = time.monotonic() + 30
            while self.core._abort_epoch == epoch and time.monotonic() < end:
                time.sleep(0.002)
            self.go.set()
        threading.Thread(target=release, daemon=True).start()


def _wait_for_resumed(partial, armed: int):
    """Rollout 1: when the group that completes the batch is scored, wait until every buffered
    sample has been continued, so the abort cannot land before a buffered group was admitted."""
    before = {id(s): s.response_length for s in partial}
    seen = [0]

    def after(samples) -> None:
        seen[0] += samples[0].prompt_id % 2 == 0
        if seen[0] == armed:
            deadline = time.monotonic() + 30
            while not all(s.response_length > before[id(s)] for s in partial):
                assert time.monotonic() < deadline, "a buffered sample was not continued within 30 s"
                time.sleep(0.005)
    return after


@pytest.fixture(scope="module")
def stack(tiny, tmp_path_factory):
    """One embedded engine (HTTP) registered with our router, both in this process."""
    from slime.inference.engine_core import EngineCore
    from slime.rollout.client import RouterAdmin
    from slime.rollout.engines.embedded import EngineServer
    from slime.rollout.router import RouterServer

    core = EngineCore(str(tiny["model"]), seed=0)
    engine, router = EngineServer(core), RouterServer()
    url, rurl = engine.start(), router.start()
    RouterAdmin(rurl).add_worker(url)
    hooks = tmp_path_factory.mktemp("hooks")
    (hooks / "rm.py").write_text(_HOOK.format(sleep=0.25))
    (hooks / "rm_fast.py").write_text(_HOOK.format(sleep=0.0))
    (hooks / "rm_gate.py").write_text(_GATE_HOOK)
    yield {"core": core, "router": rurl, "hooks": hooks}
    engine.stop()
    router.stop()


def _manager(tiny, stack, hook="rm.py", fn="group_reward", **kw):
    from slime.rollout.manager import RolloutManager

    data = DataConfig(str(tiny["train"]), "prompt", "label", apply_chat_template=True, rollout_shuffle=True)
    ro = RolloutConfig(rollout_batch_size=2, n_samples_per_prompt=2, sampling=SamplingConfig(max_response_len=24),
                       custom_rm_path=f"{stack['hooks'] / hook}:{fn}", group_rm=True, **kw)
    return RolloutManager(data, ro, EvalConfig(), str(tiny["model"]), stack["router"])


def test_over_sampling_keeps_exactly_rbs_groups_and_drops_the_rest_without_partial(tiny, stack):
    stack["core"].step_delay_s = 0.0
    m = _manager(tiny, stack, hook="rm_fast.py", over_sampling_batch_size=4)
    samples, metrics = m.generate(0)
    assert len(samples) == 4 and [s.group_index for s in samples] == [0, 0, 1, 1]
    assert len({samples[0].prompt_id, samples[2].prompt_id}) == 2
    assert metrics["rollout/over_sampling_rounds"] == 1 and metrics["rollout/filtered_groups"] == 0
    assert m.buffer == []  # without --partial-rollout, aborted work is dropped
    assert m.source.position.offset == 4  # four prompts were submitted for a batch of two


def test_filter_abort_partial_resume_and_offpolicy_mask(tiny, stack, monkeypatch):
    from slime.rewards.hooks import load_function
    from slime.rollout import manager

    core = stack["core"]
    core.step_delay_s = 0.01
    core.batcher.max_running = 2  # one group at a time: later groups queue behind the kept ones
    core.weight_version = "0"
    plain = manager.sampling_params
    monkeypatch.setattr(manager, "sampling_params", lambda *a, **k: {**plain(*a, **k), "ignore_eos": True})
    hook = load_function(f"{stack['hooks'] / 'rm_gate.py'}:gated_reward", kind="group_reward").__globals__
    m = _manager(tiny, stack, hook="rm_gate.py", fn="gated_reward", over_sampling_batch_size=6,
                 partial_rollout=True, mask_offpolicy_in_partial_rollout=True,
                 dynamic_sampling_filter_path="slime.rollout.filters.nonzero_reward_std")
    lockstep = Lockstep(core, armed=2)  # the second kept group completes the batch of two
    hook["AFTER"] = lockstep.scored
    try:
        try:
            samples, metrics = m.generate(0)
        finally:
            hook["AFTER"] = None
            lockstep.close()
        assert lockstep.seen >= 2, "the group that completed the batch went through the lockstep"
        assert len(samples) == 4 and [s.group_index for s in samples] == [0, 0, 1, 1]
        assert all(s.prompt_id % 2 == 0 for s in samples)  # odd prompts score uniformly: std 0, dropped
        assert sorted({s.reward for s in samples}) == [0.0, 1.0]
        for key in ("rollout/filtered_groups", "rollout/aborted_samples", "rollout/over_sampling_rounds",
                    "rollout/partial_resumed_samples", "rollout/offpolicy_token_frac"):
            assert key in metrics
        assert metrics["rollout/aborted_samples"] > 0 and m.buffer
        partial = [s for g in m.buffer for s in g if s.status == Status.ABORTED and s.response_tokens]
        assert partial, "an abort mid-generation must return the tokens generated so far"
        old = {id(s): (list(s.response_tokens), list(s.rollout_log_probs)) for s in partial}
        assert all(s.token_versions == [0] * s.response_length for s in partial)
        assert all(len(s.rollout_log_probs) == s.response_length < 24 for s in partial)

        # The checkpointed buffer round-trips through JSON.
        state = json.loads(json.dumps(m.state_for(1)))
        assert [[Sample.from_dict(d).response_tokens for d in g] for g in state["partial_buffer"]] == \
            [[s.response_tokens for s in g] for g in m.buffer]

        core.weight_version = "1"  # as after a weight sync
        hook["AFTER"] = _wait_for_resumed(partial, armed=2)
        samples1, metrics1 = m.generate(1)
        assert metrics1["rollout/partial_resumed_samples"] >= len(partial)
        resumed = [s for s in partial if s.response_length > len(old[id(s)][0])]
        assert resumed == partial, "buffered samples are continued in the next rollout"
        for s in resumed:
            k = len(old[id(s)][0])
            assert s.response_tokens[:k] == old[id(s)][0] and s.rollout_log_probs[:k] == old[id(s)][1]
            assert s.token_versions == [0] * k + [1] * (s.response_length - k)
            assert s.response_length <= 24  # the continuation got only the remaining budget
        for s in samples1:  # the mask zeroes exactly the tokens of the older version
            assert s.loss_mask == [int(v >= 1) for v in s.token_versions]
        recs = build_records(samples1, 2, 2, "grpo", True, True)
        assert [r.response_mask for r in recs] == [s.loss_mask for s in samples1]
    finally:
        hook["AFTER"] = None
        core.step_delay_s = 0.0
        core.batcher.max_running = None


def test_loss_mask_reaches_the_padded_loss_tensor():
    import torch

    from slime.backends.embedded.trainer import pad_records

    s = [Sample(i, i // 2, "p", [5, 6], reward=float(i % 2), response_tokens=[7, 8, 9],
                rollout_log_probs=[-1.0] * 3, token_versions=[0, 0, 1], loss_mask=[0, 0, 1]) for i in range(4)]
    recs = build_records(s, 2, 2, "grpo", True, True)
    padded = pad_records(recs, 0, torch.device("cpu"))
    assert padded.loss_mask[0].tolist() == [0.0, 0.0, 0.0, 1.0]


def _base(tiny, tmp_path, *extra):
    return tiny_flags(tiny, tmp_path, "--num-rollout", "1", *extra)


def test_invalid_combinations_are_refused_with_their_flags(tiny, tmp_path):
    errs = lambda *f: codes(validate(parse_args(_base(tiny, tmp_path, *f))))  # noqa: E731
    assert has(validate(parse_args(_base(tiny, tmp_path, "--over-sampling-batch-size", "3"))), "args.over_sampling",
               over=3, rbs=4)
    assert "args.mask_without_partial" in errs("--mask-offpolicy-in-partial-rollout")
    flags = _base(tiny, tmp_path, "--dynamic-sampling-filter-path", "slime.rollout.filters.nonzero_reward_std")
    flags[flags.index("--n-samples-per-prompt") + 1] = "1"
    assert has(validate(parse_args(flags + ["--disable-rewards-normalization"])), "args.filter_one_sample")
    assert "args.queue_pair" in errs("--rollout-queue-dir", str(tmp_path / "q"))
    assert "embedded.trainer_r3" in errs("--use-rollout-routing-replay")
    assert "embedded.trainer_routing_replay" in errs("--use-routing-replay")
    w = codes(warnings(parse_args(_base(tiny, tmp_path, "--partial-rollout"))))
    assert "args.warn_partial_no_over" in w and "args.warn_partial_no_mask" in w
    assert not warnings(parse_args(_base(tiny, tmp_path, "--partial-rollout", "--over-sampling-batch-size", "8",
                                         "--use-tis")))
    with pytest.raises(UsageError) as e:
        parse_args(_base(tiny, tmp_path, "--partial-rollouts"))
    assert raised(e.value, "usage.unknown_flag_hint", flag="--partial-rollouts")


def test_lab_rendered_moe_experiment_with_partial_rollout_r3_and_queue_parses(tmp_path):
    from lab.render import write_files
    from lab.rules.dependents import apply_change, new_experiment
    from lab.web.export import experiment_files

    exp = new_experiment("glm4.7-flash")
    for path, value in {"rollout.partial_rollout": True, "rollout.over_sampling_batch_size": 64,
                        "corrections.r3": True, "rollout.queue": True,
                        "rollout.queue_state_dir": "/tmp/straw"}.items():
        exp, _ = apply_change(exp, path, value)
    write_files(experiment_files(exp), tmp_path)
    body = (tmp_path / "experiment.sh").read_text().rstrip()
    lib = tmp_path / "lib.sh"
    lib.write_text(body[: -len('main "$@"')])
    out = subprocess.run(["bash", "-c", 'source "$1"; printf "%s\\0" "${TRAIN_ARGS[@]}"', "x", str(lib)],
                         capture_output=True, check=True)
    argv = out.stdout.decode().split("\0")[:-1]
    assert "--partial-rollout" in argv and "--use-rollout-routing-replay" in argv
    cfg = parse_args(argv)  # parse only: no unknown flag
    assert cfg.rollout.partial_rollout and cfg.rollout.over_sampling_batch_size == 64
    assert cfg.loss.use_rollout_routing_replay
    assert argv[argv.index("--rollout-queue-dir") + 1] == "/tmp/straw"
    assert argv[argv.index("--rollout-queue-run-id") + 1] == exp.rollout.queue_run_id


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_async_run_with_over_sampling_partial_rollout_and_straw_queue(tiny, ray_cluster, tmp_path):
    import importlib

    from slime.ray.runtime import PreflightError

    q = tmp_path / "straw"
    flags = tiny_flags(tiny, tmp_path, "--num-rollout", "2", "--over-sampling-batch-size", "6", "--partial-rollout",
                       "--mask-offpolicy-in-partial-rollout", "--rollout-queue-dir", str(q),
                       "--rollout-queue-run-id", "exp-1", "--save", str(tmp_path / "ckpt"), "--save-interval", "2")
    importlib.import_module("train_async").main(flags)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout_id"] for r in rows] == [0, 1]
    assert all(r["rollout/num_samples"] == 16 and r["rollout/over_sampling_rounds"] == 1 for r in rows)
    from slime.rollout.queue import RolloutQueue

    queue = RolloutQueue(q, "exp-1")
    assert list(queue.pending()) == []  # both rollouts were trained and acked
    queue.close()
    state = json.loads((tmp_path / "ckpt" / "iter_0000002" / "state.json").read_text())
    assert "partial_buffer" in state and state["data_position"]["offset"] > 0
    with pytest.raises(PreflightError) as e:
        importlib.import_module("train").main([*flags[:-6], "--rollout-queue-dir", str(q),
                                               "--rollout-queue-run-id", "exp-2"])
    assert raised(e.value, "queue.other_run", owner="exp-1", run_id="exp-2")
