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


def assert_refused_in_place(cwd: Path, args: list[str], message: str, kept: tuple[Path, ...] = ()) -> None:
    """The command, run in `cwd`, is refused in one line (exit 2), creates no run folder under `cwd`/results, and
    leaves every folder of `kept` (run folders it was pointed at, data it read) byte-identical."""
    import contextlib

    results = cwd / "results"
    folders = set(results.iterdir()) if results.is_dir() else set()
    before = {folder: _snapshot(folder) for folder in kept}
    with contextlib.chdir(cwd):
        result = run_cli(*args)
    assert_one_line(result, message)
    assert (set(results.iterdir()) if results.is_dir() else set()) == folders, "a refused run created a run folder"
    for folder, files in before.items():
        assert _snapshot(folder) == files, f"a refused command changed {folder}"


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
        (["run", "icl", "--max-new-tokens", "5"], "No such option: --max-new-tokens"),  # ICL generates nothing
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


def _without(folder: Path, dest: Path, drop) -> Path:
    """A copy of a checkpoint folder whose weights lack the tensors `drop(name)` selects."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(folder, dest)
    tensors = load_file(folder / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if not drop(k)}, dest / "model.safetensors", metadata={"format": "pt"})
    return dest


@pytest.fixture(scope="module")
def layout_checkpoints(tiny_models, tmp_path_factory) -> dict[str, Path]:
    """Checkpoints whose configs or weights the check stage must refuse before any work."""
    from diffeval.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("layouts")
    v2 = root / "v2"
    build_tiny_model("diff2", tiny_models["tok_a"], v2, seed=5, heads=4, kv_heads=2)
    # consistent weights for the config, but 6 query heads cannot share 4 KV heads: the first forward would crash
    build_tiny_model("diff", tiny_models["tok_a"], root / "heads_6_over_4", seed=6, heads=6, kv_heads=4, head_dim=16)
    return {
        "no_lambda": _without(
            tiny_models["diff"], root / "no_lambda", lambda n: n.endswith("layers.0.self_attn.lambda_q1")
        ),
        "no_lambda_proj": _without(v2, root / "no_lambda_proj", lambda n: ".lambda_proj." in n),
        "heads_6_over_4": root / "heads_6_over_4",
    }


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("no_lambda", "missing model.layers.0.self_attn.lambda_q1"),
        ("no_lambda_proj", "without its λ projections"),
        ("heads_6_over_4", "has a head layout its architecture cannot compute"),
    ],
)
def test_models_inspect_checks_the_weights_before_it_prints_lambda(layout_checkpoints, damage, message):
    """inspect runs `run`'s check stage: no λ table from randomly initialised tensors."""
    result = run_cli("models", "inspect", str(layout_checkpoints[damage]))
    assert_one_line(result, message)
    assert "λ" not in result.stdout and "LOAD REPORT" not in result.stderr


@pytest.mark.parametrize("order", ["bad_second", "bad_first"])
def test_no_model_runs_until_every_model_passes(tiny_models, layout_checkpoints, tmp_path, order):
    """A head layout that cannot compute is refused before the good model writes a record, in either order."""
    good, bad = f"good={tiny_models['diff']}", f"bad={layout_checkpoints['heads_6_over_4']}"
    models = [good, bad] if order == "bad_second" else [bad, good]
    out = tmp_path / "out"
    args = ["run", "needle", "-m", models[0], "-m", models[1], "--ctx", "256", "--samples", "1", "--depths", "0"]
    assert_one_line(run_cli(*args, "--out", str(out)), "model bad: the config.json")
    assert not out.exists()


def test_a_config_that_does_not_build_keeps_its_reason(tiny_models, tmp_path):
    folder = tmp_path / "odd_kv"
    shutil.copytree(tiny_models["diff"], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 3}))
    assert_one_line(run_cli("models", "inspect", str(folder)), "requires `num_key_value_heads` to be even")


def test_transformers_load_report_stays_off_the_terminal(layout_checkpoints, capfd):
    """Loading past the check stage (the library call) still prints no transformers load report."""
    from diffeval.models.checkpoints.loading import load_model
    from diffeval.models.spec import ModelSpec

    load_model(ModelSpec.parse(f"m={layout_checkpoints['no_lambda']}"), "cpu")
    captured = capfd.readouterr()
    assert "LOAD REPORT" not in captured.err + captured.out


def test_a_suite_runs_no_task_until_every_task_passes_its_checks(tmp_path):
    """The second task's data is missing: the first task, whose inputs are fine, must not have run."""
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "suite: two\ntasks:\n  - task: needle\n    ctx: 1k\n    samples: 1\n    depths: [0]\n"
        "  - task: icl\n    ctx: 1k\n    datasets: [trec]\n    data_dir: /no/such/icl-data\n"
    )
    out = tmp_path / "suite-out"
    assert_one_line(run_cli("run", "suite", str(suite), "--out", str(out)), "/no/such/icl-data")
    assert not list(out.rglob("samples.jsonl"))


def test_toy_plot_refuses_a_csv_that_is_not_a_training_log(tmp_path):
    """A CSV without the log's columns (here a run's summary) is one line, before anything is drawn."""
    out = tmp_path / "loss.png"
    result = run_cli("toy", "plot", f"pair={TOY_PAIR / 'summary.csv'}", "--out", str(out))
    assert_one_line(result, "has no column step, length, loss, answer_loss")
    assert not out.exists()


def test_a_preset_giving_max_new_tokens_to_a_task_that_does_not_generate_free_text_is_refused(tmp_path):
    preset = tmp_path / "preset.yaml"
    preset.write_text("max_new_tokens: 5\n")
    out = tmp_path / "out"
    result = run_cli("run", "hallucination", "--config", str(preset), "--judge", "overlap", "--out", str(out))
    assert_one_line(result, "--max-new-tokens does not apply to hallucination, only to needle, attention")
