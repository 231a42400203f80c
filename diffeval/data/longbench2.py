"""LongBench v2's multiple-choice questions over long documents (Bai et al. 2024; THUDM/LongBench, MIT).

Sources: the hub (`THUDM/LongBench-v2`, split `train`, as LongBench's pred.py loads it), or `--data-dir` naming a
file, or a folder holding `longbench2.json`, `longbench2.jsonl`, `longbench2.parquet` or the official `data.json`.
A `.json` file is the official data.json (a JSON list of rows), `.jsonl` one row a line, `.parquet` a table; every
row in LongBench v2's schema: _id, domain, sub_domain, difficulty, length, question, choice_A … choice_D, answer
(a letter A–D), context.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from diffeval.data import read_utf8
from diffeval.errors import InputError

HUB_ID = "THUDM/LongBench-v2"
LETTERS = ("A", "B", "C", "D")
FIELDS = (
    "_id",
    "domain",
    "sub_domain",
    "difficulty",
    "length",
    "question",
    *(f"choice_{x}" for x in LETTERS),
    "answer",
    "context",
)
DIFFICULTIES = ("easy", "hard")
LENGTH_LABELS = ("short", "medium", "long")  # the dataset's own buckets: <32K, 32K–128K, >128K words
FILE_NAMES = ("longbench2.json", "longbench2.jsonl", "longbench2.parquet", "data.json")  # in a --data-dir folder


@dataclass(frozen=True)
class Question:
    id: str
    domain: str
    sub_domain: str
    difficulty: str
    length: str  # the dataset's length label: short, medium or long
    question: str
    choices: tuple[str, str, str, str]
    answer: str  # the gold letter
    context: str


def local_file(data_dir: str) -> Path:
    """The file `--data-dir` names: itself, or the first of FILE_NAMES in the folder."""
    path = Path(data_dir).expanduser()
    if path.is_dir():
        found = [path / name for name in FILE_NAMES if (path / name).is_file()]
        if not found:
            raise InputError(
                f"--data-dir {data_dir}: holds none of {', '.join(FILE_NAMES)}: give LongBench v2's "
                "data.json, or a folder holding it"
            )
        return found[0]
    if not path.is_file():
        raise InputError(
            f"--data-dir {data_dir}: no such file or folder: give LongBench v2's data.json, a JSONL or "
            "parquet file in its schema, or a folder holding one"
        )
    return path


@lru_cache(maxsize=4)
def load(data_dir: str | None) -> tuple[Question, ...]:
    """Every question of the source, in its order, checked."""
    if data_dir is None:
        source, rows = HUB_ID, _hub_rows()
    else:
        path = local_file(data_dir)
        source, rows = str(path), _file_rows(path)
    if not rows:
        raise InputError(f"{source} holds no questions")
    questions = [_question(source, i, row) for i, row in enumerate(rows)]
    ids = [q.id for q in questions]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:  # two questions would share a sample id: one would be run, and recorded, twice
        raise InputError(f"{source}: _id {repeated[0]!r} repeats: give each question its own _id")
    return tuple(questions)


def _hub_rows() -> list[dict]:
    from datasets import load_dataset

    try:
        return list(load_dataset(HUB_ID, split="train"))
    except Exception as exc:  # offline, or the hub refuses: say how to run from a local file
        raise InputError(
            f"cannot load {HUB_ID} from the hub ({type(exc).__name__}): download its data.json and give --data-dir"
        ) from None


def _file_rows(path: Path) -> list:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pandas as pd

        try:
            return pd.read_parquet(path).to_dict("records")
        except Exception as exc:  # pyarrow's errors have no common base worth naming
            raise InputError(
                f"{path} is not a readable parquet file ({type(exc).__name__}): give LongBench v2's "
                "data as JSON, JSONL or parquet"
            ) from None
    text = read_utf8(path, "LongBench v2 file")
    try:
        if suffix == ".jsonl":
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        rows = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{path} is not valid JSON{' lines' if suffix == '.jsonl' else ''} (line {exc.lineno}: "
            f"{exc.msg}): give LongBench v2's data.json or a JSONL file in its schema"
        ) from None
    if not isinstance(rows, list):
        raise InputError(
            f"{path} holds a JSON {type(rows).__name__}, not a list of questions as LongBench v2's data.json does"
        )
    return rows


def _question(source: str, index: int, row) -> Question:
    if not isinstance(row, dict):
        raise InputError(f"{source}: row {index + 1} is not an object: rows must be in LongBench v2's schema")
    missing = [f for f in FIELDS if f not in row]
    if missing:
        raise InputError(
            f"{source}: row {index + 1} lacks {', '.join(missing)}: it is not in LongBench v2's schema "
            f"({', '.join(FIELDS)})"
        )
    bad = [f for f in FIELDS if f != "_id" and not isinstance(row[f], str)]
    if bad or row["answer"] not in LETTERS:
        what = f"{bad[0]} is not text" if bad else f"answer {row['answer']!r} is not one of A, B, C, D"
        raise InputError(f"{source}: row {index + 1} ({row['_id']}): {what}: rows must be in LongBench v2's schema")
    choices = (row["choice_A"], row["choice_B"], row["choice_C"], row["choice_D"])
    return Question(
        str(row["_id"]),
        row["domain"],
        row["sub_domain"],
        row["difficulty"],
        row["length"],
        row["question"],
        choices,
        row["answer"],
        row["context"],
    )


def selected(data_dir: str | None, domains: list[str], difficulties: list[str], lengths: list[str]) -> list[Question]:
    """The questions in the given domains, difficulties and length labels (an empty list: any), in the source's
    order; a domain the data does not hold is refused with the ones it does."""
    questions = load(data_dir)
    held = sorted({q.domain for q in questions})
    unknown = [d for d in domains if d not in held]
    if unknown:
        raise InputError(f"--domain {unknown[0]!r}: the data holds no such domain: use any of {', '.join(held)}")
    return [
        q
        for q in questions
        if (not domains or q.domain in domains)
        and (not difficulties or q.difficulty in difficulties)
        and (not lengths or q.length in lengths)
    ]
