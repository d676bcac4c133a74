"""The one rule for characters answers printable ASCII by a shortcut: the shortcut refuses and
accepts exactly what the character-by-character rule does."""
from __future__ import annotations

import random

from lab.core.text_rule import FORBIDDEN_CHARS, TextRuleError, check_text


def _reference(text: str, allow_dash: bool) -> str | None:
    """The rule read character by character, its checks in their order: the first problem's key."""
    if any(ch in FORBIDDEN_CHARS for ch in text):
        return "input.char"
    if text.startswith("-") and not allow_dash:
        return "input.dash"
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in text):
        return "input.surrogate"
    return None


def _verdict(text: str, allow_dash: bool) -> str | None:
    try:
        check_text(text, allow_dash)
    except TextRuleError as exc:
        return exc.key
    return None


def test_the_printable_ascii_shortcut_agrees_with_the_rule_character_by_character():
    rng = random.Random(5)
    alphabet = ["a", "Z", "0", " ", "-", "$", "(", "\t", "\x0b", "\x7f", "\x00", "\r", "\n", "é", "中", "\ud800", "\udfff"]
    for _ in range(20_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))
        for allow_dash in (False, True):
            assert _verdict(text, allow_dash) == _reference(text, allow_dash), (text, allow_dash)


def test_numbers_and_switches_pass_untouched():
    for value in (0, 3.5, True, None):
        assert check_text(value) is value
