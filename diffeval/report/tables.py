"""Records → summary.csv and paper-layout tables (markdown, CSV, LaTeX). Works on finished or partial runs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from diffeval.errors import InputError
from diffeval.report.stats import summarize
from diffeval.results import RunFolder
from diffeval.tasks import TASKS

FORMATS = ("md", "csv", "latex")


def parse_formats(text: str) -> list[str]:
    formats = [f.strip() for f in text.split(",") if f.strip()]
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise InputError(f"bad --format {text!r}: use one or more of {', '.join(FORMATS)}, comma-separated")
    return formats


def build_report(folder: RunFolder, formats: list[str]) -> tuple[dict[str, pd.DataFrame], list[Path], int]:
    """Write summary.csv and the task's tables; return the tables, the files written and the damaged-line count."""
    run = folder.read_run()
    if run is None:
        raise InputError(f"{folder.path} is not a diffeval run folder (no run.json): give the --out of a run")
    task = TASKS[run["config"]["task"]]
    records, damaged = folder.read_records()
    if not records:
        raise InputError(f"{folder.path} has no finished samples yet: run the task first, then report")
    frame = pd.DataFrame.from_records(records)
    written = []
    summary = summarize(frame, task.SUMMARY_KEYS, getattr(task, "SUMMARY_VALUE", "score"))
    summary.to_csv(folder.path / "summary.csv", index=False)
    written.append(folder.path / "summary.csv")
    tables = task.tables(frame)
    if "md" in formats:
        written.append(_write(folder.path / "table.md", _markdown(tables, task.TABLE_NOTE)))
    if "csv" in formats:
        for name, table in tables.items():
            path = folder.path / f"{_slug(name)}.csv"
            table.to_csv(path)
            written.append(path)
    if "latex" in formats:
        written.append(_write(folder.path / "table.tex", _latex(tables, task.TABLE_NOTE)))
    if hasattr(task, "plots"):
        written.extend(task.plots(frame, folder.path))
    return tables, written, damaged


def _markdown(tables: dict[str, pd.DataFrame], note: str) -> str:
    parts = [f"_{note}_\n"]
    for name, table in tables.items():
        parts.append(f"### {_title(name)}\n\n{table.to_markdown(floatfmt='.3f')}\n")
    return "\n".join(parts)


def _latex(tables: dict[str, pd.DataFrame], note: str) -> str:
    parts = [f"% {note}"]
    for name, table in tables.items():
        body = table.to_latex(float_format="%.3f", caption=_title(name), label=f"tab:{_slug(name)}")
        parts.append(body)
    return "\n".join(parts)


def _title(name: str) -> str:
    kind, _, model = name.partition(":")
    titles = {
        "table2": "Table 2 layout: accuracy by model and N/R",
        "depth_grid": "Depth x length grid",
        "table3_raw": "Table 3 layout: attention to answer and noise by depth (raw shares)",
        "table3_normalised": "Table 3 layout: attention to answer and noise by depth (shares / row sum)",
        "segments": "Share of every segment per map (raw and / row sum)",
        "per_layer": "Attention to answer per layer (raw, headline map)",
        "icl_accuracy": "ICL accuracy per dataset and shots (mean over draws and orders)",
        "icl_orders": "ICL accuracy across orders of the same demonstrations",
        "figure7_margins": "Figure 7 layout: best - worst accuracy margin over orders (points)",
        "over_budget": "Runs over the context budget (not scored)",
        "table4": "Table 4 layout: fraction judged hallucination-free",
        "table4_proxy": "Table 4 layout, PROXY (overlap judge): fraction with few unsupported units; not a "
        "hallucination rate",
        "judging": "Judging: samples, unparsed verdicts, truncated prompts, judge",
    }
    return f"{titles.get(kind, kind)}{f' ({model})' if model else ''}"


def _slug(name: str) -> str:
    return name.replace(":", "-").replace("/", "-")


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
