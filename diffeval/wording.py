"""How diffeval's messages, notes and titles word a count."""

from __future__ import annotations


def counted(number: int | None, noun: str) -> str:
    """ "1 document", "3 documents" (nouns with a plain plural)."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"
