"""The command line answers at once: importing it loads none of the heavy libraries, and `--help`, every task's
`--help` and a bad-input error work through the real CLI without loading one either (the start-up's speed is
measured by benchmarks/cli_speed.py, not timed here)."""

import re
import subprocess
import sys
from dataclasses import fields

import pytest

from conftest import HEAVY, run_probed
from diffeval.config import RunConfig, declared_engine_options
from diffeval.models.backend import engine_options
from diffeval.tasks import TASKS


@pytest.mark.slow
def test_importing_the_cli_loads_no_heavy_library():
    code = f"import sys, diffeval.cli; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.slow
def test_help_lists_every_command(tmp_path):
    result, heavy = run_probed(tmp_path, "--help")
    assert result.returncode == 0, result.stderr
    for command in ("run", "report", "compare", "view", "models", "toy"):
        assert re.search(rf"^  {command} ", result.stdout, re.MULTILINE)
    assert heavy == []


def declared_flags(name: str) -> list[str]:
    """Every flag `diffeval run NAME` takes, from the declarations (config.option): the task's options, then
    RunConfig's common ones and those the task lists, then every engine's own."""
    task = TASKS[name]
    declared = [f for f in fields(task.options) if f.metadata.get("cli", True)]
    declared += [
        f for f in fields(RunConfig) if "help" in f.metadata and (f.metadata["cli"] or f.name in task.run_options)
    ]
    declared += list(declared_engine_options(engine_options()).values())
    flags = ["--model", "--config"]
    for f in declared:
        flags += (f.metadata.get("flag") or "--" + f.name.replace("_", "-")).split("/")
    return flags


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_help_lists_its_options(tmp_path, name):
    result, heavy = run_probed(tmp_path, "run", name, "--help")
    assert result.returncode == 0, result.stderr
    assert TASKS[name].help in " ".join(result.stdout.split())
    listed = {word.strip(",") for line in result.stdout.splitlines() for word in line.split() if word.startswith("--")}
    assert set(declared_flags(name)) <= listed, set(declared_flags(name)) - listed
    assert {"--dry-run", "--tokens-per-s"} <= listed
    help_text = " ".join(result.stdout.replace("│", " ").split())
    assert "[default: hf]" in help_text  # help text is shown as written, not read as markup
    assert heavy == []


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "needle", "--ctx", "0k"], "error: bad context length '0k': use a positive integer or NNk, e.g. 4k,8k"),
        (["run", "needle", "--depths", "0,200"], "error: depth 200 is outside 0-100"),
        (["run", "quantize", "--granularity", "cell"], "error: bad --granularity 'cell': use one of tensor, head, row"),
        (["run", "needle", "--no-such-flag"], "error: No such option: --no-such-flag"),
        (["run", "no-such-task"], "error: No such command 'no-such-task'"),
    ],
)
def test_bad_input_is_one_line_before_any_heavy_import(tmp_path, args, message):
    result, heavy = run_probed(tmp_path, *args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), result.stderr
    assert heavy == []
