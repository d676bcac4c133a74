"""Reward and generate hooks: loading by path, contract checks, and safe calls."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from slime.rewards.hooks import (
    HookError,
    HookLoadError,
    acall_reward_hook,
    call_reward_hook,
    hook_path,
    load_function,
    reward_to_float,
)
from tests.refusal_codes import raised

HERE = Path(__file__).resolve().parent
FIXTURE_FILE = HERE / "fixtures_hooks" / "good_hooks.py"
DOTTED = "fixtures_hooks.good_hooks"


@dataclass
class FakeSample:
    response: str
    label: str
    metadata: dict[str, Any] = field(default_factory=dict)
    index: int = 0


@pytest.fixture(autouse=True)
def _fixtures_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))


def test_load_sync_hook_by_dotted_path() -> None:
    fn = load_function(f"{DOTTED}.sync_reward", kind="reward")
    assert call_reward_hook(fn, FakeSample("4", "4")) == 1.0
    assert hook_path(fn) == f"{DOTTED}.sync_reward"


def test_load_async_hook_by_colon_path() -> None:
    fn = load_function(f"{DOTTED}:async_reward", kind="reward")
    assert call_reward_hook(fn, FakeSample("4", "5")) == 0.0


def test_load_hook_by_file_path() -> None:
    fn = load_function(f"{FIXTURE_FILE}:async_reward", kind="reward")
    assert call_reward_hook(fn, FakeSample("x", "x")) == 1.0


def test_slime_style_and_simple_reward_signatures_are_accepted() -> None:
    slime_style = load_function(f"{DOTTED}.slime_style_reward", kind="reward")
    assert call_reward_hook(slime_style, FakeSample("a", "a"), args={"bonus": 3}) == 3.0
    simple = load_function(f"{DOTTED}.simple_reward", kind="reward")
    assert call_reward_hook(simple, FakeSample("a", "a", {"extra": 0.5})) == 1.5


def test_group_reward_hook_gets_the_whole_group() -> None:
    fn = load_function(f"{DOTTED}.group_reward", kind="group_reward")
    assert call_reward_hook(fn, [FakeSample("a", "a"), FakeSample("b", "a"), FakeSample("c", "a")]) == [0.0, 1.0, 2.0]


def test_group_reward_with_wrong_length_names_the_group() -> None:
    fn = load_function(f"{DOTTED}.short_group_reward", kind="group_reward")
    with pytest.raises(HookError, match="expected 2 rewards, got 1 values"):
        call_reward_hook(fn, [FakeSample("a", "a", index=4), FakeSample("b", "a", index=5)])


def test_async_hook_works_inside_a_running_loop_awaited_or_called() -> None:
    fn = load_function(f"{DOTTED}.async_reward", kind="reward")

    async def main() -> tuple[float, float]:
        called = call_reward_hook(fn, FakeSample("a", "a"))  # must not deadlock the running loop
        awaited = await acall_reward_hook(fn, FakeSample("a", "a"))
        return called, awaited

    assert asyncio.run(main()) == (1.0, 1.0)


def test_missing_module_names_kind_and_path() -> None:
    with pytest.raises(HookLoadError) as e:
        load_function("no_such_pkg.mod.fn", kind="reward")
    assert raised(e.value, "hooks.module_missing", kind="reward", path="no_such_pkg.mod.fn", module="no_such_pkg.mod")


def test_module_with_missing_dependency_is_reported_as_such() -> None:
    with pytest.raises(HookLoadError) as e:
        load_function("fixtures_hooks.broken_import.reward", kind="reward")
    assert raised(e.value, "hooks.package_missing", kind="reward")
    assert "slime_package_that_does_not_exist" in e.value.args[0].params["error"]


def test_missing_file_names_kind_and_path() -> None:
    with pytest.raises(HookLoadError) as e:
        load_function("nowhere/hook.py:gen", kind="generate")
    assert raised(e.value, "hooks.file_missing", kind="generate", path="nowhere/hook.py:gen")


def test_missing_attribute_lists_callables() -> None:
    with pytest.raises(HookLoadError) as e:
        load_function(f"{DOTTED}.nope", kind="reward")
    assert raised(e.value, "hooks.no_attribute", kind="reward", attr="nope")
    assert "sync_reward" in e.value.args[0].params["public"]


def test_not_callable_attribute_is_rejected() -> None:
    with pytest.raises(HookLoadError) as e:
        load_function(f"{DOTTED}.NOT_A_FUNCTION", kind="reward")
    assert raised(e.value, "hooks.not_callable", kind="reward", attr="NOT_A_FUNCTION", type="int")


def test_wrong_signature_is_rejected_before_the_run() -> None:
    with pytest.raises(HookLoadError) as e:
        load_function(f"{DOTTED}.too_many_params", kind="reward")
    assert raised(e.value, "hooks.signature", kind="reward", attr="too_many_params")
    assert e.value.args[0].params["forms"].startswith("(sample)")


def test_generate_hook_must_be_async() -> None:
    assert load_function(f"{DOTTED}.async_generate", kind="generate")
    with pytest.raises(HookLoadError) as e:
        load_function(f"{DOTTED}.sync_generate", kind="generate")
    assert raised(e.value, "hooks.not_async", kind="generate", attr="sync_generate")


def test_malformed_path_and_unknown_kind_are_rejected() -> None:
    with pytest.raises(HookLoadError) as e:
        load_function("justaname", kind="reward")
    assert raised(e.value, "hooks.not_a_path", kind="reward", path="justaname")
    with pytest.raises(ValueError, match="unknown hook kind 'rewards'.*group_reward"):
        load_function(f"{DOTTED}.sync_reward", kind="rewards")


def test_hook_exception_names_hook_and_sample_index() -> None:
    fn = load_function(f"{DOTTED}.raising_reward", kind="reward")
    with pytest.raises(HookError, match=r"'fixtures_hooks.good_hooks.raising_reward' raised on sample index 7.*grader crashed") as info:
        call_reward_hook(fn, FakeSample("a", "b", index=7))
    assert info.value.sample_index == 7 and info.value.kind == "reward"


def test_dict_reward_with_reward_key_picks_the_number() -> None:
    fn = load_function(f"{DOTTED}.dict_reward", kind="reward")
    assert call_reward_hook(fn, FakeSample("a", "b"), reward_key="score") == 0.5


def test_dict_reward_without_reward_key_says_to_set_it() -> None:
    fn = load_function(f"{DOTTED}.dict_reward", kind="reward")
    with pytest.raises(HookError, match=r"dict with keys \['acc', 'score'\]; set --reward-key"):
        call_reward_hook(fn, FakeSample("a", "b"))


def test_dict_reward_with_missing_key_names_key_and_keys() -> None:
    fn = load_function(f"{DOTTED}.dict_reward", kind="reward")
    with pytest.raises(HookError, match=r"--reward-key 'reward' is not in the returned dict; its keys: \['acc', 'score'\]"):
        call_reward_hook(fn, FakeSample("a", "b"), reward_key="reward")


def test_non_numeric_reward_is_rejected() -> None:
    fn = load_function(f"{DOTTED}.string_reward", kind="reward")
    with pytest.raises(HookError, match="a reward must be a number"):
        call_reward_hook(fn, FakeSample("a", "b"))
    with pytest.raises(ValueError, match="non-finite"):
        reward_to_float(float("nan"))
