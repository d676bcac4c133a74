"""``--rm-type gpqa``: multiple-choice grading by option letter.

The chosen letter is, in order: the last ``\\boxed{X}``; the last "answer is X" / "Answer: (X)";
else the whole answer when it is a single letter (``C``, ``(C)``, ``C.``). Only the text after the
reasoning block is read. The label is a letter (``C``, ``(C)``) or a 0-based option index.
"""

from __future__ import annotations

import re
import string

from slime.rewards.answer import last_boxed, split_after_think
from slime.rewards.math_reward import RewardResult

_LETTERS = string.ascii_uppercase[:10]  # A-J: GPQA has 4 options, MMLU-Pro up to 10
_ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*[*\s]*\(?\s*([A-J])\s*\)?(?![A-Za-z])", re.IGNORECASE)
_ALONE = re.compile(r"^\(?\s*([A-J])\s*\)?\s*\.?$")


def choice_letter(text: str) -> str | None:
    boxed = last_boxed(text)
    if boxed is not None:
        m = _ALONE.match(boxed.replace("\\text{", "").replace("}", "").strip())
        return m.group(1) if m else None
    found = _ANSWER_IS.findall(text)
    if found:
        return found[-1].upper()
    m = _ALONE.match(text.strip())
    return m.group(1) if m else None


def label_letter(label: object) -> str | None:
    if isinstance(label, int) and not isinstance(label, bool) and 0 <= label < len(_LETTERS):
        return _LETTERS[label]
    m = _ALONE.match(str(label or "").strip().upper())
    return m.group(1) if m else None


def gpqa(response: str, label: object) -> RewardResult:
    solution, has_think = split_after_think(response)
    gold = label_letter(label)
    if gold is None:
        return RewardResult(0.0, "no_label", has_think)
    pred = choice_letter(solution)
    if pred is None:
        return RewardResult(0.0, "no_answer", has_think)
    return RewardResult(1.0 if pred == gold else 0.0, "correct" if pred == gold else "wrong", has_think, pred)
