"""Rule-based math grading: exact -> numeric -> symbolic (math-verify).

The cheap checks run first; math-verify (sympy underneath) is the last resort because it is slow
and can hang on adversarial input. Its own timeouts use SIGALRM, which only works in the main
thread, so off the main thread (reward worker threads, async Ray actors) we disable them and
bound the call with a daemon worker thread instead: a hung check is abandoned and graded wrong.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from dataclasses import dataclass

from slime.rewards.answer import THOUSANDS, extract_answer, normalize_answer, split_after_think, to_number

logger = logging.getLogger(__name__)

SYMBOLIC_TIMEOUT_S = 5
"""Upper bound on one math-verify comparison."""

MAX_SYMBOLIC_CHARS = 1000
"""Answers longer than this skip the symbolic check: they are never the short final answers the
rule-based data sets hold, and sympy time grows quickly with expression size."""


@dataclass(frozen=True)
class RewardResult:
    """One graded response.

    ``reason`` is machine-readable: ``correct``, ``wrong``, ``no_answer``, ``no_label``,
    ``no_think_block``; rollout metrics count them (see :func:`summarize_reward_results`).
    ``has_think_block`` is True when a ``</think>`` tag or ``###Response`` marker was found.
    """

    score: float
    reason: str
    has_think_block: bool
    extracted: str | None = None


class _SilenceNoTimeoutWarning(logging.Filter):
    # math-verify logs a warning on every call made with timeouts disabled; we bound the call
    # ourselves, so the warning is noise in the rollout log.
    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader", "math_verify.utils"):
    logging.getLogger(_name).addFilter(_SilenceNoTimeoutWarning())


def _verify_now(gold: str, pred: str, timeout: int | None) -> bool:
    try:
        from math_verify import parse, verify
    except ImportError as exc:  # the lab's base install does not carry the runtime extras
        raise ImportError("math rewards need math-verify: pip install 'math-verify>=0.7'") from exc
    gold_parsed = parse(f"${gold}$", parsing_timeout=timeout)
    pred_parsed = parse(f"${pred}$", parsing_timeout=timeout)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=timeout))


def symbolic_equal(gold: str, pred: str, timeout_s: int = SYMBOLIC_TIMEOUT_S) -> bool:
    """math-verify equivalence, safe from any thread; False on error or timeout."""
    if len(gold) > MAX_SYMBOLIC_CHARS or len(pred) > MAX_SYMBOLIC_CHARS:
        return False
    if threading.current_thread() is threading.main_thread():
        try:
            return _verify_now(gold, pred, timeout_s)
        except ImportError:
            raise
        except Exception:  # math-verify raises on odd input; an unparsable answer is wrong
            return False
    result: list[bool] = []
    missing: list[ImportError] = []

    def work() -> None:
        try:
            result.append(_verify_now(gold, pred, None))
        except ImportError as exc:
            missing.append(exc)
        except Exception:  # math-verify raises on odd input; an unparsable answer is wrong
            logger.debug("math-verify failed on %r vs %r", gold, pred, exc_info=True)

    worker = threading.Thread(target=work, name="math-verify", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        logger.warning("math-verify timed out after %ss on %r vs %r", timeout_s, gold[:80], pred[:80])
        return False
    if missing:
        raise missing[0]
    return bool(result and result[0])


_ASSIGNMENT = re.compile(r"^\s*([a-zA-Z]\w?)\s*=\s*(.+)$", re.DOTALL)
_OPEN, _CLOSE = "([{", ")]}"


def split_top_level(answer: str) -> list[str]:
    """Split at commas outside brackets: ``x=2, y=3`` -> two items, ``(1, 2)`` -> one.

    A thousands-separated number (``1,000``) is one item. ``\\{``/``\\}`` count as brackets,
    so a set stays whole (sets are compared as sets, by math-verify).
    """
    # An escaped dollar (``\$1,000``) goes before the comma split, like a bare one: its backslash
    # would otherwise hide the thousands separator and split one number into ``\$1`` and ``000``.
    text = answer.strip().replace("\\$", "").strip("$").strip()
    if THOUSANDS.match(text.replace(" ", "")):
        return [text]
    items, depth, start, i = [], 0, 0, 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
            depth += 1 if text[i + 1] == "{" else -1
            i += 2
            continue
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
        i += 1
    items.append(text[start:])
    return [x.strip() for x in items if x.strip()]


def _element_match(pred: str, gold: str) -> bool:
    """One item of a list: assignments must name the same variable; values must match."""
    p, g = _ASSIGNMENT.match(pred), _ASSIGNMENT.match(gold)
    if p and g and p.group(1) != g.group(1):
        return False
    return _scalar_match(p.group(2) if p else pred, g.group(2) if g else gold)


def answers_match(pred: str, gold: str) -> bool:
    """True when two extracted answers are equal: normalized string, number, or symbolically.

    A top-level comma list (``x=2, y=3``; ``3, 3``) is an ordered tuple: same length, items
    equal in order (an assignment's variable too). math-verify alone would compare such lists as
    sets, so ``x=2, y=3`` would match ``x=3, y=2`` and ``3, 3`` would match ``3``.
    """
    pred_items, gold_items = split_top_level(pred), split_top_level(gold)
    if len(pred_items) > 1 or len(gold_items) > 1:
        return len(pred_items) == len(gold_items) and all(
            _element_match(p, g) for p, g in zip(pred_items, gold_items))
    return _scalar_match(pred, gold)


def _scalar_match(pred: str, gold: str) -> bool:
    norm_pred, norm_gold = normalize_answer(pred), normalize_answer(gold)
    if not norm_pred or not norm_gold:
        return False
    if norm_pred == norm_gold:
        return True
    num_pred, num_gold = to_number(norm_pred), to_number(norm_gold)
    if num_pred is not None and num_gold is not None:
        # Both plain numbers: the numeric verdict is final (no need to wake sympy).
        return math.isclose(num_pred, num_gold, rel_tol=1e-6, abs_tol=1e-9)
    return symbolic_equal(gold, pred) or symbolic_equal(norm_gold, norm_pred)


def gold_answer(label: object) -> str:
    text = "" if label is None else str(label).strip()
    if "\\boxed" in text or "\\fbox" in text:
        boxed = extract_answer(text, boxed_only=True)
        return boxed if boxed is not None else text
    return text


def grade(solution: str, label: object, *, has_think_block: bool, boxed_only: bool) -> RewardResult:
    """Grade ``solution`` (already cut after the think block) against ``label``."""
    gold = gold_answer(label)
    if not gold:
        return RewardResult(0.0, "no_label", has_think_block)
    pred = extract_answer(solution, boxed_only=boxed_only)
    if pred is None or not pred.strip():
        return RewardResult(0.0, "no_answer", has_think_block)
    if answers_match(pred, gold):
        return RewardResult(1.0, "correct", has_think_block, pred)
    return RewardResult(0.0, "wrong", has_think_block, pred)


def math_reward(response: str, label: object) -> RewardResult:
    """``--rm-type math``: the final answer (boxed, "answer is X", else last number) vs label.

    With a think block, only the text after it is graded; without one, the whole response.
    """
    solution, has_think = split_after_think(response)
    return grade(solution, label, has_think_block=has_think, boxed_only=False)


def boxed_math_reward(response: str, label: object) -> RewardResult:
    """``--rm-type boxed_math``: like math, but only a ``\\boxed{}`` answer counts."""
    solution, has_think = split_after_think(response)
    return grade(solution, label, has_think_block=has_think, boxed_only=True)
