"""Run folders → summary.csv, paper-layout tables (markdown, CSV, LaTeX, HTML), plots and paired statistics.

Works on finished or partial runs, on any task, on several folders at once. Everything is computed from the records
in samples.jsonl, so a report can be made again at any time.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import pandas as pd

from diffeval.errors import InputError
from diffeval.intervals import BOOTSTRAP_RESAMPLES, summarize
from diffeval.models.variants import registry as variants
from diffeval.report.format import NumberFormats, html_table, latex_table, markdown_table
from diffeval.report.stats import cluster_labels, paired_difference
from diffeval.results import RUN_FILE, RunFolder
from diffeval.tasks import TASKS
from diffeval.tasks.base import Task, with_cells

FORMATS = ("md", "csv", "latex", "html")

PAIRED_TITLE = (
    "Paired DIFF - baseline differences on the same samples (bootstrap 95 % CI; McNemar exact for yes/no outcomes, "
    "Wilcoxon signed-rank otherwise; a paired cluster bootstrap where the test column says so, as the note explains)"
)


def parse_formats(text: str) -> list[str]:
    formats = [f.strip() for f in text.split(",") if f.strip()]
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise InputError(f"bad --format {text!r}: use one or more of {', '.join(FORMATS)}, comma-separated")
    return formats


@dataclass
class RunReport:
    """One run folder's tables and plots."""

    folder: RunFolder
    task: str
    tables: dict[str, pd.DataFrame]
    note: str
    damaged: int
    duplicates: int
    frame: pd.DataFrame  # the records the tables came from (gates reuse them)
    first_damage: str | None
    titles: dict[str, str] = field(default_factory=dict)  # table key → title (the task's, with its scoring rule)
    formats: NumberFormats = field(default_factory=NumberFormats)  # the task's decimals, for every table output
    plots: list[Path] = field(default_factory=list)
    written: list[Path] = field(default_factory=list)
    paper: str = ""  # with --paper: which of the paper's settings the run has and which it lacks


@dataclass
class LoadedRun:
    run: dict  # run.json
    task: Task
    frame: pd.DataFrame  # one row per (model, sample_id)
    damaged: int
    duplicates: int
    options: Any  # the task's options as run.json stored them (`Task.stored_options`), handed to its tables
    scoring: str | None = None  # the scoring rule the frame's scores follow, for a task that has several
    first_damage: str | None = None  # where and why the first damaged line is damaged


def scoring_rule(task: Task, scoring: str | None) -> str | None:
    """The rule a task's records are scored by: `scoring`, or the task's first (run-time) rule; None for a task with
    one way to score. One line for a rule the task does not know."""
    rules = task.scoring.rules
    if not rules:
        return None
    rule = scoring or next(iter(rules))
    if rule not in rules:
        raise InputError(f"--scoring {rule!r}: task {task.name} scores by {', '.join(rules)}")
    return rule


def load_records(folder: RunFolder, allow_empty: bool = False, scoring: str | None = None) -> LoadedRun:
    """A run folder's run.json and records, scored by the task's rule `scoring` (default: its run-time rule) from the
    stored outputs; one clear error for a folder that is not a run (or, unless `allow_empty`, has no finished sample
    yet)."""
    run = folder.read_run()
    if run is None:
        raise InputError(f"{folder.path} is not a diffeval run folder (no run.json): give the --out of a run")
    name = run["config"]["task"]
    if name not in TASKS:
        raise InputError(f"{folder.path} holds a run of unknown task {name!r}: known tasks are {', '.join(TASKS)}")
    task = TASKS[name]
    options = task.stored_options(run["config"].get("options") or {}, str(folder.path / RUN_FILE))
    # rows the task's readers cannot read count as damaged: a field missing or mistyped, a list whose length is not
    # the run's (its options') or its record's
    lengths = {f.name: v for f in fields(options) if type(v := getattr(options, f.name)) is int}
    records = folder.read_records(schema=task.scoring.record_schema, lengths=lengths, run=run)
    if not records.rows and not allow_empty:
        damaged = f" ({records.damaged} damaged line(s); first: {records.first_damage})" if records.damaged else ""
        raise InputError(f"{folder.path} has no finished samples yet{damaged}: run the task first, then report")
    frame = pd.DataFrame.from_records(records.rows)
    rule = scoring_rule(task, scoring)
    if rule is not None and task.scoring.rescore is not None and not frame.empty:
        frame = task.scoring.rescore(frame, rule)
    return LoadedRun(run, task, frame, records.damaged, records.duplicates, options, rule, records.first_damage)


def check_scoring(folders: list[RunFolder], scoring: str | None) -> None:
    """`--scoring RULE` must name a rule of at least one of the folders' tasks, and of every one that has rules."""
    if scoring is None:
        return
    names = {run["config"]["task"] for f in folders if (run := f.read_run())}
    ruled = [TASKS[name] for name in names if name in TASKS and TASKS[name].scoring.rules]
    if not ruled:
        raise InputError(f"--scoring {scoring!r}: none of these runs' tasks has scoring rules (needle has)")
    for task in ruled:
        scoring_rule(task, scoring)


def report_run(
    folder: RunFolder, formats: list[str], target: Path, paper: bool = False, scoring: str | None = None
) -> RunReport:
    """Write one run's summary.csv, tables and plots into `target` (the run folder itself by default)."""
    loaded = load_records(folder, scoring=scoring)
    task, frame = loaded.task, loaded.frame
    reporting = task.reporting
    note, titles = reporting.note, dict(reporting.titles)
    said = ""
    if paper:  # what --paper could set beside this run, so that a run with no paper setting says so
        coverage = reporting.paper_coverage
        said = coverage(frame, loaded.options) if coverage else f"The paper reports no numbers for {task.name}."
        note = f"{note}. {said.removesuffix('.')}"
    if loaded.scoring is not None and task.scoring.rules:  # every table names the rule that scored it
        note += f". Scoring rule {loaded.scoring!r}: {task.scoring.rules[loaded.scoring]}"
        titles = {key: f"{value} [scoring: {loaded.scoring}]" for key, value in titles.items()}
    target.mkdir(parents=True, exist_ok=True)
    summary = summarize(frame, reporting.summary_keys, reporting.summary_value)
    summary.to_csv(target / "summary.csv", index=False)
    tables = reporting.tables(frame, loaded.options, paper=paper)
    tables["paired"] = paired_table(loaded.run, frame, task)
    if reporting.pair_tables is not None:
        tables.update(reporting.pair_tables(frame, model_pairs(loaded.run, frame), loaded.options))
    tables = {key: table for key, table in tables.items() if not table.empty}  # a table without rows says nothing
    numbers = NumberFormats.of(task)
    report = RunReport(
        folder, task.name, tables, note, loaded.damaged, loaded.duplicates, frame, loaded.first_damage, titles,
        numbers, [], [target / "summary.csv"], said,
    )  # fmt: skip
    if "md" in formats:
        report.written.append(_write(target / "table.md", markdown(tables, note, titles, numbers)))
    if "csv" in formats:
        for key, table in tables.items():
            path = target / f"{_slug(key)}.csv"
            table.to_csv(path)
            report.written.append(path)
    if "latex" in formats:
        report.written.append(_write(target / "table.tex", latex_document(tables, note, titles, numbers)))
    # a run in which nothing could be scored (every verdict unparsed, every prompt over budget) has counts and
    # tables, but nothing to draw
    scored = reporting.summary_value in frame and frame[reporting.summary_value].notna().any()
    report.plots = reporting.plots(frame, target) if reporting.plots is not None and scored else []
    report.written.extend(report.plots)
    return report


def build_report(
    folders: list[RunFolder],
    formats: list[str],
    out: Path | None = None,
    paper: bool = False,
    scoring: str | None = None,
) -> list[RunReport]:
    """Reports for several run folders; with `out`, each goes to out/<folder name> and HTML to out/report.html.
    `scoring` rescores the tasks that have scoring rules (needle) from their stored outputs."""
    names = [f.path.resolve().name for f in folders]
    if out is not None and len(set(names)) != len(names):
        raise InputError(f"run folders share a name ({names}): report them into separate --out folders")
    check_scoring(folders, scoring)
    reports = [report_run(f, formats, out / n if out else f.path, paper, scoring) for f, n in zip(folders, names)]
    if "html" in formats:
        page = (out or folders[0].path) / "report.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        _write(page, html_page(reports))
        reports[0].written.append(page)
    return reports


def sample_pairs(run: dict, frame: pd.DataFrame, task: Task) -> list[tuple[str, str, pd.DataFrame]]:
    """Each of `model_pairs`, joined on the samples both scored: the pairing of the paired statistics and of
    `diffeval view`'s "DIFF right, baseline wrong" filters. None for a task without sample-level pairs."""
    value = task.reporting.summary_value
    if task.reporting.pair_keys is None:
        return []
    pairs = []
    for diff, base in model_pairs(run, frame):
        left = frame[frame["model"] == diff].dropna(subset=[value])
        right = frame[frame["model"] == base].dropna(subset=[value])
        joined = left.merge(right[["sample_id", value]], on="sample_id", suffixes=("", "_base"))
        if not joined.empty:
            pairs.append((diff, base, joined))
    return pairs


def model_pairs(run: dict, frame: pd.DataFrame) -> list[tuple[str, str]]:
    """The models compared, in order: every DIFF model with every baseline, then every DIFF V2 model with every V1
    model (V1 in the baseline's place), among the models that have records."""
    models = run.get("models", {})
    present = [m for m in frame["model"].unique() if m in models]
    diffs = [m for m in present if models[m].get("is_diff")]
    bases = [m for m in present if not models[m].get("is_diff")]
    variant = {m: variants.by_name(models[m].get("diff_variant")) or variants.UNRECORDED for m in diffs}
    later = [(a, b) for a in diffs for b in diffs if variant[b].name in variant[a].paired_with]
    return [(diff, base) for diff in diffs for base in bases] + later


def paired_table(run: dict, frame: pd.DataFrame, task: Task) -> pd.DataFrame:
    """Every pair of `sample_pairs` (DIFF vs baseline, V2 vs V1) on the samples both scored, per the task's pairing
    cells and overall."""
    value = task.reporting.summary_value
    keys = list(task.reporting.pair_keys or ())
    rows, cells, pooled = [], [], False
    for diff, base, joined in sample_pairs(run, frame, task):
        labels = cluster_labels(joined, task.reporting.cluster_keys)
        pooled |= labels is None
        groups = [(("all",) * len(keys), joined)] + list(joined.groupby(keys, sort=False))
        for cell, group in groups:
            cell = cell if isinstance(cell, tuple) else (cell,)
            clusters = None if labels is None else labels[group.index]
            stats = paired_difference(group[value], group[f"{value}_base"], clusters=clusters)
            if stats["ci_low"] != stats["ci_low"]:  # NaN: too few samples or clusters to resample
                units = f"{stats['clusters']} cluster" if "clusters" in stats else f"n = {stats['n']}"
                stats["reading"] = f"{units}: too few to resample, no interval or test"
            if task.reporting.floor is not None:
                floor = floor_reading(group[value], group[f"{value}_base"], task.reporting.floor)
                stats.update(floor if floor["reading"] or "reading" not in stats else {})
            rows.append({"diff": diff, "baseline": base, **dict(zip(keys, cell)), "metric": value, **stats})
            within = {k: v for k, v in zip(keys, cell) if not isinstance(v, str) or v != "all"}
            cells.append({"pair": [diff, base], **within})  # the samples both scored, as `sample_pairs` joins them
    if not rows:
        return pd.DataFrame()
    if any("reading" in row for row in rows):  # a row that reads no difference says why; the others say nothing
        rows = [{**row, "reading": row.get("reading", "")} for row in rows]
    table = pd.DataFrame(rows).set_index(["diff", "baseline", *keys])  # unrounded: report/format.py shows it
    table = with_cells(table, cells, [{}] * table.shape[1])
    table.attrs["note"] = paired_note(task, table, pooled)
    return table


def floor_reading(first: pd.Series, second: pd.Series, floor: float) -> dict:
    """A paired cell where both models' mean is at most `floor` reads no difference: its figures are left empty."""
    if max(first.mean(), second.mean()) > floor:
        return {"reading": ""}
    empty = {key: float("nan") for key in ("difference", "ci_low", "ci_high", "p_value")}
    return {**empty, "reading": f"both at the floor (mean ≤ {floor}): no difference read"}


def paired_note(task: Task, table: pd.DataFrame, pooled: bool) -> str:
    """What the paired table's rows of a clustered task resampled, or why they could not; "" for other tasks."""
    if not task.reporting.cluster_keys:
        return ""
    keys = " and ".join(task.reporting.cluster_keys)
    notes = []
    if "clusters" in table:
        notes.append(
            f"Paired cluster bootstrap over the clusters of records that share {keys} "
            f"({int(table['clusters'].max())} in the overall row; {BOOTSTRAP_RESAMPLES} resamples): the records of a "
            "cluster, e.g. an ICL test query in every order and draw, are resampled together for the 95 % CI and the "
            "two-sided p-value; n counts paired records, clusters the independent units."
        )
    if pooled:
        notes.append(
            f"Records without {keys} (a run older than its task's clusters): every paired sample is counted as "
            "independent, which overstates significance where samples repeat the same test item."
        )
    return " ".join(notes)


def markdown(tables: dict[str, pd.DataFrame], note: str, titles: dict[str, str], formats: NumberFormats) -> str:
    parts = [f"_{note}_\n"]
    for key, table in tables.items():
        parts.append(f"### {title(key, titles)}\n\n{markdown_table(key, table, formats)}\n")
        if table.attrs.get("note"):
            parts.append(f"_{table.attrs['note']}_\n")
    return "\n".join(parts)


def latex_tables(tables: dict[str, pd.DataFrame], titles: dict[str, str], formats: NumberFormats) -> str:
    """booktabs tables (pandas writes \\toprule/\\midrule/\\bottomrule), special characters escaped."""
    return "\n".join(
        latex_table(
            key,
            table,
            formats,
            caption=_latex_escape(". ".join(filter(None, (title(key, titles), table.attrs.get("note"))))),
            label=f"tab:{_slug(key)}",
        )
        for key, table in tables.items()
    )


def latex_document(tables: dict[str, pd.DataFrame], note: str, titles: dict[str, str], formats: NumberFormats) -> str:
    return (
        "\\documentclass{article}\n\\usepackage{booktabs}\n\\usepackage[margin=1cm,landscape]{geometry}\n"
        "\\begin{document}\n\\small\n"
        f"\\noindent {_latex_escape(note)}\n\n{latex_tables(tables, titles, formats)}\n\\end{{document}}\n"
    )


def html_page(reports: list[RunReport]) -> str:
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>diffeval report</title><style>"
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}img{max-width:100%}</style></head><body>"
        "<h1>diffeval report</h1>"
    ]
    for report in reports:
        parts.append(f"<h2>{html.escape(report.task)}: {html.escape(str(report.folder.path))}</h2>")
        parts.append(f"<p><em>{html.escape(report.note)}</em></p>")
        if report.damaged or report.duplicates:
            parts.append(
                f"<p>{report.damaged} damaged line(s) and {report.duplicates} duplicate record(s) in samples.jsonl "
                f"were skipped{html.escape(f' (first damaged: {report.first_damage})' if report.first_damage else '')}."
                "</p>"
            )
        for key, table in report.tables.items():
            heading = html.escape(title(key, report.titles))
            parts.append(f"<h3>{heading}</h3>{html_table(key, table, report.formats)}")
            if table.attrs.get("note"):
                parts.append(f"<p><em>{html.escape(table.attrs['note'])}</em></p>")
        for plot in report.plots:
            data = base64.b64encode(plot.read_bytes()).decode()
            parts.append(f"<p><img alt='{html.escape(plot.name)}' src='data:image/png;base64,{data}'></p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def title(key: str, titles: dict[str, str]) -> str:
    """A table's title: the task's title for its key (the paired table's is the report's own), then the model."""
    kind, _, model = key.partition(":")
    return f"{({'paired': PAIRED_TITLE, **titles}).get(kind, kind)}{f' ({model})' if model else ''}"


def _latex_escape(text: str) -> str:
    for char, escaped in (("\\", "\\textbackslash{}"), ("%", "\\%"), ("_", "\\_"), ("&", "\\&"), ("#", "\\#")):
        text = text.replace(char, escaped)
    return text


def _slug(name: str) -> str:
    return name.replace(":", "-").replace("/", "-")


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
