"""The data the tasks read: shipped texts, local folders and hub datasets, each checked where it is read."""

from __future__ import annotations

from pathlib import Path

from diffeval.errors import InputError


def read_utf8(path: Path, what: str = "") -> str:
    """A data file's text; one that is not UTF-8 is refused in one line, never read with replaced bytes. `what`
    names the file in the message ("haystack file")."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        named = f"{what} {path}" if what else str(path)
        raise InputError(f"{named} is not UTF-8 text (byte {exc.start:,}): save it as UTF-8") from None
