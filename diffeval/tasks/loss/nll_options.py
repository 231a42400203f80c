"""NLL's options (`NLLOptions`: the length of a pass, documents and windows per document, the data, position buckets,
the models' training length) and their checks."""

from __future__ import annotations

from dataclasses import dataclass

from diffeval.config import context_option, option, parse_ctx
from diffeval.data.books import book_files
from diffeval.errors import InputError


@dataclass(frozen=True)
class NLLOptions:
    """NLL by position: each document (or each of its --windows) scored in one pass of --ctx tokens."""

    ctx: list[int] = context_option([4096], help="tokens per pass (one length), e.g. 64k")
    docs: int | None = option(None, type=int, help="documents to score [default: all]")
    windows: int = option(1, help="disjoint windows of --ctx tokens per document")
    data: str = option("books", help="books (the --data-dir folder, else the shipped book) | hf:DATASET[:SPLIT]")
    data_dir: str | None = option(None, help="a books folder: books.jsonl + <id>.txt (../shared/datasets/books)",
                                  applies=(lambda options: options.data == "books", "with --data books"),
                                  reads=lambda o: book_files(o.data_dir) if o.data == "books" else [])  # fmt: skip
    buckets: int = option(16, help="position buckets per window, for the tables and the curve")
    trained_at: int | None = option(
        None,
        help="the models' training length, e.g. 8k: adds the change in loss past it [default: none]",
        parse=lambda v: parse_ctx(v)[0] if v not in (None, "") else None,
        identity=False,
    )

    def validate(self) -> None:
        if len(self.ctx) != 1:
            raise InputError(f"--ctx {self.ctx}: give one length; each document gets one pass at it")
        if self.docs is not None and self.docs < 1:
            raise InputError(f"--docs {self.docs}: give at least 1, or leave it out to score every document")
        if self.windows < 1:
            raise InputError(f"--windows {self.windows}: give at least 1")
        if not 1 <= self.buckets <= self.ctx[0] // 2:
            raise InputError(f"--buckets {self.buckets}: give 1 to {self.ctx[0] // 2} (half of --ctx)")
        if self.trained_at is not None and self.trained_at * self.buckets < self.ctx[0]:
            raise InputError(
                f"--trained-at {self.trained_at:,} is shorter than one bucket ({self.ctx[0] // self.buckets:,} "
                "tokens): give more --buckets or a longer --trained-at"
            )
        if self.trained_at is not None and self.trained_at >= self.ctx[0]:
            raise InputError(
                f"--trained-at {self.trained_at:,} is not shorter than --ctx {self.ctx[0]:,}: nothing lies past it, "
                "leave it out"
            )
