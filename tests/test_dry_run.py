"""`--dry-run` sizes a run cheaply and tells the time: the needle task's token totals come from the haystack's per-word
token counts and one exact fit per length, within 1 % of fitting every prompt; the time estimate comes from
--tokens-per-s, --calibrate's timing of one sample per length, or the throughput earlier run folders of the same
models recorded on this machine (same CPU, cores, GPUs, engine and threads) at about the same prompt size, and says
which."""

import io
import json
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path
from types import SimpleNamespace
from unittest.mock import ANY

import pytest
from rich.console import Console

from conftest import pair_options, run_cli
from conftest import run_cli_in_process as run_cli_fast
from diffeval import estimate, speed
from diffeval.machine import machine_record
from diffeval.models.backend import EngineSettings, open_tokenizer
from diffeval.models.spec import model_path
from diffeval.models.tokenizer import PromptTokenizer
from diffeval.tasks import TASKS, build_config
from diffeval.tasks.base import RunContext
from diffeval.tasks.haystack import needle, recipe


class CountingTokenizer(PromptTokenizer):
    """A model's real tokenizer that counts the long texts it encodes (those of at least `long_chars` characters)."""

    def __init__(self, tokenizer: PromptTokenizer, long_chars: int):
        super().__init__(tokenizer.tokenizer, tokenizer.name)
        self.long_chars, self.long_encodes = long_chars, 0

    def encode(self, text: str, special_tokens: bool = True):
        self.long_encodes += len(text) >= self.long_chars
        return super().encode(text, special_tokens)


@pytest.fixture(scope="module")
def essays(tmp_path_factory) -> Path:
    """Real prose as an essays haystack: diffeval's own Markdown files, one .txt each."""
    folder = tmp_path_factory.mktemp("essays")
    for i, page in enumerate(sorted(Path(str(resources.files("diffeval"))).rglob("*.md"))):
        (folder / f"{i}.txt").write_text(page.read_text(encoding="utf-8"), encoding="utf-8")
    return folder


@pytest.mark.parametrize("haystack", ["noise", "essays"])
def test_cheap_sizing_is_within_one_percent_of_fitting_every_prompt(tiny_models, essays, haystack):
    source = "noise" if haystack == "noise" else f"essays:{essays}"
    flags = {"ctx": "1k,2k", "needles": "1,4", "queries": "1,2", "depths": "0,50,100", "samples": 3}
    config = build_config("needle", {"haystack": source}, {**flags, "models": pair_options(tiny_models)[1::2]})
    samples = needle.TASK.running.make_samples(config.options, config.seed)
    settings = EngineSettings.from_config(config)
    for spec in config.models:  # two tokenizers: different vocabularies and merges
        tokenizer = PromptTokenizer(open_tokenizer(spec, settings), spec.name)
        exact_tokenizer, cheap_tokenizer = CountingTokenizer(tokenizer, 1200), CountingTokenizer(tokenizer, 1200)
        fitted = [
            (recipe.fitted_prompt(needle.RECIPE, sample, exact_tokenizer, config),
             needle.token_limit(sample, exact_tokenizer, config)) for sample in samples
        ]  # fmt: skip
        exact = sum(len(prompt.ids) for prompt, _ in fitted), sum(limit for _, limit in fitted)
        cheap = needle.TASK.running.sizing(samples, cheap_tokenizer, config)
        assert cheap[1] == exact[1]  # the token limits are computed, not estimated
        assert abs(cheap[0] - exact[0]) <= 0.01 * exact[0], (spec.name, haystack, cheap, exact)
        # fitting encodes each sample's whole prompt at least once; sizing one stream and one fit per length (a fit
        # is one encoding, or a few where it searches); the fixed parts (instruction, needles, question) are short
        assert len(samples) == 36 and exact_tokenizer.long_encodes >= 36, (spec.name, exact_tokenizer.long_encodes)
        assert cheap_tokenizer.long_encodes <= 2 * 8, (spec.name, cheap_tokenizer.long_encodes)


def _table(stdout: str) -> dict[str, list[str]]:
    """The dry run's table rows by model: samples, done, prompt tokens, generated tokens, time, source (a cell that
    wraps onto the row's next lines joined again)."""
    rows: dict[str, list[str]] = {}
    row: list[str] = []
    for line in stdout.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if len(cells) == 7 and cells[1].replace(",", "").isdigit():
            row = rows[cells[0]] = cells[1:]
        elif len(cells) == 7 and not cells[0] and row:
            row[:] = [f"{old} {more}" if more else old for old, more in zip(row, cells[1:])]
        else:
            row = []
    return rows


def _notes(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if "time estimate" in line]


def _tokens(cells: list[str]) -> int:
    return int(cells[2].replace(",", "")) + int(cells[3].replace(",", ""))


SMALL = ["--ctx", "512", "--needles", "1", "--queries", "1", "--depths", "50"]


def test_time_estimate_from_tokens_per_s(tiny_models, tmp_path):
    result = run_cli_fast(
        "run", "needle", *pair_options(tiny_models), *SMALL, "--samples", "4", "--out", str(tmp_path / "run"),
        "--dry-run", "--tokens-per-s", "100",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = _table(result.stdout)
    assert set(rows) == {"diff", "base"}
    for cells in rows.values():
        assert cells[:2] == ["4", "0"]
        assert 4 * 0.99 * 512 <= _tokens(cells) <= 4 * 512
        assert cells[4] == f"{_tokens(cells) / 100:.0f} s" and cells[5] == "--tokens-per-s"
    assert _notes(result.stdout) == ["time estimate from --tokens-per-s 100"]  # one line: it holds for both models
    assert not (tmp_path / "run").exists()  # a dry run writes nothing


def _recorded(folder: Path, model: str) -> tuple[int, float, int]:
    rows = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    mine = [r for r in rows if r["model"] == model]
    return sum(r["prompt_tokens"] + r["new_tokens"] for r in mine), sum(r["seconds"] for r in mine), len(mine)


def _this_machine(threads: int = 1) -> str:
    return estimate._describe(machine_record("hf", threads))


@pytest.mark.slow
def test_time_estimate_from_an_earlier_run_folder(tiny_models, tmp_path):
    runs = tmp_path / "results"
    earlier = {ctx: runs / f"needle-{ctx}" for ctx in ("256", "1024")}
    for ctx, folder in earlier.items():
        args = ["--ctx", ctx, "--depths", "50", "--samples", "2", "--out", str(folder), "--threads", "1"]
        result = run_cli("run", "needle", *pair_options(tiny_models), *args)
        assert result.returncode == 0, result.stderr

    # a new run beside them: each model's rate from the records about the size of its samples
    for ctx, folder in earlier.items():
        result = run_cli_fast(
            "run", "needle", *pair_options(tiny_models), "--ctx", ctx, "--samples", "3", "--depths", "0,50",
            "--out", str(runs / "next"), "--dry-run", "--threads", "1",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        rows, notes = _table(result.stdout), _notes(result.stdout)
        assert len(notes) == 2
        for name, note in zip(("diff", "base"), notes):
            tokens, seconds, count = _recorded(folder, name)
            prompts = sum(r["prompt_tokens"] for r in _rows(folder) if r["model"] == name)
            rate = tokens / seconds
            assert note == (
                f"{name}: time estimate from runs on this machine ({_this_machine()}): {rate:,.0f} tokens/s recorded "
                f"in {folder} ({count} records of {prompts / count:,.0f} prompt tokens on average)"
            )
            cells = rows[name]
            assert cells[:2] == ["6", "0"] and cells[4] == f"{_tokens(cells) / rate:.0f} s"
            assert cells[5] == "runs on this machine"

    # records of another engine do not time this one: the config estimate, why no recorded rate, and how to get one
    for folder in earlier.values():
        run_json = json.loads((folder / "run.json").read_text())
        run_json["config"]["backend"] = "vllm"
        (folder / "run.json").write_text(json.dumps(run_json))
    result = run_cli_fast("run", "needle", *pair_options(tiny_models), *SMALL, "--out", str(runs / "next"), "--dry-run")
    assert result.returncode == 0, result.stderr
    assert all(_from_config(cells) for cells in _table(result.stdout).values())
    [note] = _notes(result.stdout)
    assert _why_not_recorded(note) == f"no run folder beside {runs / 'next'} records the speed of this checkpoint on hf"


def _from_config(cells: list[str]) -> bool:
    """A table row timed by the config estimate: a time, and the source with its measured accuracy."""
    return cells[4].endswith((" s", " min")) and cells[5].startswith("config: within ×")


def _why_not_recorded(note: str) -> str:
    """The reason a config estimate's note gives for not timing the run from earlier runs, the note's form checked:
    the matmul rate, the accuracy measured against real runs, and how to get a measured rate."""
    head, tail = "time estimate from the config and this machine's matmul rate (", "; for a measured one, "
    assert note.startswith(head) and " GFLOP/s float32 on cpu, " in note, note
    assert f"): {speed.CALIBRATION.accuracy()}. Earlier runs give no rate: " in note, note
    assert note.endswith(tail + estimate.HOW_TO_MEASURE), note
    return note.split("Earlier runs give no rate: ", 1)[1].removesuffix(tail + estimate.HOW_TO_MEASURE)


def _rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]


def _dry(tiny_models, out: Path, *args: str) -> tuple[dict[str, list[str]], list[str]]:
    result = run_cli_fast("run", "needle", *pair_options(tiny_models), *SMALL, "--out", str(out), "--dry-run", *args)
    assert result.returncode == 0, result.stderr
    return _table(result.stdout), [line for line in result.stdout.splitlines() if "time estimate" in line]


@pytest.mark.slow
def test_rates_come_only_from_runs_on_this_machine_with_these_threads(tiny_models, tmp_path):
    runs = tmp_path / "results"
    here, other = runs / "here", runs / "other"
    result = run_cli("run", "needle", *pair_options(tiny_models), *SMALL, "--samples", "2", "--out", str(here),
                     "--threads", "1")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads((here / "run.json").read_text())["machine"] == machine_record("hf", 1)
    # the same records, ten times faster, from a machine with more cores: never this machine's rate
    shutil.copytree(here, other)
    run_json = json.loads((other / "run.json").read_text())
    run_json["machine"]["cores"] += 62
    (other / "run.json").write_text(json.dumps(run_json))
    rows = [{**row, "seconds": row["seconds"] / 10} for row in _rows(other)]
    (other / "samples.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))

    table, notes = _dry(tiny_models, runs / "next", "--threads", "1")
    for name, note in zip(("diff", "base"), notes):
        tokens, seconds, _ = _recorded(here, name)
        assert f"{tokens / seconds:,.0f} tokens/s recorded in {here} (" in note and str(other) not in note, note

    # other threads, or a folder whose run.json records no machine (made before it did): no recorded rate, and why
    why = (
        f"the 2 run folder(s) beside {runs / 'next'} that time this checkpoint on hf ran on other hardware or threads, "
        f"or before run.json recorded the machine (this machine: {_this_machine(2)})"
    )
    table, [note] = _dry(tiny_models, runs / "next", "--threads", "2")
    assert _why_not_recorded(note) == why and all(_from_config(cells) for cells in table.values())
    assert "float32 on cpu, 2 threads, measured " in note
    run_json = json.loads((here / "run.json").read_text())
    (here / "run.json").write_text(json.dumps({k: v for k, v in run_json.items() if k != "machine"}))
    table, [note] = _dry(tiny_models, runs / "next", "--threads", "1")
    assert _why_not_recorded(note) == why.replace(_this_machine(2), _this_machine(1))


@pytest.mark.slow
def test_a_folder_resumed_with_other_threads_times_no_run(tiny_models, tmp_path):
    folder = tmp_path / "results" / "run"
    for samples, threads in (("1", "1"), ("2", "2")):
        result = run_cli("run", "needle", *pair_options(tiny_models), *SMALL, "--samples", samples, "--out",
                         str(folder), "--threads", threads)  # fmt: skip
        assert result.returncode == 0, result.stderr
    run_json = json.loads((folder / "run.json").read_text())
    assert run_json["machine"] == machine_record("hf", 2)
    assert run_json["earlier_machines"] == [machine_record("hf", 1)]  # its first records were timed on 1 thread
    _, notes = _dry(tiny_models, tmp_path / "results" / "next", "--threads", "2")
    assert len(notes) == 1 and "ran on other hardware or threads" in notes[0], notes


@pytest.mark.slow
def test_a_rate_recorded_at_another_prompt_size_is_not_used(tiny_models, tmp_path):
    runs = tmp_path / "results"
    result = run_cli("run", "needle", *pair_options(tiny_models), *SMALL, "--samples", "2", "--out",
                     str(runs / "short"), "--threads", "1")  # fmt: skip
    assert result.returncode == 0, result.stderr
    sizes = {row["prompt_tokens"] for row in _rows(runs / "short")}
    table, notes = _dry(tiny_models, runs / "next", "--threads", "1", "--ctx", "2k")
    assert all(_from_config(cells) for cells in table.values())
    assert [note.split(": ", 1)[0] for note in notes] == ["diff", "base"]  # each model's prompts have their own size
    for note in notes:
        why = _why_not_recorded(note.split(": ", 1)[1])
        assert why.startswith(f"runs on this machine time this checkpoint at prompts of {min(sizes):,}"), note
        assert "none within 1.25x of this run's 2," in why and why.endswith("(the rate falls as prompts grow)"), note


def test_the_committed_reference_run_no_longer_times_a_new_one(monkeypatch, tmp_path):
    """results/toy-pair was recorded on another machine, before run.json recorded machines: the README's quick start,
    dry-run from the repository, gets no estimate from it (it said 34 min, then 4 h 32 min, for the same command).
    The committed run folders are copied beside a fresh results/, so what a user's own runs left there (the quick
    start's own folder, done) plays no part."""
    root = Path(__file__).resolve().parents[1]
    listing = subprocess.run(["git", "ls-files", "results"], cwd=root, capture_output=True, text=True, check=True)
    for path in listing.stdout.splitlines():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / path, tmp_path / path)
    assert (tmp_path / "results" / "toy-pair" / "run.json").is_file()
    monkeypatch.chdir(tmp_path)
    result = run_cli_fast("run", "needle", "--ctx", "1k", "--needles", "1", "--queries", "1", "--samples", "20",
                          "--dry-run")  # fmt: skip
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stdout.splitlines() if "time estimate" in line]
    assert notes and all("results/toy-pair" not in note for note in notes), notes  # toy-pair is never a source
    if {cells[5] for cells in _table(result.stdout).values()} == {"runs on this machine"}:
        # the committed probe runs of the same pair (results/probes-toy, 1K prompts) time it on a machine like the
        # one that made them, with the same threads
        assert all("from runs on this machine" in note and "results/probes-toy" in note for note in notes), notes
        return
    # elsewhere: the config estimate; the committed nll runs time it only on the machine that made them, and at 8K
    # prompts, which a 1K run does not take a rate from
    assert all(_from_config(cells) for cells in _table(result.stdout).values())
    assert len(notes) == 1
    why = _why_not_recorded(notes[0])
    assert (
        "ran on other hardware or threads, or before run.json recorded the machine" in why
        or "none within 1.25x of this run's" in why
    ), why


@pytest.mark.slow
def test_calibrate_times_one_sample_per_length(tiny_models, tmp_path):
    flags = {"ctx": "256,1k", "depths": "50", "samples": 3, "dry_run": True, "calibrate": True, "threads": 1}
    config = build_config("needle", {}, {**flags, "models": pair_options(tiny_models)[1::2]})
    task = TASKS["needle"]
    samples = needle.TASK.running.make_samples(config.options, config.seed)
    settings = EngineSettings.from_config(config)
    for spec in config.models:
        tokenizer = PromptTokenizer(open_tokenizer(spec, settings), spec.name)
        lengths = estimate._lengths(task, samples, {s.sample_id for s in samples}, tokenizer, config)
        assert [(length.ctx, length.samples) for length in lengths] == [(256, 3), (1024, 3)]
        found = estimate.time_estimate(config, task, spec, lengths, settings)
        seconds, note = found.total, found.note
        assert found.source == "--calibrate"
        match = re.fullmatch(
            r"time estimate from --calibrate: ctx 256: ([\d,]+) tokens/s; ctx 1,024: ([\d,]+) tokens/s "
            r"\(one sample per length, timed here\)",
            note,
        )
        assert match, note
        rates = [float(rate.replace(",", "")) for rate in match.groups()]
        expected = sum(sum(length.remaining) / rate for length, rate in zip(lengths, rates))
        assert rates[0] > 0 and rates[1] > 0 and abs(seconds - expected) <= 0.01 * expected, (seconds, expected)

    out = tmp_path / "run"
    result = run_cli_fast("run", "needle", *pair_options(tiny_models), *SMALL, "--samples", "2", "--out", str(out),
                          "--dry-run", "--calibrate")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "(each model loaded to time one sample per length)" in result.stdout
    for step in ("--calibrate: loading diff", "--calibrate: diff, one sample", "--calibrate: loading base"):
        assert step in result.stderr, result.stderr  # a spinner per step
    assert all(cells[4].endswith(" s") for cells in _table(result.stdout).values())
    notes = _notes(result.stdout)  # one per model: each model has its own rate
    assert [note.split(": ", 1) for note in notes] == [[name, ANY] for name in ("diff", "base")], notes
    assert all(note.split(": ", 1)[1].startswith("time estimate from --calibrate: ") for note in notes), notes
    assert not out.exists()  # calibrating writes nothing


@pytest.mark.parametrize(
    "args, message",
    [
        (["--calibrate"], "error: --calibrate only sizes a dry run: add --dry-run, or leave it out"),
        (
            ["--dry-run", "--calibrate", "--tokens-per-s", "100"],
            "error: --calibrate and --tokens-per-s both set the dry run's rate: give one of them",
        ),
    ],
)
def test_calibrate_is_refused_where_it_cannot_apply(args, message):
    result = run_cli_fast("run", "needle", *args)
    assert result.returncode == 2 and result.stderr.strip() == message


@pytest.mark.slow
def test_a_resumed_run_is_timed_for_the_samples_not_done(tiny_models, tmp_path):
    folder = tmp_path / "run"
    result = run_cli("run", "needle", *pair_options(tiny_models), *SMALL, "--samples", "2", "--out", str(folder))
    assert result.returncode == 0, result.stderr
    result = run_cli_fast(
        "run", "needle", *pair_options(tiny_models), *SMALL, "--samples", "5", "--out", str(folder), "--dry-run",
        "--tokens-per-s", "20",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    for cells in _table(result.stdout).values():
        assert cells[:2] == ["5", "2"]
        left = _tokens(cells) * 3 / 5 / 20  # prompts at one length are within 1 % of one size: 3 of 5 are left
        assert abs(int(cells[4].removesuffix(" s")) - left) <= 1.5, (cells, left)


@pytest.mark.parametrize(
    "value, message",
    [
        ("0", "--tokens-per-s 0: give a positive rate, e.g. 20000"),
        ("-5", "--tokens-per-s -5: give a positive rate, e.g. 20000"),
        ("nan", "--tokens-per-s nan: give a positive rate, e.g. 20000"),
        ("inf", "--tokens-per-s inf: give a positive rate, e.g. 20000"),
        ("fast", "Invalid value for '--tokens-per-s'"),
    ],
)
def test_bad_tokens_per_s_is_one_line(value, message):
    result = run_cli_fast("run", "needle", "--dry-run", "--tokens-per-s", value)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr


def test_tokens_per_s_without_dry_run_is_one_line():
    result = run_cli_fast("run", "needle", "--tokens-per-s", "100")
    assert result.returncode == 2
    assert result.stderr.strip() == "error: --tokens-per-s only sizes a dry run: add --dry-run, or leave it out"


def test_every_task_that_sizes_a_run_dry_runs_in_a_suite(tiny_models, tmp_path):
    """ci-smoke runs needle, attention, icl and hallucination: each prints its table and its time estimate."""
    out = tmp_path / "suite"
    result = run_cli_fast(
        "run", "suite", "ci-smoke", *pair_options(tiny_models), "--out", str(out), "--dry-run", "--tokens-per-s", "1e3"
    )
    assert result.returncode == 0, result.stderr
    sized = [name for name, task in TASKS.items() if task.running.sizing is not None]
    titles = [line.strip() for line in result.stdout.splitlines() if "dry run into" in line]
    assert [title.split(":")[0] for title in titles] == ["needle", "attention", "icl", "hallucination"]
    assert set(title.split(":")[0] for title in titles) <= set(sized)
    assert _notes(result.stdout) == ["time estimate from --tokens-per-s 1,000"] * 4
    rows = _table(result.stdout)
    assert set(rows) == {"diff", "base"} and all(cells[4].endswith(" s") for cells in rows.values())
    assert not out.exists()


RATE = speed.MatmulRate(5e10, "cpu", "float32", 1, "2026-12-06")  # a fixed matmul rate: the tests' numbers are exact


def test_the_rate_comes_from_the_first_source_at_hand(monkeypatch):
    """--tokens-per-s, then --calibrate, then runs on this machine, then the config and the matmul rate."""
    length = estimate.Length(512, None, 2, (1000, 64), (1000, 64), 2)
    recorded: dict = {512: estimate.Throughput(200.0, "200 tokens/s recorded in a folder")}
    monkeypatch.setattr(estimate, "calibrated_rates", lambda *args: {512: 100.0})
    monkeypatch.setattr(estimate, "recorded_rates", lambda *args: (recorded or None, "no folder"))
    monkeypatch.setattr(estimate, "run_matmul_rate", lambda *args: RATE)

    def estimated(**flags) -> estimate.Estimate:
        config = build_config("needle", {}, {"ctx": "512", "dry_run": True, **flags})
        settings = EngineSettings.from_config(config)
        return estimate.time_estimate(config, TASKS["needle"], config.models[0], [length], settings)

    assert (found := estimated(tokens_per_s=50)).seconds == {512: 1064 / 50} and found.source == "--tokens-per-s"
    assert (found := estimated(calibrate=True)).seconds == {512: 1064 / 100} and found.source == "--calibrate"
    assert (found := estimated()).seconds == {512: 1064 / 200} and found.source == "runs on this machine"
    recorded.clear()
    found = estimated()
    shape = speed.shape_of(json.loads((Path(model_path("toy-diff")) / "config.json").read_text(), object_hook=ns))
    assert found.seconds == {512: pytest.approx(2 * speed.sample_seconds(shape, 500, 32, RATE.flops_per_s))}
    assert found.source == estimate.CONFIG_SOURCE and _why_not_recorded(found.note) == "no folder"
    assert found.note.startswith(f"time estimate from the config and this machine's matmul rate ({RATE.describe()})")


def ns(fields: dict) -> SimpleNamespace:
    return SimpleNamespace(**fields)


def test_a_fresh_dry_run_is_timed_from_the_config(tiny_models, tmp_path, monkeypatch):
    monkeypatch.setattr(estimate, "run_matmul_rate", lambda *args: RATE)
    result = run_cli_fast("run", "needle", *pair_options(tiny_models), *SMALL, "--samples", "4", "--out",
                          str(tmp_path / "run"), "--dry-run")  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = _table(result.stdout)
    for name, cells in rows.items():
        shape = speed.shape_of(json.loads((tiny_models[name] / "config.json").read_text(), object_hook=ns))
        prompt, new = (int(cell.replace(",", "")) / 4 for cell in cells[2:4])
        assert cells[4] == estimate.duration(4 * speed.sample_seconds(shape, prompt, new, RATE.flops_per_s)), cells
        assert cells[5] == estimate.CONFIG_SOURCE
    [note] = _notes(result.stdout)
    why = f"no run folder beside {tmp_path / 'run'} records the speed of this checkpoint on hf"
    assert _why_not_recorded(note) == why
    assert not result.stdout.startswith("This run takes")  # seconds, not hours: nothing said first
    assert not (tmp_path / "run").exists()


def _no_model_loads(monkeypatch) -> None:
    """Loading a model's weights fails the test: the engines' factory and transformers' from_pretrained."""
    from transformers import PreTrainedModel

    def refuse(*args, **kwargs):
        pytest.fail("a model was loaded")

    monkeypatch.setattr(estimate, "make_backend", refuse)
    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(refuse))


@pytest.mark.slow
def test_the_64k_dry_run_of_the_built_in_pair_gives_a_time_at_once(monkeypatch, tmp_path):
    """The README's headline at 64K, on a fresh clone: a time from the config (no n/a, no model loaded) and, on a
    CPU, first of all how long it takes and a command that fits in an hour."""
    _no_model_loads(monkeypatch)
    fast = speed.MatmulRate(1e12, "cpu", "float32", 1, "2026-12-06")  # hours still, but more than 1 sample an hour
    monkeypatch.setattr(estimate, "run_matmul_rate", lambda *args: fast)
    monkeypatch.chdir(tmp_path)
    result = run_cli_fast("run", "needle", "--ctx", "64k", "--dry-run", "--device", "cpu")
    assert result.returncode == 0, result.stderr
    rows = _table(result.stdout)
    assert set(rows) == {"diff", "base"} and all(_from_config(cells) for cells in rows.values())
    assert all(cells[:2] == ["250", "0"] and cells[4].endswith("min") for cells in rows.values())  # hours
    first, second = result.stdout.splitlines()[:2]
    assert first.startswith("This run takes about ") and " on this CPU (diff " in first, first
    match = re.fullmatch(
        r"For a first look, size it down: diffeval run needle --ctx 64k --dry-run --device cpu --limit (\d+) "
        r"\(about (.+); --limit caps the samples per cell; fewer --ctx lengths or cells shorten it too\)\.",
        second,
    )
    assert match, second
    # the limit: the most samples per cell (5 depths) whose time fits in an hour, at the table's rates
    per_sample = sum(estimate_seconds(cells) for cells in rows.values()) / 250
    limit = int(match.group(1))
    assert limit > 1 and 5 * limit * per_sample <= estimate.LONG_RUN_SECONDS * 1.01 < 5 * (limit + 1) * per_sample
    assert match.group(2).endswith(" min")  # under an hour
    # a rate given by hand may be another machine's: the table times the run, and nothing speaks of this CPU
    result = run_cli_fast("run", "needle", "--ctx", "64k", "--dry-run", "--device", "cpu", "--tokens-per-s", "100")
    assert result.returncode == 0 and result.stdout.startswith("needle: dry run into "), result.stdout


def estimate_seconds(cells: list[str]) -> float:
    """The table's time in seconds ("2 h 05 min", "42 min", "9 s")."""
    parts = cells[4].split()
    units = {"s": 1, "min": 60, "h": 3600}
    return sum(float(parts[i]) * units[parts[i + 1]] for i in range(0, len(parts), 2))


def fake_samples(count: int, ctx: int = 1024) -> list[SimpleNamespace]:
    return [SimpleNamespace(sample_id=f"s{i}", ctx=ctx) for i in range(count)]


@pytest.fixture
def command(monkeypatch):
    monkeypatch.setattr("sys.argv", ["diffeval", "run", "needle", "--ctx", "1k", "--limit", "60", "--samples", "60"])


def test_a_long_run_on_a_cpu_says_so_first_with_a_smaller_command(command):
    config = SimpleNamespace(ray=None, device="cpu", limit=60)
    samples = fake_samples(60)
    per_sample = {"diff": {1024: 100.0}, "base": {1024: 50.0}}  # 150 s a sample: 2 h 30 min for 60
    lines = estimate.long_run_notice(config, per_sample, set(), samples, lambda n: samples[:n], bound=False)
    assert lines == [
        "This run takes about 2 h 30 min on this CPU (diff 1 h 40 min, base 50 min; the table says where each "
        "estimate comes from).",
        # 24 samples × 150 s = 1 h, the most that fit in LONG_RUN_SECONDS; the old --limit is replaced
        "For a first look, size it down: diffeval run needle --ctx 1k --samples 60 --limit 24 (about 60 min; --limit "
        "caps the samples per cell; fewer --ctx lengths or cells shorten it too).",
    ]
    done = {("diff", f"s{i}") for i in range(30)}  # done samples cost nothing: 30 × 100 + 60 × 50 s = 100 min
    lines = estimate.long_run_notice(config, per_sample, done, samples, lambda n: samples[:n], bound=True)
    assert lines[0].startswith("This run takes up to about 1 h 40 min on this CPU (diff 50 min, base 50 min; at most")
    assert "--limit 44 (about 60 min;" in lines[1]  # 44 × 50 + 14 × 100 = 3600 s: 45 would be 3750
    assert lines[2] == "It starts now: Ctrl-C stops it, and the same command resumes where it stopped."


def test_a_short_run_or_one_off_this_cpu_says_nothing_first(command):
    samples = fake_samples(60)
    per_sample = {"diff": {1024: 60.0}}  # exactly an hour
    config = SimpleNamespace(ray=None, device="cpu", limit=None)
    assert estimate.long_run_notice(config, per_sample, set(), samples, lambda n: samples[:n], bound=False) == []
    longer = {"diff": {1024: 61.0}}
    on_ray = SimpleNamespace(ray="auto", device="cpu", limit=None)  # the workers' devices are not this machine's
    assert estimate.long_run_notice(on_ray, longer, set(), samples, lambda n: samples[:n], bound=False) == []
    one = SimpleNamespace(ray=None, device="cpu", limit=1)
    lines = estimate.long_run_notice(one, longer, set(), samples, lambda n: samples[:n], bound=False)
    assert lines[1] == "It runs one sample per cell already: give fewer --ctx lengths, cells or models to shorten it."


def test_the_command_keeps_what_was_typed(monkeypatch):
    monkeypatch.setattr("sys.argv", ["/x/diffeval/__main__.py", "run", "needle", "-m", "a=b c", "--limit=3"])
    assert estimate.command_with_limit(2) == "diffeval run needle -m 'a=b c' --limit 2"
    monkeypatch.setattr("sys.argv", ["pytest", "tests"])  # the Python API: no command line to show
    assert estimate.command_with_limit(2) == "the same run with --limit 2"


class Stop(Exception):
    """Raised where a test has seen what it wanted, before any model works for minutes."""


def _stop(*args, **kwargs):
    raise Stop


def test_calibrate_warns_before_a_sample_of_minutes(monkeypatch):
    """At 64K one sample of the built-in pair takes minutes on a CPU: --calibrate says so before loading the model."""
    monkeypatch.setattr(estimate, "run_matmul_rate", lambda *args: RATE)
    monkeypatch.setattr(estimate, "make_backend", _stop)
    config = build_config("needle", {}, {"ctx": "1k,64k", "dry_run": True, "calibrate": True})
    settings, spec = EngineSettings.from_config(config), config.models[0]
    lengths = [estimate.Length(1024, None, 1, (990, 32), (990, 32), 1),
               estimate.Length(65536, None, 1, (65400, 32), (65400, 32), 1)]  # fmt: skip
    shape = speed.shape_of(json.loads((Path(model_path("toy-diff")) / "config.json").read_text(), object_hook=ns))
    expected = speed.sample_seconds(shape, 65400, 32, RATE.flops_per_s)
    assert expected > estimate.CALIBRATE_WARNING_SECONDS > speed.sample_seconds(shape, 990, 32, RATE.flops_per_s)
    console = Console(file=io.StringIO(), width=300)
    with pytest.raises(Stop):
        estimate.calibrated_rates(config, TASKS["needle"], spec, lengths, settings, console)
    lines = console.file.getvalue().splitlines()
    assert lines[0] == (
        f"warning: --calibrate evaluates one sample of diff per length: about {estimate.duration(expected)} at ctx "
        "65,536 (config estimate); leave --calibrate out for the config estimate at once"
    )
    assert any("--calibrate: loading diff" in line for line in lines[1:]), lines  # the first step's progress

    console = Console(file=io.StringIO(), width=300)  # 1K only: a second or less, no warning
    with pytest.raises(Stop):
        estimate.calibrated_rates(config, TASKS["needle"], spec, lengths[:1], settings, console)
    assert "warning" not in console.file.getvalue()


def test_a_long_run_started_on_a_cpu_says_so_before_any_model_loads(monkeypatch, tmp_path):
    """The real run at 64K on the built-in pair: its bound (every prompt at 64K), then the smaller command, then that
    Ctrl-C stops it; stopped here where the first model would load."""
    from diffeval import runner

    monkeypatch.setattr(estimate, "run_matmul_rate", lambda *args: RATE)
    monkeypatch.setattr(runner, "_evaluate_all", _stop)
    monkeypatch.setattr("sys.argv", ["diffeval", "run", "needle", "--ctx", "64k", "--device", "cpu"])
    config = build_config("needle", {}, {"ctx": "64k", "device": "cpu", "out": str(tmp_path / "run")})
    console = Console(file=io.StringIO(), width=300)
    with pytest.raises(Stop):
        runner.run(config, console)
    lines = console.file.getvalue().splitlines()
    shape = speed.shape_of(json.loads((Path(model_path("toy-diff")) / "config.json").read_text(), object_hook=ns))
    answer = TASKS["needle"].running.budget(RunContext.of(config)).answer
    bound = 250 * speed.sample_seconds(shape, 65536, answer, RATE.flops_per_s)  # diff's
    assert lines[0].startswith("This run takes up to about ") and f"(diff {estimate.duration(bound)}, base " in lines[0]
    assert lines[0].endswith(f"at most, every prompt at its full --ctx: the config estimate, "
                             f"{speed.CALIBRATION.accuracy()}).")  # fmt: skip
    assert lines[1].startswith("For a first look, size it down: diffeval run needle --ctx 64k --device cpu --limit 1 ")
    assert lines[2] == "It starts now: Ctrl-C stops it, and the same command resumes where it stopped."


def test_a_short_run_on_a_cpu_starts_without_a_word(monkeypatch, tiny_models, tmp_path):
    from diffeval import runner

    monkeypatch.setattr(estimate, "run_matmul_rate", lambda *args: RATE)
    monkeypatch.setattr(runner, "_evaluate_all", _stop)
    flags = {"ctx": "512", "depths": "50", "samples": 2, "device": "cpu", "out": str(tmp_path / "run")}
    config = build_config("needle", {}, {**flags, "models": pair_options(tiny_models)[1::2]})
    console = Console(file=io.StringIO(), width=300)
    with pytest.raises(Stop):
        runner.run(config, console)
    assert console.file.getvalue() == ""
