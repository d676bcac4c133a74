"""Final-answer extraction and normalization for rule-based math rewards.

Pure string work (no sympy, no math-verify): extraction finds *what* the model answered,
normalization removes presentation differences (``$``, ``\\left``, units, ``\\dfrac``...), so the
cheap exact and numeric comparisons in :mod:`slime.rewards.math_reward` catch most cases before
the symbolic check.
"""

from __future__ import annotations

import re
from fractions import Fraction

THINK_CLOSE = "</think>"
RESPONSE_MARKER = "###Response"
_BOX_COMMANDS = ("\\boxed", "\\fbox")


def split_after_think(response: str) -> tuple[str, bool]:
    """Return (text to grade, whether a think-close tag or ``###Response`` marker was found).

    The text to grade is what follows the *last* marker: answers inside the reasoning are drafts.
    """
    for marker in (THINK_CLOSE, RESPONSE_MARKER):
        pos = response.rfind(marker)
        if pos != -1:
            return response[pos + len(marker) :], True
    return response, False


def _braced_content(text: str, open_pos: int) -> str | None:
    """Content of the ``{...}`` group opening at ``open_pos``, with nested-brace matching."""
    depth = 0
    i = open_pos
    while i < len(text):
        ch = text[i]
        if ch == "\\":  # skip escaped chars such as \{ and \} (set braces)
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[open_pos + 1 : i]
        i += 1
    return None  # unbalanced: the response was cut off inside the box


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (or ``\\boxed 5``), else None."""
    best_pos, best_cmd = -1, ""
    for cmd in _BOX_COMMANDS:
        pos = text.rfind(cmd)
        if pos > best_pos:
            best_pos, best_cmd = pos, cmd
    if best_pos == -1:
        return None
    rest_pos = best_pos + len(best_cmd)
    if text.startswith(" ", rest_pos):  # "\boxed 5": the argument runs to the next space or $
        match = re.match(r"\s*([^\s$]+)", text[rest_pos:])
        return match.group(1) if match else None
    brace = text.find("{", rest_pos)
    if brace == -1 or text[rest_pos:brace].strip():
        return None
    content = _braced_content(text, brace)
    return content.strip() if content is not None else None


_ANSWER_IS = re.compile(
    r"(?:final answer|answer)\s*(?:is|:|=)\s*:?\s*(.+?)(?:\s*$|\n|(?<=[^\d])\.\s)",
    re.IGNORECASE,
)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def extract_answer(text: str, *, boxed_only: bool = False) -> str | None:
    """The final answer: last ``\\boxed{}``/``\\fbox{}``, else "answer is X" / "Answer: X",
    else the last number. ``boxed_only`` stops after the first step. None when nothing is found.
    """
    boxed = last_boxed(text)
    if boxed is not None or boxed_only:
        return boxed
    matches = list(_ANSWER_IS.finditer(text))
    if matches:
        candidate = matches[-1].group(1).strip().strip("$").strip()
        if candidate:
            return candidate
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


_UNIT_WORDS = (
    "degrees?|deg|cm|mm|km|m|meters?|centimeters?|inches|inch|in|feet|foot|ft|units?|"
    "square units|sq units|cents?|dollars?|hours?|hrs?|minutes?|mins?|seconds?|secs?|s|"
    "kg|g|grams?|pounds?|lbs?|miles?|mph|liters?|l|ml|days?|weeks?|years?|points?|people|ways"
)
# Bare trailing units skip one-letter and ambiguous words: "5m" may be 5 times the variable m.
_BARE_UNIT_WORDS = "|".join(w for w in _UNIT_WORDS.split("|") if w not in {"m", "s", "g", "l", "in"})
_TEXT_UNIT = re.compile(r"\\(?:text|mbox|mathrm)\{\s*(?:" + _UNIT_WORDS + r")(?:\^?\{?[23]\}?)?\s*\}")
_TRAILING_UNIT = re.compile(r"(?<=[\d}])\s*(?:" + _BARE_UNIT_WORDS + r")(?:\^?\{?[23]\}?)?$")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mbox|mathrm)\{([^{}]*)\}")
THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")


def _fix_fracs(s: str) -> str:
    r"""``\frac12`` -> ``\frac{1}{2}``, ``\frac1{2}`` -> ``\frac{1}{2}``."""
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", s)
    return s


def normalize_answer(answer: str) -> str:
    """Canonical string for comparison; the result has no spaces."""
    s = answer.strip()
    s = s.replace("\n", "").replace("\\!", "").replace("\\displaystyle", "")
    s = re.sub(r"\\[,;:]|\\quad|\\qquad|~", " ", s)
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("dfrac", "frac").replace("tfrac", "frac")
    # "\$" (an escaped dollar sign) first: otherwise its backslash survives and "\$1,000"
    # would keep its comma (and fail the thousands rule).
    s = s.replace("\\$", "").replace("$", "")
    # Units: "\text{ cm}" and "5 cm" both mean 5 in these data sets.
    s = _TEXT_UNIT.sub("", s)
    s = re.sub(r"\^\s*\{?\\circ\}?|°|\\circ", "", s)
    s = _TEXT_WRAPPER.sub(r"\1", s)
    s = s.strip()
    s = _TRAILING_UNIT.sub("", s).strip()
    s = s.replace("\\%", "").replace("%", "")
    s = s.rstrip(".").strip()
    s = s.replace("{,}", ",")
    if THOUSANDS.match(s.replace(" ", "")):
        s = s.replace(",", "")
    # "x = 5" -> "5" when the left side is a short variable name (not for "x+y=5").
    match = re.match(r"^\s*[a-zA-Z]\w{0,1}\s*=\s*(.+)$", s)
    if match:
        s = match.group(1)
    s = _fix_fracs(s)
    s = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)
    s = s.replace(" ", "")
    if s.startswith("."):
        s = "0" + s
    s = s.replace("-.", "-0.")
    # "5.0" and "5" are the same number written twice.
    if re.fullmatch(r"-?\d+\.0+", s):
        s = s.split(".")[0]
    return s


_FRAC = re.compile(r"^(-?)\\frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}$")


def to_number(s: str) -> float | None:
    r"""Float value of a normalized plain number, ``a/b`` or ``\frac{a}{b}``; None otherwise."""
    try:
        if re.fullmatch(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", s):
            return float(s)
        match = re.fullmatch(r"(-?\d+(?:\.\d+)?)/(-?\d+(?:\.\d+)?)", s)
        if match:
            return float(Fraction(match.group(1)) / Fraction(match.group(2)))
        match = _FRAC.match(s)
        if match:
            sign = -1.0 if match.group(1) else 1.0
            return sign * float(Fraction(match.group(2)) / Fraction(match.group(3)))
    except (ValueError, ZeroDivisionError):
        return None
    return None
