"""slime/profiling.py: with SLIME_PROFILE_DIR set, the chosen call of a trainer leaves its
operator table; the other calls, and every call without the variable, leave nothing."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from slime.profiling import ENV_CALL, ENV_DIR, CallProfiler  # noqa: E402


def _work() -> None:
    a = torch.randn(64, 64)
    (a @ a).sum()


def test_the_chosen_call_leaves_its_operator_table_and_no_other(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_DIR, str(tmp_path / "prof"))
    monkeypatch.setenv(ENV_CALL, "2")
    p = CallProfiler("train")
    for _ in range(3):
        with p(rank=0):
            _work()
    files = sorted(x.name for x in (tmp_path / "prof").iterdir())
    assert files == ["train_call2_rank0.txt"]
    assert "aten::mm" in (tmp_path / "prof" / files[0]).read_text()


def test_without_the_variable_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_DIR, raising=False)
    monkeypatch.chdir(tmp_path)
    p = CallProfiler("train")
    for _ in range(3):
        with p(rank=0):
            _work()
    assert p.calls == 3 and list(tmp_path.iterdir()) == []


def test_a_call_number_that_is_not_one_names_the_variable_and_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    for bad in ("second", "0", "-1"):
        monkeypatch.setenv(ENV_CALL, bad)
        with pytest.raises(ValueError, match=f"{ENV_CALL}=.*whole number from 1"):
            with CallProfiler("train")(rank=0):
                _work()
