"""Every option either takes effect or is refused: each option that names something (a model, a length, a dataset, a
judge, a backend, a rule, a metric or a file) is given, once, a value naming something absent, and the command must
answer in one line with exit 2. The table is checked against the command line itself, so an option of one of those
kinds added without an entry here fails `test_every_naming_option_has_an_entry`."""

from __future__ import annotations

import re
import shutil
from dataclasses import fields
from pathlib import Path

import pytest
from test_bad_input import assert_one_line

from conftest import run_cli_in_process as run_cli

REPO = Path(__file__).resolve().parents[1]
MISSING = "/nonexistent/diffeval-refusals"
PAIR = ["-m", "diff=toy-diff", "-m", "base=toy-base"]
NEEDLE = ["run", "needle", *PAIR, "--ctx", "1k", "--samples", "1", "--depths", "0"]
HALLUCINATION = ["run", "hallucination", *PAIR, "--ctx", "1k", "--samples", "1", "--judge", "overlap"]
MRCR = ["run", "mrcr", *PAIR, "--samples", "1", "--rendering", "plain"]
ICL = ["run", "icl", *PAIR, "--ctx", "1k", "--dataset", "trec", "--data-dir", "package:fixtures"]
PROBES = ("mk-niah", "mv-niah", "vt", "cwe", "nolima", "distractor-attention")

# (command, option) → (arguments that give that option a value naming something absent, what the one line says).
# `run *` stands for the options every task has (RunConfig's), given here to `run needle`. "{run}" is a real run
# folder (a copy of the committed toy pair), "{file}" a regular file, filled in by the test.
REFUSALS: dict[tuple[str, str], tuple[list[str], str]] = {
    ("run *", "--model"): (["run", "needle", "-m", f"diff={MISSING}", "--ctx", "1k"], "does not exist"),
    ("run *", "--config"): ([*NEEDLE, "--config", "no-such-preset"], "not found"),
    ("run *", "--backend"): ([*NEEDLE, "--backend", "bogus"], "unknown --backend 'bogus'"),
    ("run *", "--device"): ([*NEEDLE, "--device", "tpu"], "bad --device 'tpu'"),
    ("run *", "--dtype"): ([*NEEDLE, "--dtype", "float8"], "bad --dtype 'float8'"),
    ("run *", "--attn-impl"): ([*NEEDLE, "--attn-impl", "bogus"], "unknown --attn-impl 'bogus'"),
    ("run needle", "--ctx"): ([*NEEDLE[:-4], "--ctx", "128k", "--samples", "1"], "exceeds diff's max_position"),
    ("run needle", "--base-lengths"): ([*NEEDLE, "--ctx", "1k,2k", "--base-lengths", "8k"], "--base-lengths 8K"),
    ("run needle", "--haystack"): ([*NEEDLE, "--haystack", f"essays:{MISSING}"], MISSING),
    ("run attention", "--rows"): (["run", "attention", *PAIR, "--rows", "bogus"], "bad --rows 'bogus'"),
    ("run attention", "--span"): (["run", "attention", *PAIR, "--span", "bogus"], "bad --span 'bogus'"),
    ("run attention", "--base-lengths"): (
        ["run", "attention", *PAIR, "--ctx", "1k", "--base-lengths", "2k"],
        "--base-lengths 2K",
    ),
    ("run attention", "--haystack"): (["run", "attention", *PAIR, "--haystack", "bogus"], "haystack"),
    ("run icl", "--dataset"): ([*ICL, "--dataset", "bogus"], "bogus"),
    ("run icl", "--data-dir"): ([*ICL, "--data-dir", MISSING], MISSING),
    ("run icl", "--test-indices"): ([*ICL, "--test-indices", MISSING], MISSING),
    ("run icl", "--length-norm"): ([*ICL, "--length-norm", "bogus"], "bogus"),
    ("run hallucination", "--dataset"): ([*HALLUCINATION, "--dataset", "bogus"], "unknown dataset"),
    ("run hallucination", "--judge"): ([*HALLUCINATION[:-2], "--judge", "bogus"], "bogus"),
    ("run hallucination", "--judge-backend"): (
        [*HALLUCINATION, "--judge-backend", "bogus"],
        "unknown --judge-backend 'bogus'",
    ),
    ("run hallucination", "--data-dir"): ([*HALLUCINATION, "--data-dir", MISSING], MISSING),
    ("run mrcr", "--ctx"): ([*MRCR, "--ctx", "128k"], "exceeds diff's max_position"),
    ("run mrcr", "--data-dir"): ([*MRCR, "--source", "openai", "--data-dir", MISSING], MISSING),
    ("run mrcr", "--replies"): ([*MRCR, "--replies", f"essays:{MISSING}"], MISSING),
    ("run hallucination", "--judge-cache"): ([*HALLUCINATION, "--judge-cache", "{file}"], "--judge-cache"),
    ("run graphwalks", "--data-dir"): (
        ["run", "graphwalks", *PAIR, "--ctx", "1k", "--source", "openai", "--data-dir", MISSING],
        MISSING,
    ),
    ("run outliers", "--haystack"): (["run", "outliers", *PAIR, "--haystack", f"essays:{MISSING}"], MISSING),
    ("run nll", "--ctx"): (["run", "nll", *PAIR, "--ctx", "128k"], "exceeds diff's max_position"),
    ("run nll", "--data-dir"): (["run", "nll", *PAIR, "--data-dir", MISSING], MISSING),
    ("run longbench2", "--data-dir"): (["run", "longbench2", *PAIR, "--data-dir", MISSING], MISSING),
    ("run distractor-attention", "--probe"): (["run", "distractor-attention", *PAIR, "--probe", "bogus"], "bogus"),
    ("run nolima", "--needle-set"): (["run", "nolima", *PAIR, "--ctx", "1k", "--needle-set", MISSING], MISSING),
    ("run quantize", "--tasks"): (["run", "quantize", *PAIR, "--tasks", "no_such_lm_task"], "no_such_lm_task"),
    ("run quantize", "--include-path"): (["run", "quantize", *PAIR, "--include-path", MISSING], MISSING),
    ("run quantize", "--granularity"): (["run", "quantize", *PAIR, "--granularity", "bogus"], "bad --granularity"),
    ("run zeroshot", "--tasks"): (["run", "zeroshot", *PAIR, "--tasks", "no_such_lm_task"], "no_such_lm_task"),
    ("run zeroshot", "--include-path"): (["run", "zeroshot", *PAIR, "--include-path", MISSING], MISSING),
    ("run suite", "preset"): (["run", "suite", "no-such-suite"], "not found"),
    ("run suite", "--model"): (["run", "suite", "ci-smoke", "-m", f"diff={MISSING}"], "does not exist"),
    ("run suite", "--backend"): (["run", "suite", "ci-smoke", "--backend", "bogus"], "unknown --backend 'bogus'"),
    ("run suite", "--device"): (["run", "suite", "ci-smoke", "--device", "tpu"], "bad --device 'tpu'"),
    ("run suite", "--fail-under"): (["run", "suite", "ci-smoke", "--fail-under", "bogus"], "--fail-under"),
    ("report", "run_dirs"): (["report", MISSING], MISSING),
    ("report", "--format"): (["report", "{run}", "--format", "bogus"], "bogus"),
    ("report", "--scoring"): (["report", "{run}", "--scoring", "bogus"], "bogus"),
    ("report", "--fail-under"): (["report", "{run}", "--fail-under", "needle.no_such_metric@diff=0.5"], "no_such"),
    ("compare", "old"): (["compare", MISSING, "{run}"], MISSING),
    ("compare", "new"): (["compare", "{run}", MISSING], MISSING),
    ("view", "run_dirs"): (["view", MISSING], MISSING),
    ("models inspect", "spec"): (["models", "inspect", MISSING], "does not exist"),
    ("models inspect", "--device"): (["models", "inspect", "toy-diff", "--device", "tpu"], "bad --device 'tpu'"),
    ("models inspect", "--dtype"): (["models", "inspect", "toy-diff", "--dtype", "float8"], "float8"),
    ("models convert", "src"): (["models", "convert", MISSING, "{tmp}/dst", "--from", "unilm-v2"], MISSING),
    ("models convert", "--from"): (["models", "convert", "{run}", "{tmp}/dst", "--from", "bogus"], "bogus"),
    ("toy train", "--kind"): (["toy", "train", "--kind", "bogus", "--out", "{tmp}/toy"], "use diff, diff2 or base"),
    ("toy export", "--work"): (["toy", "export", "--work", MISSING, "--out", "{tmp}/toy"], MISSING),
    ("toy plot", "logs"): (["toy", "plot", f"toy-diff={MISSING}.csv", "--out", "{tmp}/loss.png"], MISSING),
}
# every task's --ctx: a length beyond the models' positions (the toy pair's 64K)
REFUSALS |= {
    (f"run {task}", "--ctx"): (["run", task, *PAIR, *extra, "--ctx", "128k"], "exceeds diff's max_position")
    for task, extra in {
        "attention": [],
        "icl": ICL[8:],
        "hallucination": ["--judge", "overlap"],
        "outliers": [],
        "quantize": [],
        "zeroshot": [],
        "longbench2": ["--data-dir", "package:fixtures"],
        "graphwalks": [],
        **{probe: [] for probe in PROBES},
    }.items()
}
# the probes' lengths and haystacks, as needle's
REFUSALS |= {
    (f"run {task}", "--base-lengths"): (["run", task, *PAIR, "--ctx", "1k,2k", "--base-lengths", "8k"],
                                        "--base-lengths 8K")
    for task in PROBES
}  # fmt: skip
REFUSALS |= {
    (f"run {task}", "--haystack"): (["run", task, *PAIR, "--ctx", "1k", "--haystack", f"essays:{MISSING}"], MISSING)
    for task in PROBES
    if task != "cwe"
}

# option names that name something a run reads (the kinds above); destinations a command writes are not among them
NAMING = re.compile(
    r"^(--)?(model|spec|ctx|base-lengths|haystack|dataset|data-dir|test-indices|tasks|include-path|judge|"
    r"judge-backend|judge-cache|backend|device|dtype|attn-impl|from|kind|scoring|length-norm|granularity|rows|span|"
    r"format|fail-under|config|preset|src|logs|run_dirs|old|new|work|needle-set|probe)$"
)
DESTINATIONS = {("toy train", "--work")}  # written, not read


def _cli_options() -> set[tuple[str, str]]:
    """(command, option) for every command of the CLI; a RunConfig option of a task command counts as `run *`."""
    import typer

    from diffeval.cli import app
    from diffeval.config import RunConfig

    run_flags = {"--model", "--config"} | {
        (f.metadata["flag"] or "--" + f.name.replace("_", "-")).split("/")[0] for f in fields(RunConfig) if f.metadata
    }
    found = set()

    def walk(command, path: str) -> None:
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}".strip())
        for param in [] if hasattr(command, "commands") else command.params:
            flag = next((o for o in param.opts if o.startswith("--")), param.name)
            shared = path.startswith("run ") and path != "run suite" and flag in run_flags
            found.add(("run *" if shared else path, flag))

    walk(typer.main.get_command(app), "")
    return found


def test_every_naming_option_has_an_entry():
    naming = {(cmd, opt) for cmd, opt in _cli_options() if NAMING.match(opt) and (cmd, opt) not in DESTINATIONS}
    assert naming - set(REFUSALS) == set(), "options that name something, without a refusal entry"
    assert set(REFUSALS) - _cli_options() == set(), "entries for options the command line does not have"


@pytest.fixture(scope="module")
def places(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("refusals")
    run = root / "run"
    shutil.copytree(REPO / "results" / "toy-pair", run)
    (root / "a-file").write_text("not a folder\n")
    return {"run": str(run), "file": str(root / "a-file"), "tmp": str(root)}


# slow: a lm-eval task name is checked against lm-eval's task index, which takes lm-eval many seconds to build
@pytest.mark.parametrize(
    "entry",
    [pytest.param(e, marks=pytest.mark.slow) if e[1] == "--tasks" else e for e in sorted(REFUSALS)],
    ids=lambda e: f"{e[0]} {e[1]}",
)
def test_a_value_naming_something_absent_is_refused(entry, places, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # run folders of refused runs would land here: there must be none
    args, message = REFUSALS[entry]
    args = [a.format(**places) for a in args]
    if entry[0] in ("run quantize", "run zeroshot"):
        pytest.importorskip("lm_eval", reason="the lm-eval tasks need the [lmeval] extra")
    before = {p: p.read_bytes() for p in Path(places["run"]).rglob("*") if p.is_file()}
    assert_one_line(run_cli(*args), message.format(**places))
    assert not (tmp_path / "results").exists(), "a refused run created a run folder"
    assert {p: p.read_bytes() for p in Path(places["run"]).rglob("*") if p.is_file()} == before


def test_the_refusal_table_names_real_options():
    """Each entry's arguments use the option it is about (so the table cannot drift from what it tests)."""
    for (command, option), (args, _) in REFUSALS.items():
        if option.startswith("--"):
            assert option in args or (option == "--model" and "-m" in args), (command, option)


PAGES = {"run": "run", "report": "report", "compare": "compare", "view": "view", "models": "models", "toy": "toy"}
METAVARS = {"run_dirs": "RUN_DIR…", "spec": "PATH_OR_HUB_ID", "src": "SRC", "old": "OLD", "new": "NEW", "logs": "NAME="}


def _refusal_tables(page: str) -> str:
    """The text of every `### What it refuses` section of a docs/cli page."""
    text = (REPO / "docs" / "cli" / f"{page}.md").read_text()
    return "\n".join(part.split("\n## ")[0].split("\n### ")[0] for part in text.split("### What it refuses")[1:])


def test_every_refusal_is_in_its_commands_docs_table():
    for command, option in REFUSALS:
        if command == "run suite" and option != "preset":
            continue  # the suite's page says it refuses what each task refuses
        tables = _refusal_tables(PAGES[command.split()[0]])
        shown = METAVARS.get(option, option)
        assert shown in tables or option == "preset" and "not found" in tables, (command, option)
