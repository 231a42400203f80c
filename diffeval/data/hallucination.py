"""Documents, references and prompts for contextual hallucination (paper Table 4; the Lookback Lens protocol).

Summarization: XSum and CNN/DailyMail. QA and multi-document summarization: LongBench's multi_news, qasper, hotpotqa
and 2wikimqa, with LongBench's own prompt templates and output lengths (THUDM/LongBench `config/`, MIT).

Sources: the hub by default (`EdinburghNLP/xsum`, `abisee/cnn_dailymail` 3.0.0, and LongBench's `data.zip`, since
current `datasets` no longer runs its loading script), or `--data-dir DIR` with JSONL files named `<name>.jsonl`, or
as in ../shared/datasets/hallucination:
    xsum_lookbacklens_200.jsonl    document, summary, id
    cnndm_frank_200.jsonl          article, reference, id
    longbench_<name>.jsonl         LongBench schema: input, context, answers, _id
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

from diffeval.data import read_utf8
from diffeval.errors import InputError


@dataclass(frozen=True)
class DatasetSpec:
    kind: str  # summarization | qa
    template: str  # formatted with {context} and {input}
    max_new_tokens: int
    stop: tuple[str, ...]


_LONGBENCH_QA = (
    "Answer the question based on the given passages. Only give me the answer and do not output any other words."
)
_QASPER_RULES = (
    "Answer the question as concisely as you can, using a single phrase or sentence if possible. If the question "
    'cannot be answered based on the information in the article, write "unanswerable". If the question is a yes/no '
    'question, answer "yes", "no", or "unanswerable". Do not provide any explanation.'
)
# LongBench uses one template and output length for its multi-passage QA sets
_PASSAGES_QA = DatasetSpec(
    "qa",
    _LONGBENCH_QA
    + "\n\nThe following are given passages.\n{context}\n\n"
    + _LONGBENCH_QA
    + "\n\nQuestion: {input}\nAnswer:",
    32,
    ("\n",),
)
SPECS = {
    "xsum": DatasetSpec(
        "summarization",
        "Document: {context}\n\nSummarize the document above in one sentence.\n\nSummary:",
        64,
        ("\n\n",),
    ),
    "cnndm": DatasetSpec(
        "summarization",
        "Document: {context}\n\nSummarize the document above in three sentences.\n\nSummary:",
        128,
        ("\n\n",),
    ),
    "multi_news": DatasetSpec(
        "summarization",
        "You are given several news passages. Write a one-page summary of all "
        "news. \n\nNews:\n{context}\n\nNow, write a one-page summary of all the news.\n\nSummary:",
        512,
        (),
    ),
    "qasper": DatasetSpec(
        "qa",
        "You are given a scientific article and a question. " + _QASPER_RULES + "\n\nArticle: "
        "{context}\n\n Answer the question based on the above article as concisely as you can, using "
        "a single phrase or sentence if possible. If the question cannot be answered based on the "
        'information in the article, write "unanswerable". If the question is a yes/no question, '
        'answer "yes", "no", or "unanswerable". Do not provide any explanation.\n\nQuestion: '
        "{input}\n\nAnswer:",
        128,
        ("\n",),
    ),
    "hotpotqa": _PASSAGES_QA,
    "2wikimqa": _PASSAGES_QA,
}
DATASETS = tuple(SPECS)


@dataclass(frozen=True)
class Document:
    id: str
    context: str  # the source the output must stay faithful to
    question: str  # empty for summarization
    reference: str


def load(name: str, data_dir: str | None, count: int, up_to: bool = False) -> list[Document]:
    """The first `count` rows of a dataset's evaluation split; `up_to`: all of them where it holds fewer (a default
    count, not one the user gave)."""
    if name not in SPECS:
        raise InputError(f"unknown hallucination dataset {name!r}: use any of {', '.join(DATASETS)}")
    rows = _load_local(name, Path(data_dir).expanduser(), count) if data_dir else _load_hub(name, count)
    if not rows:
        raise InputError(f"dataset {name} has no rows")
    if len(rows) < count and not up_to:
        raise InputError(f"--samples {count}: {name} holds {len(rows)} documents: give --samples {len(rows)} or fewer")
    seen: set[str] = set()
    for row in rows:
        if row.id in seen:  # two documents would share one sample id: one would be run, and recorded, twice
            raise InputError(f"dataset {name}: document id {row.id!r} repeats: give each row its own id")
        seen.add(row.id)
    return rows


def local_file(name: str, root: Path) -> Path:
    """The JSONL file of a dataset in a local folder: <name>.jsonl, else the name the shared datasets give it."""
    shared_names = {"xsum": "xsum_lookbacklens_200.jsonl", "cnndm": "cnndm_frank_200.jsonl"}
    candidates = [root / f"{name}.jsonl", root / shared_names.get(name, f"longbench_{name}.jsonl")]
    return next((c for c in candidates if c.is_file()), candidates[-1])


def _load_local(name: str, root: Path, count: int) -> list[Document]:
    path = local_file(name, root)
    try:
        text = read_utf8(path)
    except FileNotFoundError:
        raise InputError(
            f"--data-dir {root}: {path.name} is missing; see docs/tasks/hallucination.md for the expected files"
        ) from None
    lines = [line for line in text.splitlines() if line.strip()][:count]
    try:
        return [_document(name, json.loads(line)) for line in lines]
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: rows do not have the expected schema ({type(exc).__name__}: {exc})") from None


def _document(name: str, row: dict) -> Document:
    if name == "xsum":
        return Document(str(row["id"]), _string(row, "document"), "", _string(row, "summary"))
    if name == "cnndm":
        reference = _string(row, "reference") if row.get("reference") else _string(row, "highlights")
        return Document(str(row["id"]), _string(row, "article"), "", reference)
    answers = row["answers"]
    return Document(
        str(row["_id"]),
        _string(row, "context").replace(" NEWLINE_CHAR ", "\n"),
        _string(row, "input") if row.get("input") else "",
        " / ".join(map(str, answers)) if isinstance(answers, list) else str(answers),
    )


def _string(row: dict, key: str) -> str:
    """A text field of a row; a missing one is a KeyError, one of another type a TypeError (both a schema refusal)."""
    value = row[key]
    if not isinstance(value, str):
        raise TypeError(f"{key} is a {type(value).__name__}, not a string")
    return value


def _load_hub(name: str, count: int) -> list[Document]:
    import datasets

    try:
        if name == "xsum":
            rows = datasets.load_dataset("EdinburghNLP/xsum", split=f"test[:{count}]")
            return [_document(name, dict(r)) for r in rows]
        if name == "cnndm":
            rows = datasets.load_dataset("abisee/cnn_dailymail", "3.0.0", split=f"test[:{count}]")
            return [Document(r["id"], r["article"], "", r["highlights"]) for r in rows]
        from huggingface_hub import hf_hub_download

        archive = hf_hub_download("THUDM/LongBench", "data.zip", repo_type="dataset")
        with zipfile.ZipFile(archive) as bundle:
            lines = bundle.read(f"data/{name}.jsonl").decode("utf-8").splitlines()[:count]
        return [_document(name, json.loads(line)) for line in lines if line.strip()]
    except Exception as exc:  # hub errors come in many types (offline, missing, auth)
        raise InputError(
            f"cannot load {name} from the hub ({type(exc).__name__}): use --data-dir DIR offline"
        ) from None
