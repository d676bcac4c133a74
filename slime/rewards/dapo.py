"""``--rm-type dapo``: the DAPO math grader's rule.

The answer is what follows the last ``Answer:`` after the reasoning block (DAPO's prompt asks for
``Answer: $ANSWER`` on the last line). A correct answer scores 1.0, anything else -1.0, as DAPO
defines the reward (a missing answer is wrong, not neutral). Equality uses this project's math
comparison (normalized string, number, then math-verify) where DAPO compares normalized strings
only: ``0.5`` vs ``\\frac{1}{2}`` is correct here.
"""

from __future__ import annotations

import re

from slime.rewards.answer import split_after_think
from slime.rewards.math_reward import RewardResult, answers_match, gold_answer

_ANSWER = re.compile(r"Answer\s*:\s*([^\n]+)", re.IGNORECASE)
DAPO_CORRECT, DAPO_WRONG = 1.0, -1.0


def dapo(response: str, label: object) -> RewardResult:
    solution, has_think = split_after_think(response)
    gold = gold_answer(label)
    if not gold:
        return RewardResult(DAPO_WRONG, "no_label", has_think)
    found = _ANSWER.findall(solution)
    if not found:
        return RewardResult(DAPO_WRONG, "no_answer", has_think)
    pred = found[-1].strip().strip("$").strip().rstrip(".")
    if pred and answers_match(pred, gold):
        return RewardResult(DAPO_CORRECT, "correct", has_think, pred)
    return RewardResult(DAPO_WRONG, "wrong", has_think, pred)
