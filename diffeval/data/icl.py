"""Classification datasets of the many-shot ICL protocol (Bertsch et al. 2024): TREC, TREC-fine, Banking77, CLINC150.

Each loads from the Hugging Face hub by default, or from local files (`--data-dir`) in this layout, which is the one
of ../shared/datasets:
    trec/train.jsonl, trec/test.jsonl          text, coarse_label_id, fine_label_id (ids in HF `trec` order)
    banking77/train.csv, banking77/test.csv    text,category
    clinc150/data_oos_plus.json                {"train": [[text, intent], ...], "oos_train": ..., "test", "oos_test"}
Labels are verbalized as words (TREC "NUM:dist" → "numeric distance", Banking77/CLINC150 "card_arrival" →
"card arrival"), the verbalizers of the protocol's code.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path

from diffeval.data import read_utf8
from diffeval.errors import InputError

DATASETS = ("trec", "trec-fine", "banking77", "clinic150")

TREC_COARSE = {
    "ABBR": "abbreviation",
    "ENTY": "entity",
    "DESC": "description",
    "HUM": "human",
    "LOC": "location",
    "NUM": "numeric",
}
TREC_COARSE_ORDER = ("ABBR", "ENTY", "DESC", "HUM", "LOC", "NUM")  # HF `trec` coarse_label ids
TREC_FINE_ORDER = (  # HF `trec` fine_label ids
    "ABBR:abb",
    "ABBR:exp",
    "ENTY:animal",
    "ENTY:body",
    "ENTY:color",
    "ENTY:cremat",
    "ENTY:currency",
    "ENTY:dismed",
    "ENTY:event",
    "ENTY:food",
    "ENTY:instru",
    "ENTY:lang",
    "ENTY:letter",
    "ENTY:other",
    "ENTY:plant",
    "ENTY:product",
    "ENTY:religion",
    "ENTY:sport",
    "ENTY:substance",
    "ENTY:symbol",
    "ENTY:techmeth",
    "ENTY:termeq",
    "ENTY:veh",
    "ENTY:word",
    "DESC:def",
    "DESC:desc",
    "DESC:manner",
    "DESC:reason",
    "HUM:gr",
    "HUM:ind",
    "HUM:title",
    "HUM:desc",
    "LOC:city",
    "LOC:country",
    "LOC:mount",
    "LOC:other",
    "LOC:state",
    "NUM:code",
    "NUM:count",
    "NUM:date",
    "NUM:dist",
    "NUM:money",
    "NUM:ord",
    "NUM:other",
    "NUM:period",
    "NUM:perc",
    "NUM:speed",
    "NUM:temp",
    "NUM:volsize",
    "NUM:weight",
)
TREC_FINE_WORDS = {
    "abb": "abbreviation",
    "exp": "expansion",
    "cremat": "creation",
    "dismed": "disease",
    "instru": "instrument",
    "lang": "language",
    "techmeth": "technique",
    "termeq": "term",
    "veh": "vehicle",
    "def": "definition",
    "desc": "description",
    "gr": "group",
    "ind": "individual",
    "mount": "mountain",
    "dist": "distance",
    "ord": "order",
    "perc": "percent",
    "temp": "temperature",
    "volsize": "size",
}

# the prompt format of each dataset: input prefix, output prefix
FORMATS = {
    "trec": ("Question", "Type"),
    "trec-fine": ("Question", "Type"),
    "banking77": ("Query", "Intent"),
    "clinic150": ("Utterance", "Intent"),
}


@dataclass(frozen=True)
class Example:
    text: str
    label: int


@dataclass
class ICLDataset:
    name: str
    labels: list[str]  # verbalized label of each label id
    train: list[Example]
    test: list[Example]


def verbalize_trec_fine(name: str) -> str:
    coarse, fine = name.split(":")
    return f"{TREC_COARSE[coarse]} {TREC_FINE_WORDS.get(fine, fine)}"


def load(name: str, data_dir: str | None = None) -> ICLDataset:
    if name not in DATASETS:
        raise InputError(f"unknown ICL dataset {name!r}: use one of {', '.join(DATASETS)}")
    if data_dir:
        return _load_local(name, Path(data_dir).expanduser())
    return _load_hub(name)


# the files `_load_local` reads of each dataset, under the data folder
LOCAL_FILES = {
    "trec": ("trec/train.jsonl", "trec/test.jsonl"),
    "trec-fine": ("trec/train.jsonl", "trec/test.jsonl"),
    "banking77": ("banking77/train.csv", "banking77/test.csv"),
    "clinic150": ("clinc150/data_oos_plus.json",),
}
# `--test-indices FOLDER`: each dataset's index file in it (long-context-icl's `dataset-splits/` names)
INDEX_FILES = {"trec": "trec", "trec-fine": "trec", "banking77": "banking", "clinic150": "clinic"}


def local_files(names: list[str], data_dir: str) -> list[Path]:
    """The files a run of these datasets reads from a local data folder, in the order read."""
    root = Path(data_dir).expanduser()
    return list(dict.fromkeys(root / file for name in names for file in LOCAL_FILES.get(name, ())))


def indices_file(path: str, name: str) -> Path:
    """The test indices a dataset reads from `--test-indices`: the file itself, or the dataset's file in a folder."""
    given = Path(path).expanduser()
    return given / f"{INDEX_FILES[name]}-indices.txt" if given.is_dir() else given


def _load_local(name: str, root: Path) -> ICLDataset:
    try:
        if name in ("trec", "trec-fine"):
            key = "coarse_label_id" if name == "trec" else "fine_label_id"
            trec = root / "trec"
            splits = {
                split: [json.loads(line) for line in read_utf8(trec / f"{split}.jsonl").splitlines() if line.strip()]
                for split in ("train", "test")
            }
            labels = _trec_labels(name)
            return _checked(ICLDataset(name, labels, *[[_trec_example(r, key, labels) for r in splits[s]]
                                                       for s in ("train", "test")]), root)  # fmt: skip
        if name == "banking77":
            rows = {
                s: list(csv.DictReader(io.StringIO(read_utf8(root / "banking77" / f"{s}.csv"))))
                for s in ("train", "test")
            }
            intents = sorted({r["category"] for r in rows["train"]})
            return _checked(
                _from_named(name, intents, {s: [(r["text"], r["category"]) for r in rows[s]] for s in rows}), root
            )
        data = json.loads(read_utf8(root / "clinc150" / "data_oos_plus.json"))
        pairs = {s: data[s] + data[f"oos_{s}"] for s in ("train", "test")}  # the HF `plus` splits
        intents = sorted({intent for _, intent in pairs["train"]})
        return _checked(_from_named(name, intents, pairs), root)
    except FileNotFoundError as exc:
        raise InputError(
            f"--data-dir {root}: missing {exc.filename}; see docs/tasks/icl.md for the expected layout"
        ) from None
    except (KeyError, TypeError, ValueError) as exc:  # a row of the wrong shape; json's errors are ValueErrors
        raise InputError(f"--data-dir {root}: {name} files do not have the expected schema ({exc})") from None


def _trec_example(row: dict, key: str, labels: list[str]) -> Example:
    label = row[key]
    if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < len(labels):
        raise ValueError(f"{key} {label!r} is not a label id from 0 to {len(labels) - 1}")
    return Example(row["text"], label)


def _checked(data: ICLDataset, root: Path) -> ICLDataset:
    """Every text a string, both splits non-empty: a local file's rows are what a prompt is built from."""
    for split, rows in (("train", data.train), ("test", data.test)):
        if not rows:
            raise InputError(f"--data-dir {root}: {data.name} has no {split} rows: give a {split} file with rows")
        if not all(isinstance(row.text, str) and row.text for row in rows):
            raise InputError(f"--data-dir {root}: a {data.name} {split} row's text is not a non-empty string")
    return data


def _trec_labels(name: str) -> list[str]:
    if name == "trec":
        return [TREC_COARSE[c] for c in TREC_COARSE_ORDER]
    return [verbalize_trec_fine(f) for f in TREC_FINE_ORDER]


def _from_named(name: str, intents: list[str], pairs: dict[str, list]) -> ICLDataset:
    index = {intent: i for i, intent in enumerate(intents)}
    splits = {}
    for split, rows in pairs.items():
        unknown = {intent for _, intent in rows} - set(index)
        if unknown:
            raise InputError(f"{name} {split} has labels missing from train: {sorted(unknown)[:3]}")
        splits[split] = [Example(text, index[intent]) for text, intent in rows]
    return ICLDataset(name, [i.replace("_", " ") for i in intents], splits["train"], splits["test"])


def _load_hub(name: str) -> ICLDataset:
    import datasets

    hub = {
        "trec": ("CogComp/trec", None),
        "trec-fine": ("CogComp/trec", None),
        "banking77": ("PolyAI/banking77", None),
        "clinic150": ("clinc/clinc_oos", "plus"),
    }
    repo, config = hub[name]
    try:
        data = datasets.load_dataset(repo, config)
    except Exception as exc:  # datasets raises many types for missing/offline datasets
        raise InputError(
            f"cannot load {repo} from the hub ({type(exc).__name__}): use --data-dir DIR offline"
        ) from None
    if name.startswith("trec"):
        key = "coarse_label" if name == "trec" else "fine_label"
        splits = {s: [Example(r["text"], int(r[key])) for r in data[s]] for s in ("train", "test")}
        return ICLDataset(name, _trec_labels(name), splits["train"], splits["test"])
    field = "label" if name == "banking77" else "intent"
    names = data["train"].features[field].names
    splits = {s: [Example(r["text"], int(r[field])) for r in data[s]] for s in ("train", "test")}
    return ICLDataset(name, [n.replace("_", " ") for n in names], splits["train"], splits["test"])


def load_indices(path: str) -> list[int]:
    try:
        values = json.loads(Path(path).expanduser().read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8
        raise InputError(f"--test-indices {path}: cannot read a JSON list of ints ({type(exc).__name__})") from None
    if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise InputError(f"--test-indices {path}: expected a JSON list of ints, e.g. [360, 17, 361]")
    seen: set[int] = set()
    for value in values:
        if value in seen:  # the same query would be run, and recorded, twice
            raise InputError(f"--test-indices {path}: row {value} is listed twice: list each test row once")
        seen.add(value)
    return values
