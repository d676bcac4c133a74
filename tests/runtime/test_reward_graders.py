"""Graders users rely on: ordered lists and assignments, the f1 yes/no rule, dapo, gpqa, boxed_
variants of any reward, and the remote reward model against a real local HTTP server."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from slime.data.sample import Sample
from slime.rewards import get_reward_fn, make_reward_fn, reward_type_error, reward_type_names
from slime.rewards.remote import RemoteRewardError
from tests.refusal_codes import has


@pytest.mark.parametrize("pred, gold, score", [
    ("x=2, y=3", "x=3, y=2", 0.0),    # assignments compared in order
    ("x=3, y=2", "x=3, y=2", 1.0),
    ("y=2, x=3", "x=3, y=2", 0.0),    # the variable names must match too
    ("3, 2", "x=3, y=2", 1.0),        # bare values against an assignment list
    ("3, 3", "3", 0.0),               # multiplicity is kept
    ("2, 3", "3, 2", 0.0),            # a bare comma list is an ordered tuple
    ("(2, 3)", "(3, 2)", 0.0),
    ("\\frac{1}{2}, 3", "0.5, 3", 1.0),  # items are still compared numerically / symbolically
    ("\\{1, 2\\}", "\\{2, 1\\}", 1.0),   # a set stays a set
    ("1,000", "1000", 1.0),           # thousands separators are not lists
])
def test_math_lists_are_ordered_tuples_with_multiplicity(pred, gold, score):
    assert get_reward_fn("math")(f"The answer is \\boxed{{{pred}}}", gold).score == score


@pytest.mark.parametrize("pred", ["\\$1,000", "$1,000", "\\$1000", "1,000"])
def test_escaped_dollar_thousands_scores_one_in_deepscaler_and_answer_matching(pred):
    """Regression (issue 27): ``\\$1,000`` against ``1000`` scored 0 because the backslash of the
    escaped dollar hid the thousands separator and the comma split made two items."""
    from slime.rewards.math_reward import answers_match, split_top_level

    assert split_top_level(pred) == [pred.replace("\\$", "").strip("$")]
    assert answers_match(pred, "1000") is True
    assert get_reward_fn("deepscaler")(f"<think>sum it</think> \\boxed{{{pred}}}", "1000").score == 1.0
    assert get_reward_fn("math")(f"The answer is \\boxed{{{pred}}}", "1000").score == 1.0
    # A real list of two dollar amounts is still two items, in order.
    assert answers_match("\\$1, \\$2", "\\$2, \\$1") is False


def test_math_verify_equivalences_and_grading_after_think_are_kept():
    fn = get_reward_fn("math")
    assert fn("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}").score == 1.0
    assert fn("draft \\boxed{7} </think> so \\boxed{8}", "8").score == 1.0
    assert fn("draft \\boxed{8} </think> so \\boxed{7}", "8").score == 0.0


@pytest.mark.parametrize("pred, gold, score", [
    ("yes it is", "yes", 0.0), ("yes", "yes", 1.0), ("no", "yes", 0.0), ("no answer", "noanswer", 0.0),
    ("the cat sat", "a cat sat down", pytest.approx(2 * (2 / 2) * (2 / 3) / (1 + 2 / 3))),
])
def test_f1_yes_no_no_answer_rule(pred, gold, score):
    assert get_reward_fn("f1")(pred, gold).score == score


def test_dapo_reads_the_last_answer_line_and_scores_plus_minus_one():
    fn = get_reward_fn("dapo")
    assert fn("work... Answer: 12\nmore? Answer: 42", "42").score == 1.0
    assert fn("<think>Answer: 42</think> Answer: 41", "42").score == -1.0
    assert fn("\\boxed{42}", "42").reason == "no_answer" and fn("\\boxed{42}", "42").score == -1.0
    assert fn("Answer: $\\frac{1}{2}$", "0.5").score == 1.0


@pytest.mark.parametrize("response, label, score", [
    ("The answer is (C).", "C", 1.0), ("Answer: B", "(C)", 0.0), ("\\boxed{D}", 3, 1.0),
    ("<think>answer is A</think> Answer: **C**", "C", 1.0), ("C", "c", 1.0), ("I think so", "A", 0.0),
])
def test_gpqa_grades_the_chosen_letter(response, label, score):
    assert get_reward_fn("gpqa")(response, label).score == score


def test_boxed_variant_of_any_reward_grades_only_the_boxed_answer():
    assert get_reward_fn("boxed_f1")("blah \\boxed{paris}", "Paris").score == 1.0
    assert get_reward_fn("boxed_f1")("paris", "Paris").reason == "no_answer"
    assert get_reward_fn("boxed_gpqa")("answer is A but \\boxed{B}", "B").score == 1.0
    assert get_reward_fn("boxed_deepscaler")("<think>x</think> \\boxed{4}", "4").score == 1.0
    assert reward_type_error("boxed_dapo") is None and reward_type_error("boxed_remote_rm") is None
    assert "unknown --rm-type 'boxed_nope'" in reward_type_error("boxed_nope")
    assert {"dapo", "gpqa", "remote_rm"} <= set(reward_type_names())


class _RM(BaseHTTPRequestHandler):
    calls: list = []
    fail_first = 0
    delay = 0.0

    def do_POST(self):  # noqa: N802 - http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls.append(body)
        if len(type(self).calls) <= type(self).fail_first:
            self.send_response(503)
            self.end_headers()
            return
        time.sleep(type(self).delay)
        out = {"score": float(body["response"] == body["label"]) + len(body["metadata"].get("bonus", ""))}
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture()
def rm_server():
    _RM.calls, _RM.fail_first, _RM.delay = [], 0, 0.0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RM)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/score", _RM
    server.shutdown()


def _sample(response="42", label="42"):
    return Sample(prompt_id=7, group_index=1, prompt="what is 6 x 7?", prompt_tokens=[1], label=label,
                  metadata={"bonus": ""}, response=response)


def test_remote_reward_posts_prompt_response_label_metadata(rm_server):
    url, handler = rm_server
    from slime.rollout.rewards import RewardScorer

    scorer = RewardScorer("remote_rm", None, False, None, rm_url=url, rm_timeout=5, rm_max_retries=0)
    samples = [_sample(), _sample("41")]
    metrics = scorer.score(samples, 2)
    assert [s.reward for s in samples] == [1.0, 0.0] and metrics["rollout/reward_mean"] == 0.5
    assert {c["prompt"] for c in handler.calls} == {"what is 6 x 7?"} and handler.calls[0]["metadata"] == {"bonus": ""}


def test_remote_reward_retries_server_errors_then_succeeds(rm_server):
    url, handler = rm_server
    handler.fail_first = 2
    fn = make_reward_fn("remote_rm", url, timeout=5, max_retries=2)
    fn.backoff_s = 0.01
    assert fn("42", "42", sample=_sample()).score == 1.0 and len(handler.calls) == 3


def test_remote_reward_gives_up_after_bounded_retries_naming_the_sample(rm_server):
    url, handler = rm_server
    handler.fail_first = 10
    fn = make_reward_fn("remote_rm", url, timeout=5, max_retries=1)
    fn.backoff_s = 0.01
    with pytest.raises(RemoteRewardError, match=r"prompt_id=7 group=1.*after 2 attempt.*HTTP 503"):
        fn("42", "42", sample=_sample())
    assert len(handler.calls) == 2


def test_remote_reward_times_out(rm_server):
    url, handler = rm_server
    handler.delay = 1.0
    fn = make_reward_fn("remote_rm", url, timeout=0.2, max_retries=0)
    with pytest.raises(RemoteRewardError, match="--rm-timeout 0.2"):
        fn("42", "42", sample=_sample())


def test_boxed_remote_reward_sends_only_the_boxed_answer(rm_server):
    url, handler = rm_server
    fn = make_reward_fn("boxed_remote_rm", url, timeout=5, max_retries=0)
    assert fn("so \\boxed{42}", "42", sample=_sample()).score == 1.0
    assert handler.calls[-1]["response"] == "42"


def test_remote_reward_flags_are_checked_before_start():
    from slime.args import parse_args, validate

    base = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "1"]
    assert has(validate(parse_args([*base, "--rm-type", "remote_rm"])), "args.remote_url")
    assert has(validate(parse_args([*base, "--rm-type", "math", "--rm-url", "http://x"])), "args.rm_url_unused")
