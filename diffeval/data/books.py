"""Long documents for NLL by position: books in a folder (`books.jsonl` + `<id>.txt`, the layout of
`../shared/datasets/books`), the public-domain novel the package ships (`data/texts/`), or a `datasets` dataset's
`text` field.

A book is read from its first chapter (`first_chapter_char`), so a title page or a table of contents is not scored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from diffeval.data import read_utf8
from diffeval.errors import InputError

# Jane Austen's Persuasion (1818), public domain: the whole novel, 466,828 bytes of ASCII, 111,667 tokens in Llama-3's
# tokenizer, 121,623 in Mistral-7B's. From the Debian package r-cran-janeaustenr 1.0.0-1 (CRAN janeaustenr 1.0.0 by
# Julia Silge; the text is Project Gutenberg's eBook #105), read from its data/Rdata.rdb (the object `persuasion`, a
# vector of lines): the lines joined with "\n", trailing spaces stripped, runs of 3+ blank lines collapsed to 2, one
# trailing newline. books.jsonl beside it holds its metadata in the shared books layout.
SHIPPED = Path(__file__).parent / "texts"


@dataclass(frozen=True)
class Document:
    id: str
    title: str
    text: str
    group: str  # the unit of independence: a book (its windows depend on each other), or a dataset row


def load(source: str, data_dir: str | None, count: int | None = None) -> list[Document]:
    """The first `count` documents (all when None) of `source`: "books" (the folder `data_dir`, else the shipped
    text) or "hf:DATASET[:SPLIT]"."""
    if source.startswith("hf:"):
        documents = _dataset(source[3:])
    elif source == "books":
        documents = _books(str(Path(data_dir) if data_dir else SHIPPED))
    else:
        raise InputError(
            f"bad --data {source!r}: use books (with --data-dir FOLDER, or the shipped book) or hf:DATASET[:SPLIT]"
        )
    if count is not None and count > len(documents):
        raise InputError(f"--docs {count}: --data {source} holds {len(documents)} document(s): give at most "
                         f"{len(documents)}, or leave --docs out to score them all")  # fmt: skip
    return list(documents[:count] if count is not None else documents)


def book_files(folder: str) -> list[Path]:
    """The files a books folder gives a run, in the order read: books.jsonl, then each <id>.txt it lists (a line
    that is no book entry names none: reading the folder refuses it)."""
    root = Path(folder).expanduser()
    index = root / "books.jsonl"
    try:
        lines = index.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return [index]
    ids = []
    for line in lines:
        try:
            ids.append(str(json.loads(line)["id"]))
        except (ValueError, KeyError, TypeError):
            continue
    return [index, *(root / f"{book_id}.txt" for book_id in ids)]


@lru_cache(maxsize=4)
def _books(folder: str) -> tuple[Document, ...]:
    root = Path(folder)
    index = root / "books.jsonl"
    if not root.is_dir():
        raise InputError(f"--data-dir {folder}: no such folder (it should hold books.jsonl and <id>.txt files)")
    if not index.is_file():
        raise InputError(f"--data-dir {folder}: no books.jsonl (one JSON line per book: id, title, first_chapter_char)")
    documents: list[Document] = []
    for number, line in enumerate(read_utf8(index).splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            book_id, title = str(entry["id"]), str(entry.get("title", entry["id"]))
            first = entry.get("first_chapter_char", 0)
        except (ValueError, KeyError, TypeError):
            raise InputError(f"{index}, line {number}: not a book entry (a JSON object with an id)") from None
        if not isinstance(first, int) or isinstance(first, bool) or first < 0:
            raise InputError(f"{index}, line {number}: first_chapter_char {first!r} is not a character offset: give "
                             "a whole number from 0")  # fmt: skip
        if any(d.id == book_id for d in documents):  # its windows would be scored, and recorded, twice
            raise InputError(f"{index}, line {number}: names {book_id} a second time: list each book once")
        path = root / f"{book_id}.txt"
        if not path.is_file():
            raise InputError(f"{index}, line {number}: names {book_id}, but {path.name} is not in {folder}")
        text = read_utf8(path)
        if not text.strip():
            raise InputError(f"{index}, line {number}: {path.name} is empty: give the book's text, or leave it out")
        if first >= len(text):
            raise InputError(f"{index}, line {number}: first_chapter_char {first:,} is past the end of {path.name} "
                             f"({len(text):,} characters): give an offset inside the text")  # fmt: skip
        documents.append(Document(book_id, title, text[first:], book_id))
    if not documents:
        raise InputError(f"{index} lists no books")
    return tuple(documents)


@lru_cache(maxsize=4)
def _dataset(arg: str) -> tuple[Document, ...]:
    import datasets

    datasets.disable_progress_bars()  # the run's own progress bar is the one to show; an error stays one line
    name, _, split = arg.partition(":")
    try:
        rows = datasets.load_dataset(name, split=split or "train")
    except Exception as exc:  # datasets raises many types for a missing or unreachable dataset
        raise InputError(f"cannot load dataset {name!r} ({type(exc).__name__}): check the id, or the network") from None
    if "text" not in rows.column_names:
        raise InputError(f"dataset {name} has no text field: its fields are {', '.join(rows.column_names)}")
    return tuple(
        Document(f"{name}:{split or 'train'}:{i}", f"{name} row {i}", str(text), f"{name}:{i}")
        for i, text in enumerate(rows["text"])
    )
