"""`--threads` on hf: its default is the cores this process may use minus the load already on them at start, at least
1; the value is applied (torch's intra-op threads) and recorded in run.json's machine record; a bad value is one line.
"""

import json
import os

import pytest
import torch

from conftest import pair_options
from conftest import run_cli_in_process as run_cli_fast
from diffeval import machine
from diffeval.machine import cpu_model, default_threads, gpu_names, start_threads

SMALL = ["--ctx", "512", "--needles", "1", "--queries", "1", "--depths", "50", "--samples", "1"]


@pytest.mark.parametrize(
    "cores, load, threads",
    [(2, 0.0, 2), (2, 0.49, 2), (2, 0.5, 1), (2, 1.6, 1), (2, 4.5, 1), (1, 0.0, 1), (16, 2.5, 13), (16, 3.4, 13)],
)
def test_default_is_the_cores_the_load_leaves_free(cores, load, threads):
    assert default_threads(cores, load) == threads


@pytest.fixture
def machine_load(monkeypatch):
    """Sets the cores this process may use and the load on them, as the default reads them at a run's start; torch's
    thread count and the once-per-process default are put back after the test."""
    before = torch.get_num_threads()
    start_threads.cache_clear()

    def set_load(cores: int, load: float) -> None:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
        monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
        start_threads.cache_clear()

    yield set_load
    start_threads.cache_clear()
    torch.set_num_threads(before)


def test_the_default_is_read_once_at_start(machine_load, monkeypatch):
    machine_load(4, 1.6)
    assert machine.usable_cores() == 4 and start_threads() == 2
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))  # the load falls later: the run keeps its value
    assert start_threads() == 2


def _machine(folder) -> dict:
    return json.loads((folder / "run.json").read_text())["machine"]


@pytest.mark.slow
def test_a_run_applies_and_records_its_threads(tiny_models, tmp_path, machine_load):
    machine_load(3, 0.6)  # 3 cores, 1 busy: 2 threads
    result = run_cli_fast("run", "needle", *pair_options(tiny_models), *SMALL, "--out", str(tmp_path / "default"))
    assert result.returncode == 0, result.stderr
    assert _machine(tmp_path / "default") == {
        "cpu": cpu_model(),
        "cores": 3,
        "gpus": gpu_names(),
        "engine": "hf",
        "threads": 2,
    }
    assert torch.get_num_threads() == 2
    assert cpu_model() and gpu_names() == [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]

    result = run_cli_fast(
        "run", "needle", *pair_options(tiny_models), *SMALL, "--out", str(tmp_path / "one"), "--threads", "1"
    )
    assert result.returncode == 0, result.stderr
    assert _machine(tmp_path / "one")["threads"] == 1 and torch.get_num_threads() == 1


@pytest.mark.parametrize(
    "value, message",
    [
        ("0", "error: --threads 0: give at least 1, or leave it out for the cores the load leaves free"),
        ("-2", "error: --threads -2: give at least 1, or leave it out for the cores the load leaves free"),
        ("two", "error: Invalid value for '--threads'"),
        ("1.5", "error: Invalid value for '--threads'"),
    ],
)
def test_bad_threads_is_one_line(value, message):
    result = run_cli_fast("run", "needle", "--threads", value, "--dry-run")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), result.stderr
