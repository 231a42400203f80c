"""Windows of long documents: each the longest stretch of text from its start, cut at whitespace, that fits a pass of
`ctx` − 1 tokens after the document-start token in every model's tokens, so every model scores the same bytes (the
position left over is the one token vLLM must generate after a prompt)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from diffeval.data import books
from diffeval.errors import InputError
from diffeval.models.backend import Tokenizer

if TYPE_CHECKING:  # annotations only: heavy libraries load inside the functions that use them (a fast CLI)
    import numpy as np


@dataclass(frozen=True)
class Window:
    sample_id: str
    doc: str
    title: str
    group: str  # resampled as one unit: a book's windows are not independent
    index: int  # the window's number within its document
    start: int  # character offsets into the document's text
    end: int
    bytes: int
    ctx: int


def token_limits(tokenizers: dict[str, Tokenizer], ctx: int) -> dict[str, int]:
    """Per model, the text tokens a pass of `ctx` holds after its document-start token and before the one position
    left over."""
    limits = {}
    for model, tokenizer in tokenizers.items():
        start = tokenizer.document_start()
        if not start:
            raise InputError(f"model {model}: its tokenizer has neither a BOS nor an EOS token to start a document")
        limits[model] = ctx - 1 - len(start)
    return limits


def cut_windows(
    doc: books.Document, count: int, tokenizers: dict[str, Tokenizer], limits: dict[str, int], ctx: int
) -> list[tuple[int, int]]:
    """The (start, end) character offsets of the document's first `count` disjoint windows, in every model's tokens."""
    spans, start = [], 0
    for index in range(count):
        start = _skip_space(doc.text, start)
        ends = {m: _fitted_end(doc, start, tokenizers[m], limits[m], index, count, ctx) for m in tokenizers}
        end = _shared_end(doc.text, start, min(ends.values()), tokenizers, limits)
        spans.append((start, end))
        start = end
    return spans


def window_text(window: Window, source: str, data_dir: str | None, docs: int | None) -> str:
    """The window's text, read again from its documents (`books.load`'s arguments)."""
    (doc,) = [d for d in books.load(source, data_dir, docs) if d.id == window.doc]
    return doc.text[window.start : window.end]


def _skip_space(text: str, start: int) -> int:
    while start < len(text) and text[start].isspace():
        start += 1
    return start


def _fitted_end(doc: books.Document, start: int, tokenizer: Tokenizer, limit: int, index: int, count: int,
                ctx: int) -> int:  # fmt: skip
    """The character end of the first `limit` tokens of the document's text from `start`, in this tokenizer; the
    document is too short if its rest holds fewer."""
    span = limit * 8
    while True:
        piece = doc.text[start : start + span]
        encoding = tokenizer.encode(piece, special_tokens=False)
        if len(encoding.ids) >= limit:
            return start + encoding.offsets[limit - 1][1]
        if start + span >= len(doc.text):
            if index == 0:
                raise InputError(
                    f"--ctx {ctx:,} is longer than document {doc.id}: its text holds {len(encoding.ids):,} tokens "
                    "from its first chapter: use a shorter --ctx"
                )
            raise InputError(
                f"--windows {count}: document {doc.id} holds {index} window(s) of --ctx {ctx:,}: "
                f"use --windows {index} or a shorter --ctx"
            )
        span *= 2


def _shared_end(text: str, start: int, end: int, tokenizers: dict[str, Tokenizer], limits: dict[str, int]) -> int:
    """`end` moved back to the whitespace before it, and further back while a model's tokens of the window would be
    over its limit (a cut can tokenize differently from the text around it)."""
    while True:
        cut = max(text.rfind(" ", start, end), text.rfind("\n", start, end))
        end = cut if cut > start else end
        window = text[start:end]
        if all(len(t.encode(window, special_tokens=False).ids) <= limits[m] for m, t in tokenizers.items()):
            return end
        end -= 1


def char_bytes(text: str) -> np.ndarray:
    """Each character's UTF-8 length."""
    import numpy as np

    return np.fromiter((len(c.encode("utf-8")) for c in text), dtype=np.int64, count=len(text))


def byte_to_char(text: str) -> np.ndarray:
    """Index by byte offset (0 .. bytes) → the character that byte belongs to (the text's length at the end)."""
    import numpy as np

    return np.append(np.repeat(np.arange(len(text)), char_bytes(text)), len(text))
