"""Damaged run folders, one table per command (report, view, compare): each case is a copy of a committed run folder
(results/) damaged one way. A record of the right types but the wrong shape (a per-bucket or per-layer list of
another length, a list nested where numbers are, NaN, text that is not UTF-8, another task's or model's line) is
counted and skipped as damaged, saying why; a run.json edited out of shape, or a folder with nothing to read, is
refused in one line, the folder left byte-identical and no results/ folder made."""

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from test_bad_input import assert_refused_in_place

from conftest import run_cli_in_process as run_cli

REPO = Path(__file__).resolve().parents[1]
NLL = REPO / "results" / "nll-toy-pair"  # nll, --buckets 16, two models
SHARES = REPO / "results" / "probes-toy" / "distractor-attention-vt"  # per-layer shares of three models
NEEDLE = REPO / "tests" / "fixtures" / "view-needle"  # a small needle run of the built-in pair


def _first_record(change: Callable[[dict], None]) -> Callable[[Path], None]:
    """A damage: `change` applied to the first record of samples.jsonl."""

    def damage(folder: Path) -> None:
        lines = (folder / "samples.jsonl").read_text().splitlines()
        record = json.loads(lines[0])
        change(record)
        lines[0] = json.dumps(record)
        (folder / "samples.jsonl").write_text("\n".join(lines) + "\n")

    return damage


def _run_json(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        run = json.loads((folder / "run.json").read_text())
        change(run)
        (folder / "run.json").write_text(json.dumps(run))

    return damage


def _raw_bytes(folder: Path) -> None:
    """Two needle outputs that are not UTF-8: raw bytes, and a JSON escape of half a surrogate pair."""
    lines = (folder / "samples.jsonl").read_bytes().split(b"\n")
    lines[0] = lines[0].replace(b'"output": "', b'"output": "\xff\xfe', 1)
    lines[1] = lines[1].replace(b'"output": "', b'"output": "\\ud800', 1)
    (folder / "samples.jsonl").write_bytes(b"\n".join(lines))


def _other_task_lines(folder: Path) -> None:
    with (folder / "samples.jsonl").open("a") as handle:
        handle.write("".join((NEEDLE / "samples.jsonl").read_text().splitlines(keepends=True)[:2]))


def _emptied(folder: Path) -> None:
    for path in folder.iterdir():
        path.unlink()


def _shorter(field: str) -> Callable[[dict], None]:
    return lambda record: record.update({field: record[field][:-1]})


def _one_map_segment_shorter(record: dict) -> None:
    record["shares"]["A1"]["answer"].pop()


def _every_layer_list_nested(record: dict) -> None:
    record["shares"]["diff"]["answer"] = [[v] for v in record["shares"]["diff"]["answer"]]


# (case, source, damage, what comes out): ("skipped", n, why) is n damaged lines counted, skipped and the first
# explained; ("refused", message) is one line
DAMAGED_RECORDS = [
    (
        "nll token_nll shorter than --buckets",
        NLL,
        _first_record(_shorter("token_nll")),
        ("skipped", 1, "field 'token_nll' has 15 values, not 16: one per bucket (buckets in run.json)"),
    ),
    (
        "nll bucket_bytes longer than --buckets",
        NLL,
        _first_record(lambda r: r["bucket_bytes"].append(1)),
        ("skipped", 1, "field 'bucket_bytes' has 17 values, not 16"),
    ),
    (
        "nll token_counts shorter than the others",
        NLL,
        _first_record(_shorter("token_counts")),
        ("skipped", 1, "field 'token_counts' has 15 values, not 16"),
    ),
    (
        "nll strip nested lists",
        NLL,
        _first_record(lambda r: r.update(strip=[[v] for v in r["strip"]])),
        ("skipped", 1, "field 'strip'[0] is a list, not a number"),
    ),
    (
        "nll strip of another bin count",
        NLL,
        _first_record(_shorter("strip")),
        ("skipped", 1, "field 'strip' has 63 values, not 64: one per strip bin"),
    ),
    (
        "nll NaN",
        NLL,
        _first_record(lambda r: r.update(bpb=float("nan"))),
        ("skipped", 1, "field 'bpb' is NaN, not a number"),
    ),
    (
        "nll infinity in a bucket",
        NLL,
        _first_record(lambda r: r["byte_nll"].__setitem__(3, float("inf"))),
        ("skipped", 1, "field 'byte_nll'[3] is infinite, not a number"),
    ),
    (
        "shares: one map's segment of another layer count",
        SHARES,
        _first_record(_one_map_segment_shorter),
        ("skipped", 1, "has 4 values, not 3: one per layer"),
    ),
    (
        "shares: numbers nested in lists",
        SHARES,
        _first_record(_every_layer_list_nested),
        ("skipped", 1, "field 'shares'['diff']['answer'][0] is a list, not a number"),
    ),
    (
        "shares: NaN answer share",
        SHARES,
        _first_record(lambda r: r.update(answer_share=float("-inf"))),
        ("skipped", 1, "field 'answer_share' is infinite, not a number"),
    ),
    ("needle outputs not UTF-8", NEEDLE, _raw_bytes, ("skipped", 2, "line 1: not UTF-8 text")),
    (
        "another task's lines",
        NLL,
        _other_task_lines,
        ("skipped", 2, "a record of task 'needle', not of this run's 'nll'"),
    ),
    (
        "records of a model run.json lacks",
        NLL,
        _run_json(lambda r: r["config"].update(models=r["config"]["models"][:1])),
        ("skipped", 32, "a record of model 'base', which run.json's models (diff) lack"),
    ),
]
DAMAGED_RUN = [
    (
        "an option of another type",
        NLL,
        _run_json(lambda r: r["config"]["options"].update(buckets="16")),
        ("refused", 'run.json stores option buckets as "16", not an integer'),
    ),
    (
        "an option null",
        SHARES,
        _run_json(lambda r: r["config"]["options"].update(ctx=None)),
        ("refused", "run.json stores option ctx as null, not a list (an integer each)"),
    ),
    (
        "an option's value not the records' shape",
        NLL,
        _run_json(lambda r: r["config"]["options"].update(buckets=8)),
        ("refused", "64 damaged line(s); first: line 1: field 'token_nll' has 16 values, not 8"),
    ),
    (
        "a model entry without a name",
        NEEDLE,
        _run_json(lambda r: r["config"].update(models=[{"name": 7}])),
        ("refused", "has a damaged config (models or options)"),
    ),
    (
        "model metadata not objects",
        NEEDLE,
        _run_json(lambda r: r["models"].update(diff="v1")),
        ("refused", "has damaged model metadata"),
    ),
    ("an empty folder", NLL, _emptied, ("refused", "is neither a run folder nor a suite folder (no run.json)")),
]
REPORT = DAMAGED_RECORDS + DAMAGED_RUN
VIEW = DAMAGED_RECORDS + [  # the viewer opens a folder of no whole record yet (a run just started), empty
    (case, source, damage, ("skipped", 64, outcome[1].split("first: ")[1]) if "64 damaged" in outcome[1] else outcome)
    for case, source, damage, outcome in DAMAGED_RUN
]
COMPARE = DAMAGED_RECORDS + DAMAGED_RUN[:-1]  # compare names its own message for an empty folder, below


def _damaged_copy(tmp_path: Path, source: Path, damage) -> Path:
    folder = tmp_path / "damaged"
    shutil.copytree(source, folder)
    damage(folder)
    return folder


def _check(tmp_path: Path, folder: Path, args: list[str], outcome: tuple) -> None:
    if outcome[0] == "refused":
        assert_refused_in_place(tmp_path, args, outcome[1], kept=(folder,))
        return
    _, count, why = outcome
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stderr.split())
    assert f"skipped {count} damaged line(s)" in said and why in said, said
    assert "Traceback" not in said


@pytest.mark.parametrize(("case", "source", "damage", "outcome"), REPORT, ids=[c[0] for c in REPORT])
def test_report_on_a_damaged_folder(tmp_path, case, source, damage, outcome):
    folder = _damaged_copy(tmp_path, source, damage)
    _check(tmp_path, folder, ["report", str(folder), "--format", "md"], outcome)


@pytest.mark.parametrize(("case", "source", "damage", "outcome"), VIEW, ids=[c[0] for c in VIEW])
def test_view_on_a_damaged_folder(tmp_path, case, source, damage, outcome):
    folder = _damaged_copy(tmp_path, source, damage)
    _check(tmp_path, folder, ["view", str(folder), "--export", str(tmp_path / "page")], outcome)
    if outcome[0] == "skipped":  # every sample's page was built from the records that are whole
        assert (tmp_path / "page" / "index.html").is_file()


@pytest.mark.parametrize(("case", "source", "damage", "outcome"), COMPARE, ids=[c[0] for c in COMPARE])
def test_compare_against_a_damaged_folder(tmp_path, case, source, damage, outcome):
    folder = _damaged_copy(tmp_path, source, damage)
    _check(tmp_path, folder, ["compare", str(source), str(folder)], outcome)


def test_compare_against_an_empty_folder(tmp_path):
    folder = _damaged_copy(tmp_path, NLL, _emptied)
    assert_refused_in_place(tmp_path, ["compare", str(NLL), str(folder)], "no run.json", kept=(folder,))
