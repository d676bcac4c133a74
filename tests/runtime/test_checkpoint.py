"""Checkpoints: the marker is written last; half-written checkpoints are refused, never loaded."""

from __future__ import annotations

import pytest
import torch

from slime.checkpoint import MARKER, CheckpointError, resolve_checkpoint, save_checkpoint
from tests.refusal_codes import raised


def _save(root, it=3):
    return save_checkpoint(root, it, {"w": torch.arange(1000, dtype=torch.float32)}, {"state": {}, "param_groups": []},
                           {"next_rollout_id": it, "data_position": {"epoch": 0, "offset": 12}})


def test_a_complete_checkpoint_round_trips_its_state(tmp_path):
    _save(tmp_path)
    ck = resolve_checkpoint(tmp_path)
    assert ck.path.name == "iter_0000003" and (tmp_path / MARKER).read_text() == "3"
    assert ck.state["data_position"] == {"epoch": 0, "offset": 12}
    assert torch.equal(ck.weights()["w"], torch.arange(1000, dtype=torch.float32))


def test_half_written_checkpoint_is_never_loaded(tmp_path):
    # 1. The save died before the marker: refused, and the message says why.
    d = _save(tmp_path)
    (tmp_path / MARKER).unlink()
    with pytest.raises(CheckpointError) as e:
        resolve_checkpoint(tmp_path)
    assert raised(e.value, "checkpoint.no_marker_found", marker="latest_checkpointed_iteration.txt")
    assert "iter_0000003" in e.value.args[0].params["found"]
    # 2. Marker present but a file truncated (disk full, copy interrupted): refused too.
    _save(tmp_path)
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError) as e:
        resolve_checkpoint(tmp_path)
    assert raised(e.value, "checkpoint.file_changed") and e.value.args[0].params["file"].endswith("model.safetensors")


def test_load_of_an_empty_directory_is_an_error_not_a_fresh_start(tmp_path):
    with pytest.raises(CheckpointError) as e:
        resolve_checkpoint(tmp_path, "--load")
    assert raised(e.value, "checkpoint.no_marker", flag="--load")


def test_the_marker_is_replaced_atomically(tmp_path):
    _save(tmp_path, 2)
    _save(tmp_path, 4)
    assert (tmp_path / MARKER).read_text() == "4"
    assert not list(tmp_path.glob("*.tmp"))
