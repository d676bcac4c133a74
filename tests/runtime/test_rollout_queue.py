"""straw, the persistent rollout queue: durability and recovery (pure unit tests, no Ray)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slime.rollout.queue import INDEX, SEGMENTS, QueueError, RolloutQueue, _encode, check_run_id
from tests.refusal_codes import raised

REPO = Path(__file__).resolve().parents[2]


def _seg(root: Path) -> Path:
    return sorted((root / SEGMENTS).glob("*.jsonl"))[-1]


def test_put_ack_reopen_delivers_unacked_once(tmp_path):
    q = RolloutQueue(tmp_path, "run-a")
    seqs = [q.put({"rollout_id": i, "samples": [{"t": [i, i]}]}) for i in range(4)]
    assert seqs == [1, 2, 3, 4]
    q.ack(1)
    q.ack(3)
    q.close()
    q = RolloutQueue(tmp_path, "run-a")
    assert [(s, p["rollout_id"]) for s, p in q.pending()] == [(2, 1), (4, 3)]
    assert q.put({"rollout_id": 9}) == 5  # sequence numbers continue, never reused
    q.close()


def test_torn_record_from_a_crash_mid_write_is_cut_and_nothing_is_lost_or_duplicated(tmp_path):
    q = RolloutQueue(tmp_path, "run-a")
    for i in range(3):
        q.put({"rollout_id": i})
    q.close()
    line = _encode(4, {"rollout_id": 3, "big": "x" * 100})
    with _seg(tmp_path).open("ab") as f:  # the 4th put died half-way through its write
        f.write(line[: len(line) // 2])
    q = RolloutQueue(tmp_path, "run-a")
    assert [p["rollout_id"] for _, p in q.pending()] == [0, 1, 2]
    assert q.recovered["torn_bytes"] == len(line) // 2
    assert q.put({"rollout_id": 3}) == 4
    q.close()
    q = RolloutQueue(tmp_path, "run-a")
    assert [p["rollout_id"] for _, p in q.pending()] == [0, 1, 2, 3]
    q.close()


def test_record_written_but_not_indexed_is_adopted_exactly_once(tmp_path):
    q = RolloutQueue(tmp_path, "run-a")
    q.put({"rollout_id": 0})
    q.close()
    with _seg(tmp_path).open("ab") as f:  # fsync'ed, then the process died before the index update
        f.write(_encode(2, {"rollout_id": 1}))
    for _ in range(2):  # reopening twice adopts it once
        q = RolloutQueue(tmp_path, "run-a")
        assert [(s, p["rollout_id"]) for s, p in q.pending()] == [(1, 0), (2, 1)]
        q.close()
    assert json.loads((tmp_path / INDEX).read_text())["next_seq"] == 3


def test_committed_bytes_missing_is_refused_not_silently_lost(tmp_path):
    q = RolloutQueue(tmp_path, "run-a")
    q.put({"rollout_id": 0})
    q.put({"rollout_id": 1})
    q.close()
    seg = _seg(tmp_path)
    os.truncate(seg, seg.stat().st_size - 5)
    with pytest.raises(QueueError) as e:
        RolloutQueue(tmp_path, "run-a")
    assert raised(e.value, "queue.segment_short")


def test_another_run_id_is_refused_and_a_second_producer_too(tmp_path):
    q = RolloutQueue(tmp_path, "run-a")
    q.put({"x": 1})
    with pytest.raises(QueueError) as e:
        RolloutQueue(tmp_path, "run-a")
    assert raised(e.value, "queue.in_use")
    q.close()
    with pytest.raises(QueueError) as e:
        check_run_id(tmp_path, "run-b")
    assert raised(e.value, "queue.other_run", owner="run-a", run_id="run-b")
    with pytest.raises(QueueError) as e:
        RolloutQueue(tmp_path, "run-b")
    assert raised(e.value, "queue.other_run", owner="run-a", run_id="run-b")


def test_segments_roll_and_fully_acked_ones_are_deleted(tmp_path):
    q = RolloutQueue(tmp_path, "run-a", segment_bytes=200)
    for i in range(10):
        q.put({"rollout_id": i, "pad": "y" * 60})
    assert len(list((tmp_path / SEGMENTS).glob("*.jsonl"))) > 3
    for s in range(1, 9):
        q.ack(s)
    q.close()
    assert len(list((tmp_path / SEGMENTS).glob("*.jsonl"))) <= 2
    q = RolloutQueue(tmp_path, "run-a", segment_bytes=200)
    assert [p["rollout_id"] for _, p in q.pending()] == [8, 9]
    q.close()


_WRITER = """
import sys
from slime.rollout.queue import RolloutQueue
q = RolloutQueue(sys.argv[1], "run-k", segment_bytes=4096)
i = 0
while True:
    q.put({"rollout_id": i, "pad": "z" * 300})
    print(i, flush=True)
    i += 1
"""


def test_kill_minus_nine_mid_stream_loses_and_duplicates_nothing(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    acked_by_writer = -1
    deadline = time.monotonic() + 20
    while acked_by_writer < 40 and time.monotonic() < deadline:
        acked_by_writer = int(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    q = RolloutQueue(tmp_path, "run-k", segment_bytes=4096)
    ids = [p["rollout_id"] for _, p in q.pending()]
    assert ids == list(range(len(ids)))  # contiguous, no duplicate
    assert len(ids) >= acked_by_writer + 1  # every put that returned survived
    q.close()
