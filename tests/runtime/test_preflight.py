"""Problems found before Ray reserves anything end with a named cause."""

from __future__ import annotations

import pytest

from slime.args import parse_args
from slime.ray.runtime import PreflightError, preflight
from tests.refusal_codes import raised
from tests.runtime.conftest import tiny_flags


def _refused(argv) -> PreflightError:
    with pytest.raises(PreflightError) as info:
        preflight(parse_args(argv))
    return info.value


def _problems(argv) -> str:
    return str(_refused(argv))


def test_missing_data_file_names_the_flag_and_path(tiny, tmp_path):
    flags = tiny_flags(tiny, tmp_path, "--num-rollout", "1")
    flags[flags.index("--prompt-data") + 1] = str(tmp_path / "missing.jsonl")
    assert raised(_refused(flags), "args.prompt_data_missing", path=str(tmp_path / "missing.jsonl"))


def test_malformed_jsonl_line_is_named_before_start(tiny, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "123", "label": "3"}\n{"prompt": "4\n')
    flags = tiny_flags(tiny, tmp_path, "--num-rollout", "1")
    flags[flags.index("--prompt-data") + 1] = str(bad)
    assert f"{bad}:2: malformed JSON line" in _problems(flags)


def test_unloadable_reward_hook_is_named_before_start(tiny, tmp_path):
    msg = _problems(tiny_flags(tiny, tmp_path, "--num-rollout", "1", "--custom-rm-path", "no_such_module.reward"))
    assert "no_such_module.reward" in msg


def test_hook_with_a_wrong_signature_is_refused_before_start(tiny, tmp_path):
    hook = tmp_path / "rm.py"
    hook.write_text("def reward(a, b, c, d):\n    return 1.0\n")
    assert raised(_refused(tiny_flags(tiny, tmp_path, "--num-rollout", "1", "--custom-rm-path", f"{hook}:reward")),
                  "hooks.signature", attr="reward")


def test_load_without_the_marker_is_an_error_not_a_fresh_start(tiny, tmp_path):
    (tmp_path / "ckpt" / "iter_0000002").mkdir(parents=True)
    refused = _refused(tiny_flags(tiny, tmp_path, "--num-rollout", "1", "--load", str(tmp_path / "ckpt")))
    assert raised(refused, "checkpoint.no_marker_found", flag="--load", marker="latest_checkpointed_iteration.txt")
