"""Bad input anywhere is one line, exit 2, no traceback, nothing in a run folder changed; degenerate runs still write
their counts and tables."""

import json
import shutil
from pathlib import Path

import pytest

from conftest import run_cli_in_process as run_cli

REPO = Path(__file__).resolve().parents[1]
TOY_PAIR = REPO / "results" / "toy-pair"


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_one_line(result, message: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def broken_checkpoints(tiny_models, tmp_path_factory) -> dict[str, Path]:
    """Copies of a real tiny checkpoint, each damaged one way."""
    root = tmp_path_factory.mktemp("broken")
    broken = {}
    for name in ("truncated_weights", "no_tokenizer", "bad_config", "config_not_json"):
        broken[name] = root / name
        shutil.copytree(tiny_models["base_a"], broken[name])
    weights = broken["truncated_weights"] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    for path in broken["no_tokenizer"].iterdir():
        if path.name.startswith(("tokenizer", "special_tokens")):
            path.unlink()
    (broken["bad_config"] / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    (broken["config_not_json"] / "config.json").write_text('{"model_type": "llama", ')
    return broken


CHECKPOINT_CASES = [
    ("truncated_weights", "cannot load its weights"),
    ("no_tokenizer", "cannot load its tokenizer"),
    ("bad_config", "cannot load its config"),
    ("config_not_json", "cannot load its config"),
]


@pytest.mark.parametrize(("damage", "message"), CHECKPOINT_CASES)
def test_models_inspect_on_a_broken_checkpoint(broken_checkpoints, damage, message):
    assert_one_line(run_cli("models", "inspect", str(broken_checkpoints[damage])), message)


@pytest.mark.parametrize(("damage", "message"), CHECKPOINT_CASES)
def test_run_on_a_broken_checkpoint_leaves_no_folder(broken_checkpoints, tmp_path, damage, message):
    out = tmp_path / "out"
    args = [
        "run",
        "needle",
        "-m",
        f"m={broken_checkpoints[damage]}",
        "--ctx",
        "1k",
        "--samples",
        "1",
        "--out",
        str(out),
    ]
    assert_one_line(run_cli(*args), message)
    assert not (out / "samples.jsonl").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["models", "inspect", "toy-base", "--dtype", "int3"], "bad --device"),
        (["models", "inspect", "./no/such/model"], "does not exist"),
        (["toy", "train", "--kind", "cnn", "--out", "x"], "use diff, diff2 or base"),
        (["toy", "export", "--work", "/no/such/work", "--out", "x"], "/no/such/work"),
        (["toy", "plot", "no-equals-sign"], "NAME=LOSS_CSV"),
        (["toy", "plot", "a=/no/such/log.csv"], "/no/such/log.csv"),
        (["report", "/no/such/run"], "neither a run folder"),
        (["report", "RUN", "--format", "pdf"], "bad --format"),
        (["compare", "/no/such/run", "RUN"], "neither a run folder"),
        (["compare", "RUN", "RUN", "--max-drop", "x"], "Invalid value"),
        (["run", "suite", "no-such-suite"], "not found"),
        (["run", "suite", "BAD_SUITE"], "needs a `tasks:` list"),
        (["run", "needle", "--backend", "nope"], "unknown --backend 'nope'"),
        (["run", "needle", "--samples", "0"], "at least 1 sample"),
        (["run", "icl", "--dataset", "mnist"], "unknown dataset"),
        (["run", "icl", "--shots", "ten"], "bad --shots"),
        (["run", "attention", "--rows", "every"], "bad --rows"),
        (["run", "hallucination", "--dataset", "xsum"], "--judge is required"),
        (["run", "hallucination", "--judge", "magic"], "bad --judge"),
        (["run", "outliers", "--tokens", "lots"], "bad context length"),
        (["run", "quantize", "--bits", "1"], "use widths from 2 to 16"),
        (["run", "zeroshot", "--include-path", "/no/such/yamls"], "not a folder of lm-eval task YAMLs"),
    ],
)
def test_every_command_validates_at_the_edge(args, message, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(TOY_PAIR, folder)
    suite = tmp_path / "suite.yaml"
    suite.write_text("suite: broken\ntasks: needle\n")
    args = [str(folder) if a == "RUN" else str(suite) if a == "BAD_SUITE" else a for a in args]
    if args[0] == "run" and args[1] != "suite":
        args += ["--out", str(tmp_path / "new")]
    before = _snapshot(folder)
    assert_one_line(run_cli(*args), message)
    assert _snapshot(folder) == before


RUN_JSON_DAMAGE = {
    "truncated": lambda text: text[: len(text) // 2],
    "not_an_object": lambda text: "[1, 2, 3]\n",
    "no_config": lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "config"}),
    "unknown_task": lambda text: text.replace('"task": "needle"', '"task": "sudoku"'),
    "models_not_a_list": lambda text: json.dumps(
        {**json.loads(text), "config": {**json.loads(text)["config"], "models": 3}}
    ),
}


@pytest.mark.parametrize("damage", sorted(RUN_JSON_DAMAGE))
def test_damaged_run_json_is_one_line_for_report_compare_and_resume(damage, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(TOY_PAIR, folder)
    run_json = folder / "run.json"
    run_json.write_text(RUN_JSON_DAMAGE[damage](run_json.read_text()))
    before = _snapshot(folder)
    resume = ["run", "needle", "--ctx", "1k,2k,4k", "--needles", "1,2,4,6", "--queries", "1,2,2,2", "--samples", "20"]
    for args in (["report", str(folder)], ["compare", str(TOY_PAIR), str(folder)], [*resume, "--out", str(folder)]):
        result = run_cli(*args)
        expected = str(run_json) if damage != "unknown_task" else "unknown task 'sudoku'"
        if damage == "unknown_task" and args[0] == "run":  # resuming sees the folder's config is not this run's
            expected = "holds a run with a different config (max_new_tokens, task differ)"
        assert_one_line(result, expected)
    assert _snapshot(folder) == before


def test_overwrite_never_empties_a_folder_that_is_not_a_run(tmp_path):
    folder = tmp_path / "my-project"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    result = run_cli("run", "needle", "--ctx", "1k", "--samples", "1", "--out", str(folder), "--overwrite")
    assert_one_line(result, "is not a diffeval run folder (no run.json)")
    assert (folder / "notes.txt").read_text() == "keep me"
