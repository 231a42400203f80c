"""Named scoring rules for retrieval outputs: how many of the expected strings an output holds.

A rule is registered once by name (`register`); a task lists the rules it scores by (`Task.scoring_rules`, built with
`described`), the first being the run's, and `diffeval report --scoring RULE` rescores the stored outputs by another.
`default` and `ruler` are registered here; a task with its own rule registers it in its module, next to its recipe.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ScoringRule:
    name: str
    description: str  # what the rule counts, as the report's note names it
    hits: Callable[[str, list[str]], int]  # (output, expected) → how many expected strings the output holds


RULES: dict[str, ScoringRule] = {}


def register(rule: ScoringRule) -> ScoringRule:
    """Add a rule; a name means one rule, so a second rule under a taken name is refused."""
    if rule.name in RULES:
        raise ValueError(f"scoring rule {rule.name!r} is already registered")
    RULES[rule.name] = rule
    return rule


def described(names: list[str] | tuple[str, ...]) -> dict[str, str]:
    """name → description of the named rules, in order: a task's `scoring_rules` (the first is its run's)."""
    return {name: RULES[name].description for name in names}


def score(output: str, expected: list[str], rule: str = "default") -> tuple[float, bool]:
    """Fraction of the expected strings the rule finds in the output; correct = all found."""
    hits = RULES[rule].hits(output, expected)
    return hits / len(expected), hits == len(expected)


# A number as a model may write it: plain digits, or 3-digit groups with one kind of separator (4,821,937 / 4 821 937
# / 4.821.937 / 4'821'937); never part of a longer number (no digit, and no decimal point and digit, on either side)
_NUMBER = re.compile(
    r"(?<!\d)(?<!\d\.)"
    r"(?:\d{1,3}(?:,\d{3})+|\d{1,3}(?:\.\d{3})+|\d{1,3}(?:'\d{3})+|\d{1,3}(?: \d{3})+|\d+)"
    r"(?!\d)(?!\.\d)"
)
_CONTROL = re.compile(r"[\x00-\x1f]")


def numbers_in(output: str) -> set[str]:
    """Every number in the output, separators removed."""
    return {re.sub(r"[,.' ]", "", number) for number in _NUMBER.findall(output)}


def _number_hits(output: str, expected: list[str]) -> int:
    found = numbers_in(output)
    return sum(number in found for number in expected)


def _ruler_hits(output: str, expected: list[str]) -> int:
    """RULER's postprocess_pred (control characters to newlines, stripped), then string_match_all."""
    text = _CONTROL.sub("\n", output).strip().lower()
    return sum(reference.lower() in text for reference in expected)


register(ScoringRule(
    "default",
    "the fraction of expected numbers found as whole numbers, plain or with one kind of separator between 3-digit "
    "groups (4,821,937, 4 821 937, 4.821.937, 4'821'937)",
    _number_hits,
))  # fmt: skip
register(ScoringRule(
    "ruler",
    "RULER's string_match_all: the fraction of expected numbers found as case-insensitive substrings of the output",
    _ruler_hits,
))  # fmt: skip
