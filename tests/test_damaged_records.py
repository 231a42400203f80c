"""Damaged records: a row with a field missing, null or of another type is counted as damaged and skipped by
`report`, `compare`, `view` and `view --export`, for every task; and `report` writes only its own outputs."""

import hashlib
import io
import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from conftest import run_cli, run_cli_in_process
from diffeval.records import ENVELOPE_SCHEMA, MayBeAbsent, Record, matches, sample_id
from diffeval.report.gates import compare
from diffeval.report.tables import build_report
from diffeval.results import RunFolder
from diffeval.tasks import TASKS
from diffeval.view.data import open_run, sample_detail, sample_index, summary
from diffeval.view.export import export
from diffeval.view.server import Runs

ROOT = Path(__file__).resolve().parents[1]
NEEDLE_FIXTURE = ROOT / "tests" / "fixtures" / "view-needle"  # a small needle run of the built-in pair
THREE_WAY = ROOT / "results" / "toy-three-way"  # a committed run folder
BUILT_IN = ("needle", "attention", "icl", "hallucination", "outliers", "quantize", "zeroshot")
PAIR = {"diff": {"is_diff": True, "diff_variant": "v1"}, "base": {"is_diff": False}}


def _lm_eval_folder(root: Path, task: str) -> Path:
    """A quantize or zeroshot run folder of records as their `evaluate` writes them from lm-eval's results (lm-eval
    is an optional extra: these tasks' real runs are in test_activations.py)."""
    records = []
    for m, model in enumerate(PAIR):
        for t, lm_task in enumerate(("hellaswag", "arc_easy", "piqa", "boolq")):
            metrics = {"acc": 0.3 + 0.1 * t - 0.05 * m, "acc_stderr": 0.02, "acc_norm": 0.35 + 0.1 * t - 0.05 * m}
            if task == "zeroshot":
                fields = {"lm_task": lm_task, "metric": "acc_norm", "accuracy": metrics["acc_norm"]}
                records.append(Record(task, model, sample_id(f"zeroshot|{lm_task}"), 0, 0, 1.5, fields))
                records[-1].fields.update(metrics=metrics, limit=None)
                continue
            for bits in (16, 8, 6, 4):
                low = {k: v - (16 - bits) / 100 for k, v in metrics.items()}
                fields = {"lm_task": lm_task, "bits": bits, "granularity": "row", "acc": low["acc"]}
                fields.update(acc_norm=low["acc_norm"], metrics=low, limit=None)
                records.append(Record(task, model, sample_id(f"quantize|{bits}|{lm_task}|row"), 0, 0, 2.0, fields))
    folder = root / task
    folder.mkdir()
    config = {"task": task, "models": [{"name": m} for m in PAIR], "options": {}}
    (folder / "run.json").write_text(json.dumps({"config": config, "models": PAIR}))
    (folder / "samples.jsonl").write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records))
    return folder


@pytest.fixture(scope="module")
def task_runs(tmp_path_factory) -> dict[str, Path]:
    """A run folder of real records of every built-in task: small runs of the built-in pair, the committed needle
    fixture, and lm-eval-shaped records for quantize and zeroshot."""
    root = tmp_path_factory.mktemp("runs")
    fixtures = ["--ctx", "1k", "--data-dir", "package:fixtures"]
    commands = {
        "attention": ["attention", "--ctx", "1k", "--depths", "0,50,100", "--samples", "2"],
        "icl": ["icl", *fixtures, "--shots", "8", "--orders", "random:3", "--test-size", "3"],
        "hallucination": ["hallucination", *fixtures, "--dataset", "xsum,hotpotqa", "--samples=2", "--judge=overlap"],
        "outliers": ["outliers", "--tokens", "4k", "--ctx", "1k"],
    }
    for name, args in commands.items():
        result = run_cli("run", *args, "--out", str(root / name))
        assert result.returncode == 0, result.stderr
    return {
        "needle": NEEDLE_FIXTURE,
        **{name: root / name for name in commands},
        **{name: _lm_eval_folder(root, name) for name in ("quantize", "zeroshot")},
    }


def _schema(task: str) -> dict:
    return {**ENVELOPE_SCHEMA, **TASKS[task].scoring.record_schema}


def _mistyped(kind):
    """A value of another JSON type than `kind` allows."""
    return next(value for value in ({"mistyped": True}, "mistyped") if not matches(value, kind))


def _variants(task: str, record: dict) -> list[tuple[str, str, bool]]:
    """(field, how, damaged?) for every field of a real record nulled and deleted, and every declared field
    mistyped; damaged where the task's readers need the field (declared), and null or absence is not what the
    declaration allows."""
    schema = _schema(task)
    variants = []
    for name in record:
        kind = schema.get(name)
        optional = isinstance(kind, MayBeAbsent)
        kind = kind.kind if optional else kind
        variants.append((name, "null", name in schema and not matches(None, kind)))
        variants.append((name, "deleted", name in schema and not optional))
        if name in schema:
            variants.append((name, "mistyped", True))
    return variants


def _damage(record: dict, name: str, how: str, task: str) -> dict:
    changed = dict(record)
    if how == "deleted":
        del changed[name]
    elif how == "null":
        changed[name] = None
    else:
        kind = _schema(task)[name]
        changed[name] = _mistyped(kind.kind if isinstance(kind, MayBeAbsent) else kind)
    return changed


def _damaged_folders(source: Path, task: str, root: Path):
    """Copies of the run, each with one variant per record but the last, which stays whole (a folder of damaged
    records alone is refused): (folder, the varied records' (model, sample_id, field, how, damaged?))."""
    lines = (source / "samples.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    variants = _variants(task, records[0])
    for start in range(0, len(variants), len(records) - 1):
        chunk = variants[start : start + len(records) - 1]
        folder = root / f"{task}-{start}"
        folder.mkdir()
        shutil.copy(source / "run.json", folder)
        rows = [_damage(r, *v[:2], task) for r, v in zip(records, chunk)] + records[len(chunk) :]
        (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        yield folder, [(r["model"], r["sample_id"], *v) for r, v in zip(records, chunk)]


@pytest.mark.slow
@pytest.mark.parametrize("task", BUILT_IN)
def test_each_field_nulled_deleted_or_mistyped_is_skipped_as_damaged_everywhere(task, task_runs, tmp_path):
    source = task_runs[task]
    total = len((source / "samples.jsonl").read_text().splitlines())
    for folder, varied in _damaged_folders(source, task, tmp_path):
        damaged = {(m, s) for m, s, *_, bad in varied if bad}
        kept = {(m, s) for m, s, *_, bad in varied if not bad}
        context = f"{task}: {[v[2:] for v in varied]}"

        [report] = build_report([RunFolder(folder)], ["md", "csv", "html"], paper=True)
        assert report.damaged == len(damaged), context
        assert len(report.frame) == total - len(damaged), context
        rows = set(zip(report.frame["model"], report.frame["sample_id"]))
        assert not damaged & rows and kept <= rows, context
        if damaged:
            assert f"{len(damaged)} damaged line(s)" in (folder / "report.html").read_text(), context

        notes = []
        compare([RunFolder(source)], [RunFolder(folder)], 0.02, 0.05, warn=notes.append)
        assert any(f"skipped {len(damaged)} damaged line(s)" in n for n in notes) == bool(damaged), context

        view = open_run(0, folder)
        assert summary(view)["counts"]["damaged"] == len(damaged), context
        index = sample_index(view)
        assert len(index["records"]) == total - len(damaged), context
        for sample in {s for _, s, *_ in varied} & set(index["samples"]):
            detail = sample_detail(view, sample)
            assert detail["sample_id"] == sample, context

        console = Console(file=io.StringIO(), width=200)
        page = export([folder], tmp_path / f"export-{folder.name}", console)
        runs = (page.parent / "data" / "runs.js").read_text()
        assert f'"damaged": {len(damaged)}' in runs, context
        assert (f"skipped {len(damaged)} damaged line(s)" in console.file.getvalue()) == bool(damaged), context


@pytest.mark.parametrize("task", BUILT_IN)
def test_each_schema_declares_what_the_tables_pairing_and_gates_read(task):
    """The columns a task names in its declaration (summary, pairing, clusters, gate metrics, listing) are in its
    schema, with the fields its scoring reads."""
    reporting, viewing = TASKS[task].reporting, TASKS[task].viewing
    named = [*reporting.summary_keys, *(reporting.pair_keys or ()), *(reporting.cluster_keys or ())]
    named += [reporting.summary_value, *reporting.metrics.values()]
    if viewing.sample_view is not None:  # the viewer's list and comparison show these beside the task's view
        listing = viewing.listing
        named += [c for c in (listing.answer, listing.expected, listing.outcome) if c is not None]
    assert set(named) <= set(_schema(task))
    if task == "needle":  # the issue's case: rescoring reads the output against the expected numbers
        assert {"output", "expected", "numbers"} <= set(TASKS[task].scoring.record_schema)


@pytest.mark.slow
def test_an_output_of_null_is_one_damaged_line_through_the_command_line(tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(NEEDLE_FIXTURE, folder)
    lines = (folder / "samples.jsonl").read_text().splitlines(keepends=True)
    record = json.loads(lines[3])
    lines[3] = json.dumps({**record, "output": None}) + "\n"
    (folder / "samples.jsonl").write_text("".join(lines))
    note = f"skipped 1 damaged line(s) and 0 duplicate record(s) in {folder / 'samples.jsonl'}"
    reason = "(first damaged: line 4: field 'output' is null, not text)"
    for args in (
        ("report", str(folder)),
        ("compare", str(NEEDLE_FIXTURE), str(folder)),
        ("view", str(folder), "--export", str(tmp_path / "page")),
    ):
        result = run_cli_in_process(*args)
        assert result.returncode == 0, result.stderr
        assert f"{note} {reason}" in " ".join(result.stderr.split()), (args, result.stderr)
    assert [" ".join(n.split()) for n in Runs([folder]).dropped_notes()] == [f"warning: {note} {reason}"]  # the server
    (folder / "samples.jsonl").write_text(lines[3])  # nothing left to report: refused, saying why
    refused = run_cli_in_process("report", str(folder))
    assert (
        refused.returncode == 2
        and "no finished samples yet (1 damaged line(s); first: line 1: field 'output' is null, not text)"
        in " ".join(refused.stderr.split())
    )


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


@pytest.mark.slow
def test_report_reruns_reproduce_the_committed_table_and_paper_rows_keep_the_model_header(tmp_path):
    folder = tmp_path / THREE_WAY.name
    shutil.copytree(THREE_WAY, folder)
    rerun = run_cli_in_process("report", str(folder))  # as committed: a rerun changes no byte of its table
    assert rerun.returncode == 0, rerun.stderr
    for name in ("table.md", "summary.csv"):
        assert (folder / name).read_bytes() == (THREE_WAY / name).read_bytes(), name

    before = _digests(folder)
    [report] = build_report([RunFolder(folder)], ["md"], paper=True)
    table = (folder / "table.md").read_text()
    header = table.split("### Table 2 layout")[1].splitlines()[2]
    assert header.split("|")[1].strip() == "model" and "| paper: DIFF-3B" in table
    written = {p.name for p in report.written}
    assert written == {"summary.csv", "table.md", "needle_heatmap.png", "needle_position_curves.png"}
    after = _digests(folder)
    assert set(after) == set(before)  # nothing new besides the report's own files, which the folder already held
    assert {name for name in before if before[name] != after[name]} <= written
    assert all(before[name] == after[name] for name in ("samples.jsonl", "run.json", "paired.csv", "table2.csv"))
