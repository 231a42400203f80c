"""CI gates: `--fail-under TASK.METRIC@MODEL=VALUE` thresholds and `compare OLD NEW` regression checks.

A metric is the mean of a task's per-sample value over all of a model's scored samples in a run folder
(needle.accuracy, attention.answer_share, attention.noise_share, attention.answer_share_normalized, icl.accuracy,
hallucination.accuracy). Exit code 1 means a gate failed; 2 stays reserved for bad input.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from diffeval.errors import InputError
from diffeval.report.stats import cluster_labels, paired_difference, paired_test
from diffeval.report.tables import load_records
from diffeval.results import RUN_FILE, RunFolder
from diffeval.tasks import TASKS

_GATE = re.compile(r"(?P<task>\w+)\.(?P<metric>\w+)@(?P<model>[\w.\-]+)=(?P<value>[-+]?\d*\.?\d+)")


@dataclass(frozen=True)
class Threshold:
    task: str
    metric: str
    model: str
    value: float

    def __str__(self) -> str:
        return f"{self.task}.{self.metric}@{self.model}={self.value:g}"


def parse_threshold(text: str) -> Threshold:
    match = _GATE.fullmatch(text.strip())
    if not match:
        raise InputError(f"bad --fail-under {text!r}: use TASK.METRIC@MODEL=VALUE, e.g. needle.accuracy@diff=0.8")
    gate = Threshold(match["task"], match["metric"], match["model"], float(match["value"]))
    if gate.task not in TASKS or gate.metric not in TASKS[gate.task].reporting.metrics:
        known = ", ".join(f"{name}.{m}" for name, task in TASKS.items() for m in task.reporting.metrics)
        raise InputError(f"unknown metric {gate.task}.{gate.metric} in --fail-under: use one of {known}")
    return gate


def run_folders(paths: Sequence[str | Path]) -> list[RunFolder]:
    """Run folders, expanding a suite folder into the run folders inside it."""
    folders = []
    for path in map(Path, paths):
        if (path / RUN_FILE).is_file():
            folders.append(RunFolder(path))
        elif path.is_dir() and any((child / RUN_FILE).is_file() for child in path.iterdir()):
            folders.extend(RunFolder(c) for c in sorted(path.iterdir()) if (c / RUN_FILE).is_file())
        else:
            raise InputError(f"{path} is neither a run folder nor a suite folder (no run.json): give a run's --out")
    return folders


def load_runs(folders: list[RunFolder], warn=None) -> list[tuple[str, pd.DataFrame]]:
    """(task, records) of each run folder; `warn` hears how many damaged and duplicate lines were dropped."""
    runs = []
    for folder in folders:
        loaded = load_records(folder)
        if warn is not None and (loaded.damaged or loaded.duplicates):
            warn(dropped_note(folder, loaded.damaged, loaded.duplicates, loaded.first_damage))
        runs.append((loaded.task.name, loaded.frame))
    return runs


def dropped_note(folder: RunFolder, damaged: int, duplicates: int, first_damage: str | None = None) -> str:
    """The one line `report`, `compare` and `view` print for what they skipped; it says where the first damage is."""
    where = f" (first damaged: {first_damage})" if first_damage else ""
    return (
        f"warning: skipped {damaged} damaged line(s) and {duplicates} duplicate record(s) in {folder.samples_path}"
        f"{where}"
    )


def metric_values(runs: list[tuple[str, pd.DataFrame]]) -> dict[tuple[str, str, str], pd.Series]:
    """(task, metric, model) → per-sample values indexed by sample_id."""
    values = {}
    for task, frame in runs:
        for metric, column in TASKS[task].reporting.metrics.items():
            if column not in frame:
                continue
            scored = frame.dropna(subset=[column])
            for model, group in scored.groupby("model", sort=False):
                values[(task, metric, model)] = group.set_index("sample_id")[column].astype(float)
    return values


def check_thresholds(gates: list[Threshold], runs: list[tuple[str, pd.DataFrame]]) -> list[str]:
    """Failure messages of the gates that are missed (a metric that is absent is a failure too)."""
    values = metric_values(runs)
    failures = []
    for gate in gates:
        series = values.get((gate.task, gate.metric, gate.model))
        if series is None:
            failures.append(f"{gate}: no {gate.task} results for model {gate.model}")
        elif series.mean() < gate.value:
            failures.append(f"{gate}: measured {series.mean():.4f} < {gate.value:g}")
    return failures


def compare(old: list[RunFolder], new: list[RunFolder], max_drop: float, alpha: float, warn=None) -> pd.DataFrame:
    """Every metric both sides share: old and new means, the drop, and a paired test on the shared samples: for a
    task with clusters of dependent samples, a paired cluster bootstrap, and `clusters` counts them (elsewhere every
    sample is its own)."""
    old_runs = load_runs(old, warn)
    before, after = metric_values(old_runs), metric_values(load_runs(new, warn))
    samples = {task: frame.drop_duplicates("sample_id").set_index("sample_id") for task, frame in old_runs}
    unclustered = set()  # tasks with clusters whose records lack their columns (runs older than the clusters)
    rows = []
    for key in sorted(set(before) & set(after)):
        shared = before[key].index.intersection(after[key].index)
        keys = TASKS[key[0]].reporting.cluster_keys
        labels = cluster_labels(samples[key[0]].loc[shared], keys) if len(shared) else None
        if labels is not None:
            result = paired_difference(before[key][shared], after[key][shared], clusters=labels)
            p_value, test, clusters = result["p_value"], result["test"], result["clusters"]
        else:
            p_value, test = paired_test(before[key][shared], after[key][shared]) if len(shared) else (1.0, "none")
            clusters = len(shared)
            if keys and len(shared):
                unclustered.add(key[0])
        drop = before[key].mean() - after[key].mean()
        rows.append(
            {
                "task": key[0],
                "metric": key[1],
                "model": key[2],
                "old": before[key].mean(),
                "new": after[key].mean(),
                "drop": drop,
                "paired_n": len(shared),
                "clusters": clusters,
                "p_value": p_value,
                "test": test,
                "regressed": bool(drop > max_drop and p_value < alpha),
            }
        )
    if warn is not None:
        for task in sorted(unclustered):
            columns = ", ".join(TASKS[task].reporting.cluster_keys or ())
            warn(
                f"note: {task} records lack {columns}: compare counts every sample as "
                "independent (McNemar/Wilcoxon), which overstates significance"
            )
    return pd.DataFrame(rows)
