"""The real CLI end to end on tiny checkpoints: runs, tables, resume, and one-line errors for bad input."""

import dataclasses
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import pair_options, run_cli, run_cli_in_process


def _records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines() if line.strip()]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


FINISHED_RUN_OPTIONS = [
    "--ctx",
    "1k,2k",
    "--needles",
    "1,2",
    "--queries",
    "1,2",
    "--depths",
    "0,50,100",
    "--samples",
    "2",
]


@pytest.fixture(scope="module")
def finished_run(tiny_models, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "finished"
    result = run_cli(
        "run",
        "needle",
        *pair_options(tiny_models),
        *FINISHED_RUN_OPTIONS,
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    return out


@pytest.mark.slow
def test_run_writes_records_summary_and_tables(finished_run):
    records = _records(finished_run)
    assert len(records) == 2 * (2 * 2 * 3 * 2)  # models × (ctx × N/R × depths × samples)
    required = {
        "model",
        "sample_id",
        "ctx",
        "prompt_tokens",
        "depth",
        "needles",
        "queries",
        "expected",
        "output",
        "score",
        "correct",
        "seconds",
    }
    assert all(required <= set(r) for r in records)
    by_sample = {}
    for r in records:
        assert 0.99 * r["ctx"] <= r["prompt_tokens"] + r["max_new_tokens"] <= r["ctx"] and r["max_new_tokens"] >= 32
        by_sample.setdefault(r["sample_id"], []).append(r)
    for pair in by_sample.values():  # the same sample pairs across models with identical content
        assert {r["model"] for r in pair} == {"diff", "base"}
        assert pair[0]["cities"] == pair[1]["cities"] and pair[0]["numbers"] == pair[1]["numbers"]
    run = json.loads((finished_run / "run.json").read_text())
    assert run["models"]["diff"]["is_diff"] and not run["models"]["base"]["is_diff"]
    assert {"diffeval", "torch", "transformers"} <= set(run["versions"])
    summary = (finished_run / "summary.csv").read_text().splitlines()
    assert summary[0] == "model,ctx,depth,needles,queries,n,accuracy,ci_low,ci_high"
    assert len(summary) == 1 + 2 * 2 * 3 * 2
    table = (finished_run / "table.md").read_text()
    assert "1K N/R=1/1" in table and "2K N/R=2/2" in table and "Depth x length grid [scoring: default] (diff)" in table


@pytest.mark.slow
def test_report_formats(finished_run):
    result = run_cli("report", str(finished_run), "--format", "md,csv,latex")
    assert result.returncode == 0, result.stderr
    assert "\\begin{tabular}" in (finished_run / "table.tex").read_text()
    assert (finished_run / "table2.csv").read_text().startswith("model,")
    assert "| diff" in result.stdout


@pytest.mark.slow
def test_report_rescores_stored_outputs_by_rule(finished_run, tmp_path):
    result = run_cli("report", str(finished_run), "--scoring", "ruler", "--out", str(tmp_path / "ruler"))
    assert result.returncode == 0, result.stderr
    table = (tmp_path / "ruler" / finished_run.name / "table.md").read_text()
    assert "Scoring rule 'ruler': RULER's string_match_all" in table and "[scoring: ruler]" in table
    assert "Answers: accuracy, outputs naming unqueried needles' numbers" in table
    bad = run_cli("report", str(finished_run), "--scoring", "exact", "--out", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "task needle scores by default, ruler" in bad.stderr


@pytest.mark.slow
def test_report_uses_complete_lines_of_a_damaged_file(finished_run, tmp_path):
    copy = tmp_path / "damaged"
    copy.mkdir()
    for name in ("run.json", "samples.jsonl"):
        (copy / name).write_bytes((finished_run / name).read_bytes())
    with (copy / "samples.jsonl").open("a") as handle:
        handle.write('{"model": "diff", "sample_id": "trunc')
    result = run_cli("report", str(copy))
    assert result.returncode == 0, result.stderr
    assert "skipped 1 damaged line" in result.stderr


@pytest.mark.slow
def test_models_inspect_shows_diff_lambdas(tiny_models):
    result = run_cli("models", "inspect", str(tiny_models["diff"]))
    assert result.returncode == 0, result.stderr
    for text in ("DiffLlamaForCausalLM", "yes", "λ_init", "0.2000", "KV heads", "RoPE base", "parameters"):
        assert text in result.stdout
    base = run_cli("models", "inspect", str(tiny_models["base"]))
    assert "no (baseline)" in base.stdout and "λ_init" not in base.stdout


@pytest.mark.slow
def test_preset_with_flag_override(tiny_models, tmp_path):
    out = tmp_path / "preset"
    result = run_cli(
        "run",
        "needle",
        "--config",
        "needle-4k-table2",
        "-m",
        f"base={tiny_models['base']}",
        "--ctx",
        "1k",
        "--limit",
        "1",
        "--depths",
        "50",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    assert sorted({(r["needles"], r["queries"]) for r in _records(out)}) == [(1, 1), (2, 2), (4, 2), (6, 2)]


@pytest.mark.slow
def test_resume_after_kill_loses_and_duplicates_nothing(tiny_models, tmp_path):
    out = tmp_path / "resume"
    args = [
        "run",
        "needle",
        *pair_options(tiny_models),
        "--ctx",
        "1k",
        "--depths",
        "0,50,100",
        "--samples",
        "6",
        "--out",
        str(out),
    ]
    process = subprocess.Popen(
        [sys.executable, "-m", "diffeval", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    samples = out / "samples.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and (not samples.exists() or samples.read_text().count("\n") < 5):
        time.sleep(0.1)
    process.send_signal(signal.SIGKILL)
    process.wait()
    before = _records(out)
    assert 5 <= len(before) < 36
    with samples.open("a") as handle:  # what a kill mid-write leaves behind
        handle.write('{"model": "diff", "sample_id": "partial')
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    after = _records(out)
    keys = [(r["model"], r["sample_id"]) for r in after]
    assert len(keys) == len(set(keys)) == 36
    assert after[: len(before)] == before  # nothing computed earlier was rewritten


@pytest.mark.slow
def test_more_samples_extend_a_run(tiny_models, tmp_path):
    out = tmp_path / "extend"
    base = ["run", "needle", "-m", f"base={tiny_models['base']}", "--ctx", "1k", "--depths", "50", "--out", str(out)]
    assert run_cli(*base, "--samples", "1").returncode == 0
    assert run_cli(*base, "--samples", "3").returncode == 0
    assert len(_records(out)) == 3


BAD_INPUTS = [
    (["--ctx", "4x"], "bad context length"),
    (["--needles", "2", "--queries", "3"], "need 1 <= R <= N"),
    (["--depths", "0,120"], "outside 0-100"),
    (["-m", "ghost=/no/such/model"], "does not exist"),
    (["--haystack", "essays:/no/such/dir"], "does not exist"),
    (["--ctx", "4k", "-m", "small=BASE_A"], "exceeds small's max_position_embeddings 2048"),
    (["--seed", "3"], "holds a run with a different config"),
    (["--samples", "many"], "Invalid value for '--samples'"),
    (["--config", "BAD_YAML"], "malformed YAML"),
    (["--config", "no-such-preset"], "not found"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("extra", "message"), BAD_INPUTS)
def test_bad_input_is_one_line_exit_2_and_keeps_results(finished_run, tiny_models, tmp_path, extra, message):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("ctx: [4k\nneedles: 2\n")
    extra = [str(bad_yaml) if e == "BAD_YAML" else e.replace("BASE_A", str(tiny_models["base_a"])) for e in extra]
    models = (
        []
        if any(e.startswith("ghost=") or e.startswith("small=") for e in extra)
        else ["-m", f"diff={tiny_models['diff']}", "-m", f"base={tiny_models['base']}"]
    )
    before = _snapshot(finished_run)
    result = run_cli(
        "run",
        "needle",
        *models,
        *FINISHED_RUN_OPTIONS,
        "--out",
        str(finished_run),
        *extra,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert _snapshot(finished_run) == before


def _commands(group, path=()):
    """Every leaf command of the CLI with its words, e.g. ("run", "needle")."""
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name), command


def _option_blocks(help_text: str) -> dict[str, str]:
    """`--help`'s options section as {each option name: its whole entry, names and wrapped help}."""
    blocks, current = {}, []
    for line in help_text.split("Options:", 1)[1].splitlines():
        if re.match(r"  -", line):
            current = [line]
            for name in re.findall(r"--?[\w…-]+", line[2:].split("  ")[0]):  # the names before the help column
                blocks[name] = current
        elif current:
            current.append(line)
    return {name: " ".join(" ".join(lines).split()) for name, lines in blocks.items()}


def test_help_is_readable_at_80_columns_with_every_default(monkeypatch):
    """Every command's --help at 80 columns: each option's names whole, and a default on each option that has one
    (a declared field's value for `run`'s options, which all default to None so that presets can supply them)."""
    import typer

    from diffeval.cli import app
    from diffeval.config import RunConfig, field_default
    from diffeval.tasks import TASKS

    monkeypatch.setenv("COLUMNS", "80")
    fields = {f.name: f for cls in (RunConfig, *(t.options for t in TASKS.values())) for f in dataclasses.fields(cls)}
    commands = dict(_commands(typer.main.get_command(app)))
    expected = {("run", "needle"), ("run", "suite"), ("models", "inspect"), ("toy", "train"), ("report",), ("view",)}
    assert expected <= set(commands)
    for path, command in commands.items():
        result = run_cli_in_process(*path, "--help")
        assert result.returncode == 0, result.stderr
        assert all(len(line) <= 80 for line in result.stdout.splitlines()), path
        # values shown by name (--out OUT), not by Python type (<str>)
        assert not re.findall(r"<(?:str|int|float|path|list\[\w+\])>", result.stdout), path
        blocks = _option_blocks(result.stdout)
        assert not [name for name in blocks if "…" in name], path
        for param in command.params:
            if param.param_type_name != "option":
                continue
            assert set(param.opts + param.secondary_opts) <= set(blocks), (path, param.opts)
            field = fields.get(param.name) if path[0] == "run" else None
            if field is not None:  # off switches included: `run`'s flags can also be set by a preset
                has_default = field_default(field) not in (None, [])
            else:  # click shows no default for an off switch, and `--paper` alone says what it turns on
                has_default = param.default not in (None, False) and not param.required
            if has_default:
                assert "[default: " in blocks[param.opts[0]], (path, blocks[param.opts[0]])


def test_version_and_choices_in_help():
    import diffeval

    result = run_cli_in_process("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"diffeval {diffeval.__version__}"
    assert "--backend hf|vllm" in run_cli_in_process("run", "needle", "--help").stdout


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # quantize counts no samples: its own options are named, not a look-alike of another command's
        (["run", "quantize", "--samples", "4"], "its own options are --ctx, --include-path, --lm-batch-size, --bits"),
        (["run", "needle", "--sample", "3"], "did you mean --samples?"),
        (["report", "--formats", "md"], "did you mean --format?"),
    ],
)
def test_an_unknown_option_names_the_commands_own(args, expected):
    result = run_cli_in_process(*args)
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: No such option: {args[2] if args[0] == 'run' else args[1]} (")
    assert expected in line and "--attn-impl" not in line and line.endswith("--help")
