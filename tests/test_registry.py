"""The task contract and the engine seam: a task and an engine from outside diffeval, registered only through entry
points (tests/plugin: a module and its dist-info, put on PYTHONPATH), run through the real CLI; capability errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diffeval.errors import InputError
from diffeval.models import backend as backend_module
from diffeval.models.backend import Engine, check_backend
from diffeval.tasks import TASKS

PLUGIN = Path(__file__).resolve().parent / "plugin"


def run_with_plugin(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200", "PYTHONPATH": str(PLUGIN)}
    return subprocess.run(
        [sys.executable, "-m", "diffeval", *args], capture_output=True, text=True, timeout=600, env=env
    )


def test_every_task_declares_the_contract():
    for name, task in TASKS.items():
        assert task.name == name and task.help and task.reporting.note and task.reporting.titles
        assert task.running.needs_for(task.options()) <= set(backend_module.CAPABILITIES)
        assert set(task.reporting.metrics) and task.reporting.summary_keys[0] == "model"


@pytest.mark.slow
def test_a_plugin_task_runs_through_the_cli(tiny_models, tmp_path):
    help_text = run_with_plugin("run", "echo", "--help")
    assert help_text.returncode == 0 and "--prefix" in help_text.stdout and "--count" in help_text.stdout
    out = tmp_path / "echo"
    result = run_with_plugin("run", "echo", "-m", f"m={tiny_models['base_a']}", "--count", "2", "--out", str(out))
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [(r["task"], r["model"]) for r in records] == [("echo", "m")] * 2
    assert {"prompt_tokens", "new_tokens", "seconds", "sample_id", "output"} <= set(records[0])
    table = (out / "table.md").read_text()
    assert "Echo probe: share of non-empty outputs" in table
    assert "Number: non-empty" in table  # the run's --prefix, handed to the task's tables from run.json
    # and it is gone without the plugin: nothing in diffeval names it
    assert "echo" not in TASKS


@pytest.mark.slow
def test_a_plugin_task_declares_its_context_budget(tiny_models, tmp_path):
    """The budget check is the task's: echo's 4 answer tokens and 16 prompt tokens, refused in one line."""
    out = tmp_path / "echo"
    result = run_with_plugin("run", "echo", "-m", f"m={tiny_models['base_a']}", "--ctx", "19", "--out", str(out))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["error: context 19 leaves no room for a prompt: use at least 20"]
    assert not out.exists()


@pytest.mark.slow
def test_a_plugin_engine_runs_a_task_it_can_serve(tiny_models, tmp_path):
    out = tmp_path / "needle-textonly"
    args = ["run", "needle", "-m", f"m={tiny_models['base_a']}", "--ctx", "1k", "--depths", "50", "--samples", "2"]
    result = run_with_plugin(*args, "--backend", "textonly", "--out", str(out))
    assert result.returncode == 0, result.stderr
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["backend"] == "textonly"
    assert len((out / "samples.jsonl").read_text().splitlines()) == 2


@pytest.mark.slow
def test_a_plugin_engine_declares_an_option_of_its_own(tiny_models, tmp_path):
    """`suffix` declares --output-suffix in its options class: `--help` lists it, a run hands it to the engine and
    records it in run.json (it changes outputs, so it is part of the identity), another engine refuses it."""
    help_text = run_with_plugin("run", "needle", "--help")
    assert help_text.returncode == 0 and "--output-suffix" in help_text.stdout
    out = tmp_path / "needle-suffix"
    args = ["run", "needle", "-m", f"m={tiny_models['base_a']}", "--ctx", "1k", "--depths", "50", "--samples", "2"]
    result = run_with_plugin(*args, "--backend", "suffix", "--output-suffix", " [probe]", "--out", str(out))
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["output"].endswith(" [probe]") for r in records), records
    assert json.loads((out / "run.json").read_text())["config"]["output_suffix"] == " [probe]"

    other = run_with_plugin(*args, "--backend", "suffix", "--output-suffix", " [other]", "--out", str(out))
    assert other.returncode == 2 and "output_suffix differ" in other.stderr, other.stderr
    refused = run_with_plugin(*args, "--output-suffix", " [probe]", "--out", str(tmp_path / "on-hf"))
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "error: --output-suffix set(s) the suffix engine, not hf: add --backend suffix, or leave it out"
    ]
    assert not (tmp_path / "on-hf").exists()


@pytest.mark.slow
def test_a_task_needing_a_capability_the_engine_lacks_is_one_line(tiny_models, tmp_path):
    out = tmp_path / "attention-textonly"
    result = run_with_plugin(
        "run",
        "attention",
        "-m",
        f"m={tiny_models['base_a']}",
        "--ctx",
        "1k",
        "--backend",
        "textonly",
        "--out",
        str(out),
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: task attention needs attention_rows, which backend textonly lacks: run it with --backend hf"
    ]
    assert not out.exists()


def test_capability_check_in_process(monkeypatch):
    monkeypatch.setitem(
        backend_module.BACKENDS, "gen-only", Engine("gen-only", "nowhere:Nothing", frozenset({"generate"}))
    )
    check_backend("needle", TASKS["needle"].running.needs, "gen-only")
    with pytest.raises(
        InputError, match="task outliers needs torch_module, which backend gen-only lacks: run it with --backend hf"
    ):
        check_backend("outliers", TASKS["outliers"].running.needs, "gen-only")
    with pytest.raises(InputError, match="unknown --backend 'nope'"):
        check_backend("needle", TASKS["needle"].running.needs, "nope")
