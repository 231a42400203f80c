"""Haystack text streams. A stream depends only on (source, seed): every model cuts the same stream.

Sources:
- `noise`: RULER's repeated filler sentences (offline default).
- `essays:PATH`: a folder of .txt files (read in sorted order, as gkamradt's NIAH does) or a JSON file holding a
  list of texts or `{"text": ...}` (RULER's PaulGrahamEssays.json).
- `hf:DATASET[:SPLIT[:FIELD]]`: a text column of a `datasets` dataset (default split `train`, field `text`).
- `book`: the novel the package ships (Persuasion, `data/texts`) from its first chapter: real prose offline, where
  RULER reads Paul Graham's essays.
- `needles:KEYS:VALUES`: RULER's haystack made of needles ("One of the special magic numbers for KEY is: VALUE."),
  KEYS `words` or `uuids`, VALUES `numbers` or `uuids` (data/words.py); a sample's own needles never repeat a key or a
  value of it.
"""

from __future__ import annotations

import json
import random
import re
from functools import lru_cache
from pathlib import Path

from diffeval.data import read_utf8
from diffeval.errors import InputError

NOISE_SENTENCES = (
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
)

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def split_sentences(text: str) -> list[str]:
    return [s for s in _SENTENCE_END.split(" ".join(text.split())) if s]


def haystack_sentences(source: str, seed: int, min_words: int) -> list[str]:
    """At least `min_words` words of whole sentences from `source`, starting at an offset chosen by `seed`."""
    if source == "noise":
        reps = min_words // 3 + len(NOISE_SENTENCES)
        return [NOISE_SENTENCES[i % len(NOISE_SENTENCES)] for i in range(reps)]
    if source.startswith("needles:"):
        from diffeval.data.words import KEY_TYPES, VALUE_TYPES, needle_sentences

        _, keys, values = (source.split(":") + ["", ""])[:3]
        if keys not in KEY_TYPES or values not in VALUE_TYPES:
            raise InputError(f"bad --haystack {source!r}: use needles:KEYS:VALUES, KEYS words or uuids, VALUES "
                             "numbers or uuids")  # fmt: skip
        return needle_sentences(keys, values, seed, min_words)
    corpus = _corpus_sentences(source)
    start = random.Random(f"haystack:{seed}").randrange(len(corpus))
    out: list[str] = []
    words = 0
    i = start
    while words < min_words:  # wrap around the corpus: long contexts may need more text than it has
        sentence = corpus[i % len(corpus)]
        out.append(sentence)
        words += sentence.count(" ") + 1
        i += 1
    return out


@lru_cache(maxsize=4)
def _corpus_sentences(source: str) -> tuple[str, ...]:
    kind, _, arg = source.partition(":")
    if source == "book":
        from diffeval.data.books import load

        texts = [document.text for document in load("books", None)]
    elif kind == "essays" and arg:
        texts = _read_essays(Path(arg).expanduser())
    elif kind == "hf" and arg:
        texts = _read_hf(arg)
    else:
        raise InputError(
            f"bad --haystack {source!r}: use noise, book, needles:KEYS:VALUES, essays:PATH or "
            "hf:DATASET[:SPLIT[:FIELD]]"
        )
    sentences = tuple(s for text in texts for s in split_sentences(text))
    if len(sentences) < 10:
        raise InputError(f"haystack {source!r} holds fewer than 10 sentences: give a larger text source")
    return sentences


def source_files(source: str) -> list[Path]:
    """The user files a haystack source reads, in the order read: essays:PATH's .txt files or its JSON file; none for
    the other sources (built in, or a hub dataset)."""
    kind, _, arg = source.partition(":")
    if kind != "essays" or not arg:
        return []
    path = Path(arg).expanduser()
    return _essay_files(path) if path.is_dir() else [path]


def _essay_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.txt"))


def _read_essays(path: Path) -> list[str]:
    try:
        if path.is_dir():
            files = _essay_files(path)
            if not files:
                raise InputError(f"haystack folder {path} has no .txt files: point essays: at a folder of .txt files")
            return [read_utf8(f, "haystack file") for f in files]
        data = json.loads(read_utf8(path, "haystack file"))
    except FileNotFoundError:
        raise InputError(f"haystack {path} does not exist: give a folder of .txt files or a JSON file") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read haystack {path} ({type(exc).__name__}): give .txt files or valid JSON") from None
    if isinstance(data, dict) and isinstance(data.get("text"), str):
        return [data["text"]]
    if isinstance(data, list) and all(isinstance(t, str) for t in data):
        return data
    raise InputError(f'haystack {path} must be a JSON list of texts or {{"text": ...}}')


def _read_hf(arg: str) -> list[str]:
    import datasets

    name, _, rest = arg.partition(":")
    split, _, text_field = rest.partition(":")
    try:
        rows = datasets.load_dataset(name, split=split or "train")
    except Exception as exc:  # datasets raises many types for missing/offline datasets
        raise InputError(
            f"cannot load haystack dataset {name!r} ({type(exc).__name__}): check the id or network"
        ) from None
    text_field = text_field or "text"
    if text_field not in rows.column_names:
        raise InputError(f"dataset {name} has no field {text_field!r}; pick one of {rows.column_names}")
    return [str(t) for t in rows[text_field]]
