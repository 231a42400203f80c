"""Run folders under concurrency: one writer at a time, stale locks taken over, duplicate rows dropped with a count."""

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import pair_options, run_cli, run_cli_in_process

REPO = Path(__file__).resolve().parents[1]


def _keys(folder: Path) -> list[tuple[str, str]]:
    rows = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines() if line.strip()]
    return [(r["model"], r["sample_id"]) for r in rows]


def _start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "diffeval", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def _wait_for_records(folder: Path, count: int, process: subprocess.Popen) -> None:
    samples = folder / "samples.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        if samples.exists() and samples.read_text().count("\n") >= count:
            return
        time.sleep(0.1)
    raise AssertionError(f"no {count} records in time (exit {process.poll()}): {process.stderr.read()}")


def _needle_args(tiny_models, out: Path, samples: int = 4) -> list[str]:
    return ["run", "needle", *pair_options(tiny_models), "--ctx", "1k", "--depths", "0,50,100", "--samples",
            str(samples), "--out", str(out)]  # fmt: skip


@pytest.mark.slow
def test_second_process_on_a_folder_in_use_exits_2_and_changes_nothing(tiny_models, tmp_path):
    out = tmp_path / "busy"
    args = _needle_args(tiny_models, out, samples=8)
    first = _start(args)
    try:
        _wait_for_records(out, 2, first)
        assert first.poll() is None
        second = run_cli_in_process(*args)  # no interpreter start-up: it meets the first while that one runs
        assert second.returncode == 2
        [line] = second.stderr.strip().splitlines()
        assert line.startswith(f"error: {out} is in use by pid {first.pid} on host "), line
        assert first.wait(timeout=300) == 0, first.stderr.read()
    finally:
        first.kill()
    keys = _keys(out)
    assert len(keys) == len(set(keys)) == 48  # 2 models × 3 depths × 8 samples, each exactly once
    assert (out / "run.lock").read_text() == ""  # released


@pytest.mark.slow
def test_lock_of_a_killed_run_is_taken_over(tiny_models, tmp_path):
    out = tmp_path / "killed"
    args = _needle_args(tiny_models, out)
    first = _start(args)
    try:
        _wait_for_records(out, 3, first)
        first.send_signal(signal.SIGKILL)
        first.wait()
    finally:
        first.kill()
    assert json.loads((out / "run.lock").read_text())["pid"] == first.pid  # the dead holder's note is still there
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    keys = _keys(out)
    assert len(keys) == len(set(keys)) == 24


@pytest.mark.slow
def test_duplicate_rows_are_dropped_with_a_count(tmp_path):
    folder = tmp_path / "toy-pair"
    shutil.copytree(REPO / "results" / "toy-pair", folder)
    lines = (folder / "samples.jsonl").read_text().splitlines(keepends=True)
    with (folder / "samples.jsonl").open("a") as handle:  # what two writers in one folder used to leave
        handle.writelines(lines[:3])
    result = run_cli("report", str(folder), "--format", "md,csv")
    assert result.returncode == 0, result.stderr
    assert "3 duplicate record(s)" in result.stderr
    for name in ("table.md", "table2.csv", "summary.csv", "paired.csv"):
        assert (folder / name).read_bytes() == (REPO / "results" / "toy-pair" / name).read_bytes(), name
    compared = run_cli("compare", str(REPO / "results" / "toy-pair"), str(folder))
    assert compared.returncode == 0 and "3 duplicate record(s)" in compared.stderr
