"""What `diffeval view` shows of a run folder, as JSON-ready dicts.

The same readers, tables and pairing as `report`: `load_records` (partial and damaged folders, with counts), the
task's own tables with the cell filters they declare (`tasks.base.with_cells`), and `sample_pairs` for "DIFF right,
baseline wrong". Three payloads, each fetched by the page only when it needs it:

- `summary`: the run's counts, models and tables (small);
- `sample_index`: one compact row per record, for the page's filters and paged sample list;
- `sample_detail`: one sample's records on every model, their comparison as the task's `listing` declares it, and
  the task's `sample_view` document of generic blocks (tasks/blocks.py) in its JSON form.

Every number the page shows as a metric is formatted here, by report/format.py and blocks.number: the page prints
text, so a table, a listing and a view show a metric alike.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from diffeval.config import INPUT_HASHES, RunConfig, applying, field_default
from diffeval.errors import InputError
from diffeval.models.backend import EngineSettings, open_tokenizer
from diffeval.models.tokenizer import PromptTokenizer
from diffeval.report.format import NumberFormats, column_label, column_texts, index_texts
from diffeval.report.gates import dropped_note
from diffeval.report.tables import LoadedRun, load_records, paired_table, sample_pairs, title
from diffeval.results import RunFolder
from diffeval.tasks import TASKS, build_config
from diffeval.tasks.base import RunContext
from diffeval.tasks.blocks import number

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
        if self.config is None:
            raise InputError(f"run.json cannot be read as a config: {self.config_error}")
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
        tables = task.reporting.tables(frame, loaded.options, paper=False)
        paired = paired_table(loaded.run, frame, task)
        if not paired.empty:
            tables["paired"] = paired
    try:
        config, config_error = config_from_run(loaded.run), None
    except InputError as exc:
        config, config_error = None, str(exc)
    recorded = list(frame["model"].unique()) if len(frame) else []
    configured = [m["name"] for m in loaded.run["config"].get("models", []) if isinstance(m, dict) and "name" in m]
    models = [m for m in configured if m in recorded] + [m for m in recorded if m not in configured]
    params: list[str] = [k for k in (*task.reporting.summary_keys, *(task.reporting.pair_keys or ())) if k != "model"]
    for table in tables.values():
        cells = table.attrs.get("cells", {})
        for cell in [cells.get("common", {}), *cells.get("rows", []), *cells.get("columns", [])]:
            params += [k for k in cell or {} if k != "model"]
    params = [k for k in dict.fromkeys(params) if k in frame.columns]
    return RunView(number, folder, loaded, tables, config, config_error, models, params)


def dropped_notes_of(view: RunView) -> str | None:
    """The line `report` prints for a run's skipped damaged lines and duplicate records; None when none were."""
    loaded = view.loaded
    if not (loaded.damaged or loaded.duplicates):
        return None
    return dropped_note(view.folder, loaded.damaged, loaded.duplicates, loaded.first_damage)


def config_from_run(run: dict) -> RunConfig:
    """The RunConfig that made a run, from its run.json."""
    stored = run["config"]
    values = {k: v for k, v in stored.items() if k not in ("options", INPUT_HASHES)}  # hashes are read, not given
    options = stored.get("options", {})
    # an option stored at its default is left out, as by a run that did not give it: run.json stores every option,
    # those that act on nothing (another probe's) too, and given, those are refused (config.option's `applies`);
    # one an older version stored with a value it ignored counts as left out too
    if isinstance(stored.get("task"), str) and stored["task"] in TASKS and isinstance(options, dict):
        options_class = TASKS[stored["task"]].options
        defaults = {f.name: field_default(f) for f in fields(options_class)}
        options = {k: v for k, v in applying(options_class, options).items() if k not in defaults or v != defaults[k]}
    return build_config(stored["task"], {**values, **options}, {})


def summary(view: RunView) -> dict[str, Any]:
    loaded, task = view.loaded, view.loaded.task
    frame = loaded.frame
    info = loaded.run.get("models", {})
    return {
        "id": view.number,
        "path": str(view.folder.path),
        "name": view.folder.path.resolve().name,
        "task": task.name,
        "note": task.reporting.note,
        "created": loaded.run.get("created"),
        "updated": loaded.run.get("updated"),
        "models": [{"name": m, "differential": bool(info.get(m, {}).get("is_diff", False))} for m in view.models],
        "counts": {
            "records": len(frame),
            "samples": int(frame["sample_id"].nunique()) if len(frame) else 0,
            "damaged": loaded.damaged,
            "duplicates": loaded.duplicates,
        },
        "first_damage": loaded.first_damage,  # where and why the first damaged line is damaged, or None
        "params": view.params,
        "value": task.reporting.summary_value,  # the record column a sample's score is
        "tables": [
            table_json(key, table, task.reporting.titles, NumberFormats.of(task)) for key, table in view.tables.items()
        ],
        "sample_view": task.viewing.sample_view is not None,
    }


def table_json(key: str, table: pd.DataFrame, titles: dict[str, str], formats: NumberFormats) -> dict[str, Any]:
    """A table's row labels and values, as numbers and as the report's texts (one format per column), and each
    cell's record filter (None: the cell lists no samples)."""
    cells = table.attrs.get("cells")
    index_names, labels = index_texts(table)
    columns = [column_label(c) for c in table.columns]
    texts = [column_texts(key, label, table.iloc[:, c], formats) for c, label in enumerate(columns)]
    rows = []
    for i, values in enumerate(table.itertuples(index=False, name=None)):
        row_filter = cells["rows"][i] if cells else None
        filters = [
            None if row_filter is None or column is None else plain({**cells["common"], **row_filter, **column})
            for column in (cells["columns"] if cells else [None] * len(values))
        ]
        rows.append({
            "label": [level[i] for level in labels], "values": [plain(v) for v in values],
            "texts": [column[i] for column in texts], "cells": filters,
        })  # fmt: skip
    return {"key": key, "title": title(key, titles), "index_names": index_names, "columns": columns, "rows": rows}


def sample_index(view: RunView) -> dict[str, Any]:
    """One row per record: [sample, model, parameter values, score as text, outcome, answer, expected], the answer,
    expected and outcome from the task's `listing`. Outcome is True, False or None (a task without right and wrong,
    such as attention shares)."""
    frame = view.loaded.frame
    task = view.loaded.task
    value, listing, decimals = task.reporting.summary_value, task.viewing.listing, _value_decimals(task)
    samples = list(dict.fromkeys(frame["sample_id"])) if len(frame) else []
    position = {s: i for i, s in enumerate(samples)}
    model_position = {m: i for i, m in enumerate(view.models)}
    rows = []
    for record in frame.to_dict("records"):
        rows.append([
            position[record["sample_id"]], model_position[record["model"]],
            [plain(record.get(p)) for p in view.params], number(plain(record.get(value)), decimals),
            outcome(record, listing.outcome), _brief(_column(record, listing.answer)),
            _brief(_column(record, listing.expected)),
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
    task = view.loaded.task
    detail: dict[str, Any] = {
        "sample_id": sample, "task": task.name, "records": records, "comparison": comparison(task, records),
        "view": None,
    }  # fmt: skip
    if task.viewing.sample_view is not None:
        if view.config is None:
            detail["view_error"] = f"run.json cannot be read as a config: {view.config_error}"
        else:
            with view._lock:  # tokenizers and the haystack streams they cache are not shared between threads
                try:
                    context = RunContext.of(view.config)
                    document = task.viewing.sample_view(context, records, view.tokenizer_for, full_text)
                    detail["view"] = plain(document.to_json())
                except InputError as exc:
                    detail["view_error"] = str(exc)
                except Exception as exc:  # data or a tokenizer unreachable where one views: the records still show
                    detail["view_error"] = f"this sample's view could not be rebuilt: {type(exc).__name__}: {exc}"
    return detail


def comparison(task, records: dict[str, dict]) -> dict[str, Any]:
    """The sample on every model, as the task's `listing` declares: what was expected, the model's answer, its
    score (as text) and outcome. Headings name the record columns."""
    listing, value, decimals = task.viewing.listing, task.reporting.summary_value, _value_decimals(task)
    shown = [c for c in (listing.expected, listing.answer) if c is not None]
    rows = [
        {"model": model, "cells": [_full(_column(record, c)) for c in shown] + [number(record.get(value), decimals)],
         "right": outcome(record, listing.outcome)}
        for model, record in records.items()
    ]  # fmt: skip
    return {"headings": ["model", *shown, value, ""], "rows": rows}


def outcome(record: dict, column: str | None) -> bool | None:
    """Right or wrong: the record's outcome column when it holds a yes or no (a hallucination verdict: True is
    hallucination-free). None without one (attention shares, aggregate scores, an unparsed verdict)."""
    found = record.get(column) if column is not None else None
    return bool(found) if isinstance(found, (bool, np.bool_)) else None


def _value_decimals(task) -> int:
    return NumberFormats.of(task).decimals("", task.reporting.summary_value)


def _column(record: dict, column: str | None) -> Any:
    return None if column is None else record.get(column)


def _full(value: Any) -> str | None:
    if value is None or _missing(value):
        return None
    return ", ".join(str(v) for v in value) if isinstance(value, (list, tuple, np.ndarray)) else str(value)


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


def _brief(value: Any) -> str | None:
    text = _full(value)
    return text if text is None or len(text) <= BRIEF_CHARS else text[: BRIEF_CHARS - 1] + "…"
