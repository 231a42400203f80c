"""The `longctx-2026` preset: mrcr, graphwalks and longbench2 at their defaults; on the built-in models, the values
its entries give for them (`on_builtin_models`), each said in one line."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli
from diffeval.errors import InputError
from diffeval.suite import suite_configs


def test_the_preset_runs_each_task_at_its_defaults_on_given_models(tmp_path):
    said: list[str] = []
    models = {"models": ["diff=toy-diff", "base=toy-base"]}
    _, configs = suite_configs("longctx-2026", str(tmp_path), models, said.append)
    by_task = {config.task: config.options for config in configs}
    assert list(by_task) == ["mrcr", "graphwalks", "longbench2"]
    assert by_task["mrcr"].rendering == "chat" and by_task["mrcr"].needles == [2, 4, 8]
    assert by_task["longbench2"].data_dir is None  # the hub's THUDM/LongBench-v2
    assert by_task["graphwalks"].source == "generated"
    assert said == []


def test_on_the_built_in_models_each_change_is_said_and_kept_in_the_config(tmp_path):
    said: list[str] = []
    _, configs = suite_configs("longctx-2026", str(tmp_path), {}, said.append)
    by_task = {config.task: config.options for config in configs}
    assert by_task["mrcr"].rendering == "plain"
    assert by_task["longbench2"].data_dir.endswith("fixtures")  # `package:fixtures`, inside the installed package
    assert said == [
        "mrcr: on the built-in models, rendering plain (instead of its default)",
        "longbench2: on the built-in models, data_dir package:fixtures (instead of its default)",
    ]


def test_an_entry_whose_builtin_values_are_no_mapping_is_refused(tmp_path):
    preset = tmp_path / "mine.yaml"
    preset.write_text("suite: mine\ntasks:\n  - task: mrcr\n    on_builtin_models: plain\n")
    with pytest.raises(InputError, match="mrcr's `on_builtin_models:` is a mapping of its options to values"):
        suite_configs(str(preset), str(tmp_path / "out"), {})


@pytest.mark.slow
def test_the_preset_runs_offline_on_the_built_in_pair(tmp_path):
    """One sample per cell through the command line: each task writes records, the suite its report, and run.json
    keeps the values the built-in models ran with."""
    result = run_cli("run", "suite", "longctx-2026", "--limit", "1", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "mrcr: on the built-in models, rendering plain" in result.stderr
    for task in ("mrcr", "graphwalks", "longbench2"):
        records = [json.loads(line) for line in (tmp_path / task / "samples.jsonl").read_text().splitlines()]
        assert records and all("score" in r for r in records), task
    stored = json.loads((tmp_path / "mrcr" / "run.json").read_text())
    assert stored["config"]["options"]["rendering"] == "plain"
    assert (tmp_path / "report" / "report.html").is_file()
