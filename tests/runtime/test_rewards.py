"""Built-in rewards: answer extraction, normalization, grading, and the think-block metric."""

from __future__ import annotations

import threading

import pytest

from slime.rewards import REWARD_TYPES, RewardResult, get_reward_fn, summarize_reward_results, think_block_warning
from slime.rewards.answer import extract_answer, last_boxed, normalize_answer
from tests.refusal_codes import raised

# (response, label, expected score) for --rm-type math.
MATH_CASES = [
    ("So \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("So \\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("So \\boxed{1/2}", "\\frac12", 1.0),
    ("So \\boxed{\\dfrac{3}{4}}", "\\frac{3}{4}", 1.0),
    ("So \\boxed{\\tfrac{3}{4}}", "0.75", 1.0),
    ("So \\boxed{\\frac{1}{3}}", "0.5", 0.0),
    ("So \\boxed{2.50}", "2.5", 1.0),
    ("So \\boxed{5.0}", "5", 1.0),
    ("So \\boxed{[1, 2)}", "[1,2)", 1.0),
    ("So \\boxed{(1,2)}", "[1,2)", 0.0),
    ("So \\boxed{(1,2]}", "(1,2]", 1.0),
    ("So \\boxed{\\left[1,2\\right)}", "[1,2)", 1.0),
    ("So \\boxed{5\\text{ cm}}", "5", 1.0),
    ("So \\boxed{5 cm}", "5", 1.0),
    ("So \\boxed{90^\\circ}", "90", 1.0),
    ("So \\boxed{90^{\\circ}}", "90", 1.0),
    ("So \\boxed{30\\text{ degrees}}", "30", 1.0),
    ("So \\boxed{50\\%}", "50", 1.0),
    ("So \\boxed{1,000}", "1000", 1.0),
    ("So \\boxed{1{,}000{,}000}", "1000000", 1.0),
    ("So \\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", 1.0),
    ("So \\boxed{\\frac{\\sqrt{3}}{3}}", "\\frac{1}{\\sqrt{3}}", 1.0),
    ("So \\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),
    ("So \\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    ("So \\boxed{x = 4}", "4", 1.0),
    ("$\\boxed{-\\!3}$.", "-3", 1.0),
    ("First \\boxed{3}, wait, actually \\boxed{4}", "4", 1.0),
    ("First \\boxed{4}, wait, actually \\boxed{3}", "4", 0.0),
    ("The answer is \\fbox{7}", "7", 1.0),
    ("Thus the answer is 42.", "42", 1.0),
    ("Answer: 3/4", "0.75", 1.0),
    ("We get 3 apples and then 12 pears", "12", 1.0),
    ("So \\boxed{\\{1,2\\}}", "\\{2,1\\}", 1.0),
    ("So \\boxed{\\pi}", "\\boxed{\\pi}", 1.0),
    ("So \\boxed{7}", "8", 0.0),
    ("I cannot solve this.", "8", 0.0),
]


@pytest.mark.parametrize("response,label,expected", MATH_CASES)
def test_math_reward_hard_cases(response: str, label: str, expected: float) -> None:
    result = get_reward_fn("math")(response, label)
    assert result.score == expected, result


def test_math_reward_table_is_large_enough() -> None:
    assert len(MATH_CASES) >= 25


def test_missing_answer_scores_zero_with_reason_no_answer() -> None:
    result = get_reward_fn("math")("I cannot solve this.", "8")
    assert result == RewardResult(0.0, "no_answer", False)


def test_boxed_math_needs_a_boxed_answer() -> None:
    fn = get_reward_fn("boxed_math")
    assert fn("Thus the answer is 42.", "42").reason == "no_answer"
    assert fn("Thus \\boxed{42}.", "42").score == 1.0


def test_missing_label_scores_zero_with_reason_no_label() -> None:
    assert get_reward_fn("math")("\\boxed{1}", "").reason == "no_label"
    assert get_reward_fn("math")("\\boxed{1}", None).reason == "no_label"


def test_nested_braces_in_boxed_are_matched() -> None:
    assert last_boxed("x \\boxed{\\frac{\\sqrt{3}}{2}} y") == "\\frac{\\sqrt{3}}{2}"
    assert last_boxed("\\boxed{\\{1, 2\\}}") == "\\{1, 2\\}"
    assert last_boxed("cut off \\boxed{\\frac{1}{2") is None


def test_extraction_order_boxed_then_answer_is_then_last_number() -> None:
    assert extract_answer("answer is 3 but \\boxed{4}") == "4"
    assert extract_answer("2 apples; the final answer is 5") == "5"
    assert extract_answer("2 apples and 7 pears") == "7"
    assert extract_answer("no digits here") is None


def test_normalization_strips_presentation() -> None:
    assert normalize_answer("$\\left( 1, 2 \\right)$") == "(1,2)"
    assert normalize_answer("\\dfrac{1}{2}.") == "\\frac{1}{2}"
    assert normalize_answer("12{,}345") == "12345"
    assert normalize_answer("45^\\circ") == "45"
    assert normalize_answer("(1,000)") == "(1,000)"  # a tuple, not a thousands separator


def test_deepscaler_grades_only_after_last_think_close() -> None:
    fn = get_reward_fn("deepscaler")
    assert fn("<think>maybe \\boxed{3}</think> so \\boxed{4}", "4").score == 1.0
    assert fn("<think>\\boxed{4}</think> so \\boxed{3}", "4").score == 0.0
    assert fn("<think>a</think>b</think>\\boxed{4}", "4").score == 1.0


def test_deepscaler_without_think_block_reports_no_think_block() -> None:
    result = get_reward_fn("deepscaler")("the answer is \\boxed{4}", "4")
    assert result == RewardResult(0.0, "no_think_block", False)


def test_deepscaler_accepts_response_marker() -> None:
    result = get_reward_fn("deepscaler")("thinking...###Response The answer is \\boxed{4}", "4")
    assert result.score == 1.0 and result.has_think_block


def test_deepscaler_reads_boxed_label() -> None:
    assert get_reward_fn("deepscaler")("</think>\\boxed{\\frac{1}{2}}", "\\boxed{0.5}").score == 1.0


def test_no_think_block_ratio_metric_counts_and_warns() -> None:
    fn = get_reward_fn("deepscaler")
    results = [fn("\\boxed{1}", "1"), fn("\\boxed{1}", "1"), fn("</think>\\boxed{1}", "1"), fn("</think>none", "1")]
    metrics = summarize_reward_results(results)
    assert metrics["rollout/no_think_block_ratio"] == 0.5
    assert metrics["rollout/no_answer_ratio"] == 0.25
    assert metrics["rollout/reward_mean"] == 0.25
    assert think_block_warning(metrics) is None
    warning = think_block_warning(summarize_reward_results(results[:3]))
    assert warning is not None and "--rm-type math" in warning


def test_f1_reward_counts_token_overlap() -> None:
    fn = get_reward_fn("f1")
    assert fn("The Eiffel Tower", "eiffel tower").score == 1.0
    assert fn("Eiffel Tower in Paris", "Eiffel Tower").score == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert fn("London", "Paris").score == 0.0


def test_random_reward_is_seeded_and_marked_test_only() -> None:
    fn = get_reward_fn("random")
    scores = [fn(f"r{i}", "x").score for i in range(40)]
    assert scores == [fn(f"r{i}", "x").score for i in range(40)]
    assert set(scores) == {0.0, 1.0}
    assert fn("a", "b").reason == "random_test_only"


def test_unknown_reward_type_lists_builtins() -> None:
    with pytest.raises(ValueError) as e:
        get_reward_fn("mathh")
    assert raised(e.value, "rewards.unknown_type", name="mathh")
    assert "boxed_math, dapo, deepscaler, f1, gpqa, math, random, remote_rm" in e.value.args[0].params["known"]
    assert set(REWARD_TYPES) == {"deepscaler", "math", "boxed_math", "dapo", "f1", "gpqa", "random"}


def test_symbolic_grading_works_outside_main_thread() -> None:
    # Reward workers and async Ray actors grade off the main thread, where SIGALRM is unusable.
    results: list[RewardResult] = []
    worker = threading.Thread(target=lambda: results.append(get_reward_fn("math")("\\boxed{x^2+2x+1}", "(x+1)^2")))
    worker.start()
    worker.join(30)
    assert results and results[0].score == 1.0
