"""What `diffeval view` shows of a run folder, as JSON-ready dicts.

The same readers, tables and pairing as `report`: `load_records` (partial and damaged folders, with counts), the
task's own tables with the cell filters they declare (`tasks.base.with_cells`), and `sample_pairs` for "DIFF right,
baseline wrong". Three payloads, each fetched by the page only when it needs it:

- `summary`: the run's counts, models and tables (small);
- `sample_index`: one compact row per record, for the page's filters and paged sample list;
- `sample_detail`: one sample's records on every model, and what the task rebuilds for it (a needle prompt's text).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from diffeval.config import RunConfig
from diffeval.errors import InputError
from diffeval.models.backend import EngineSettings, open_tokenizer
from diffeval.models.tokenizer import PromptTokenizer
from diffeval.report.tables import LoadedRun, load_records, paired_table, sample_pairs, title
from diffeval.results import RunFolder
from diffeval.tasks import build_config

BRIEF_CHARS = 160  # an output or reference in the sample list; the sample view shows it whole


@dataclass
class RunView:
    """One run folder as the viewer holds it: read once, with its tables and a rebuilt config for sample views."""

    number: int
    folder: RunFolder
    loaded: LoadedRun
    tables: dict[str, pd.DataFrame]
    config: RunConfig | None
    config_error: str | None
    models: list[str]
    params: list[str]  # record columns the page filters on
    _tokenizers: dict = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def tokenizer_for(self, model: str) -> PromptTokenizer:
        """The model's tokenizer, loaded once. vLLM tokenizes with the same transformers tokenizer, so every run's
        prompts are rebuilt through transformers."""
        if model not in self._tokenizers:
            specs = {m.name: m for m in self.config.models}
            if model not in specs:
                raise InputError(f"model {model} is not in the run's config")
            tokenizer = open_tokenizer(specs[model], EngineSettings.from_config(self.config), "hf")
            self._tokenizers[model] = PromptTokenizer(tokenizer, model)
        return self._tokenizers[model]


def open_run(number: int, path: str | Path) -> RunView:
    folder = RunFolder(path)
    loaded = load_records(folder, allow_empty=True)
    frame, task = loaded.frame, loaded.task
    tables: dict[str, pd.DataFrame] = {}
    if len(frame):
        tables = task.tables(frame, paper=False)
        paired = paired_table(loaded.run, frame, task)
        if not paired.empty:
            tables["paired"] = paired
    try:
        config, config_error = config_from_run(loaded.run), None
    except InputError as exc:
        config, config_error = None, str(exc)
    recorded = list(frame["model"].unique()) if len(frame) else []
    configured = [m.get("name") for m in loaded.run["config"].get("models", []) if isinstance(m, dict)]
    models = [m for m in configured if m in recorded] + [m for m in recorded if m not in configured]
    params = [k for k in (*task.summary_keys, *(task.pair_keys or ())) if k != "model"]
    for table in tables.values():
        cells = table.attrs.get("cells", {})
        for cell in [cells.get("common", {}), *cells.get("rows", []), *cells.get("columns", [])]:
            params += [k for k in cell or {} if k != "model"]
    params = [k for k in dict.fromkeys(params) if k in frame.columns]
    return RunView(number, folder, loaded, tables, config, config_error, models, params)


def config_from_run(run: dict) -> RunConfig:
    """The RunConfig that made a run, from its run.json."""
    stored = run["config"]
    values = {k: v for k, v in stored.items() if k != "options"}
    return build_config(stored["task"], {**values, **stored.get("options", {})}, {})


def summary(view: RunView) -> dict[str, Any]:
    loaded, task = view.loaded, view.loaded.task
    frame = loaded.frame
    info = loaded.run.get("models", {})
    return {
        "id": view.number,
        "path": str(view.folder.path),
        "name": view.folder.path.resolve().name,
        "task": task.name,
        "note": task.note,
        "created": loaded.run.get("created"),
        "updated": loaded.run.get("updated"),
        "models": [{"name": m, "is_diff": bool(info.get(m, {}).get("is_diff", False))} for m in view.models],
        "counts": {
            "records": len(frame),
            "samples": int(frame["sample_id"].nunique()) if len(frame) else 0,
            "damaged": loaded.damaged,
            "duplicates": loaded.duplicates,
        },
        "params": view.params,
        "value": task.summary_value,  # the record column a sample's score is
        "tables": [table_json(key, table, task.titles) for key, table in view.tables.items()],
        "sample_view": task.sample_view is not None,
    }


def table_json(key: str, table: pd.DataFrame, titles: dict[str, str]) -> dict[str, Any]:
    """A table's labels and values, and each cell's record filter (None: the cell lists no samples)."""
    cells = table.attrs.get("cells")
    rows = []
    for i, (label, values) in enumerate(zip(table.index, table.itertuples(index=False, name=None))):
        row_filter = cells["rows"][i] if cells else None
        filters = [
            None if row_filter is None or column is None else plain({**cells["common"], **row_filter, **column})
            for column in (cells["columns"] if cells else [None] * len(values))
        ]
        rows.append(
            {"label": [plain(x) for x in _labels(label)], "values": [plain(v) for v in values], "cells": filters}
        )
    return {
        "key": key,
        "title": title(key, titles),
        "index_names": [str(n) if n is not None else "" for n in table.index.names],
        "columns": [" / ".join(str(x) for x in _labels(c)) for c in table.columns],
        "rows": rows,
    }


def sample_index(view: RunView) -> dict[str, Any]:
    """One row per record: [sample, model, parameter values, score, outcome, output, expected]. Outcome is True, False
    or None (a task without right and wrong, such as attention shares)."""
    frame = view.loaded.frame
    value = view.loaded.task.summary_value
    samples = list(dict.fromkeys(frame["sample_id"])) if len(frame) else []
    position = {s: i for i, s in enumerate(samples)}
    model_position = {m: i for i, m in enumerate(view.models)}
    rows = []
    for record in frame.to_dict("records"):
        rows.append([
            position[record["sample_id"]], model_position[record["model"]],
            [plain(record.get(p)) for p in view.params], plain(record.get(value)), outcome(record),
            _brief(record.get("output", record.get("predicted_label"))),
            _brief(record.get("expected", record.get("gold_label", record.get("reference")))),
        ])  # fmt: skip
    pairs = [
        {"diff": diff, "base": base, "samples": [position[s] for s in joined["sample_id"]]}
        for diff, base, joined in (sample_pairs(view.loaded.run, frame, view.loaded.task) if len(frame) else [])
    ]
    return {"samples": samples, "models": view.models, "params": view.params, "records": rows, "pairs": pairs}


def sample_detail(view: RunView, sample: str, full_text: bool | None = None) -> dict[str, Any]:
    """One sample's records on every model and the task's rebuilt view of it. `full_text` None: whole prompts and
    documents when short, elided when long; True: whole; False: elided."""
    frame = view.loaded.frame
    rows = frame[frame["sample_id"] == sample] if len(frame) else frame
    if not len(rows):
        raise KeyError(sample)
    records = {r["model"]: {k: plain(v) for k, v in r.items() if not _missing(v)} for r in rows.to_dict("records")}
    records = {m: records[m] for m in view.models if m in records}
    detail: dict[str, Any] = {"sample_id": sample, "task": view.loaded.task.name, "records": records, "view": None}
    task = view.loaded.task
    if task.sample_view is not None:
        if view.config is None:
            detail["view_error"] = f"run.json cannot be read as a config: {view.config_error}"
        else:
            with view._lock:  # tokenizers and the haystack streams they cache are not shared between threads
                try:
                    detail["view"] = plain(task.sample_view(view.config, records, view.tokenizer_for, full_text))
                except InputError as exc:
                    detail["view_error"] = str(exc)
                except Exception as exc:  # data or a tokenizer unreachable where one views: the records still show
                    detail["view_error"] = f"this sample's view could not be rebuilt: {type(exc).__name__}: {exc}"
    return detail


def outcome(record: dict) -> bool | None:
    """Right or wrong: the record's `correct`, or a hallucination verdict (hallucination-free is right). None for
    records without either (attention shares, aggregate scores)."""
    for key in ("correct", "verdict"):
        if isinstance(record.get(key), (bool, np.bool_)):
            return bool(record[key])
    return None


def plain(value: Any) -> Any:
    """JSON-ready: numpy scalars as Python numbers, NaN as None, tuples and arrays as lists."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _missing(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _labels(label: Any) -> tuple:
    return label if isinstance(label, tuple) else (label,)


def _brief(value: Any) -> str | None:
    if value is None or _missing(value):
        return None
    text = ", ".join(str(v) for v in value) if isinstance(value, (list, tuple, np.ndarray)) else str(value)
    return text if len(text) <= BRIEF_CHARS else text[: BRIEF_CHARS - 1] + "…"
