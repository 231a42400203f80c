"""`--dry-run` sizes a run cheaply and tells the time: the needle task's token totals come from the haystack's per-word
token counts and one exact fit per length, within 1 % of fitting every prompt; the time estimate comes from
--tokens-per-s or from the throughput an earlier run folder of the same models recorded, and says which."""

import json
from importlib import resources
from pathlib import Path

import pytest

from conftest import pair_options, run_cli
from conftest import run_cli_in_process as run_cli_fast
from diffeval.models.backend import EngineSettings, open_tokenizer
from diffeval.models.tokenizer import PromptTokenizer
from diffeval.tasks import TASKS, build_config, needle


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
    samples = needle.make_samples(config.options, config.seed)
    settings = EngineSettings.from_config(config)
    for spec in config.models:  # two tokenizers: different vocabularies and merges
        tokenizer = PromptTokenizer(open_tokenizer(spec, settings), spec.name)
        exact_tokenizer, cheap_tokenizer = CountingTokenizer(tokenizer, 1200), CountingTokenizer(tokenizer, 1200)
        fitted = [needle.fitted_prompt(sample, exact_tokenizer, config) for sample in samples]
        exact = sum(len(prompt.ids) for prompt, _ in fitted), sum(limit for _, limit in fitted)
        cheap = needle.sizing(samples, cheap_tokenizer, config)
        assert cheap[1] == exact[1]  # the token limits are computed, not estimated
        assert abs(cheap[0] - exact[0]) <= 0.01 * exact[0], (spec.name, haystack, cheap, exact)
        # fitting encodes each sample's whole prompt at least once; sizing one stream and one fit per length (a fit
        # is one encoding, or a few where it searches); the fixed parts (instruction, needles, question) are short
        assert len(samples) == 36 and exact_tokenizer.long_encodes >= 36, (spec.name, exact_tokenizer.long_encodes)
        assert cheap_tokenizer.long_encodes <= 2 * 8, (spec.name, cheap_tokenizer.long_encodes)


def _table(stdout: str) -> dict[str, list[str]]:
    """The dry run's table rows by model: samples, done, prompt tokens, generated tokens, time."""
    rows = {}
    for line in stdout.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if len(cells) == 6 and cells[1].replace(",", "").isdigit():
            rows[cells[0]] = cells[1:]
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
        assert cells[4] == f"{_tokens(cells) / 100:.0f} s"
    assert _notes(result.stdout) == ["time estimate from --tokens-per-s 100"]  # one line: it holds for both models
    assert not (tmp_path / "run").exists()  # a dry run writes nothing


def _recorded(folder: Path, model: str) -> tuple[int, float, int]:
    rows = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    mine = [r for r in rows if r["model"] == model]
    return sum(r["prompt_tokens"] + r["new_tokens"] for r in mine), sum(r["seconds"] for r in mine), len(mine)


def test_time_estimate_from_an_earlier_run_folder(tiny_models, tmp_path):
    runs = tmp_path / "results"
    earlier = {ctx: runs / f"needle-{ctx}" for ctx in ("256", "1024")}
    for ctx, folder in earlier.items():
        args = ["--ctx", ctx, "--depths", "50", "--samples", "2", "--out", str(folder)]
        result = run_cli("run", "needle", *pair_options(tiny_models), *args)
        assert result.returncode == 0, result.stderr

    # a new run beside them: each model's rate from the folder whose records are closest in size to its samples
    for ctx, folder in earlier.items():
        result = run_cli_fast(
            "run", "needle", *pair_options(tiny_models), "--ctx", ctx, "--samples", "3", "--depths", "0,50",
            "--out", str(runs / "next"), "--dry-run",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        rows, notes = _table(result.stdout), _notes(result.stdout)
        assert len(notes) == 2
        for name, note in zip(("diff", "base"), notes):
            tokens, seconds, count = _recorded(folder, name)
            rate = tokens / seconds
            assert note == (
                f"{name}: time estimate from {rate:,.0f} tokens/s recorded in {folder} ({count} records of "
                f"{tokens / count:,.0f} tokens on average)"
            )
            cells = rows[name]
            assert cells[:2] == ["6", "0"] and cells[4] == f"{_tokens(cells) / rate:.0f} s"

    # records of another engine do not time this one: no estimate, and how to get one
    for folder in earlier.values():
        run_json = json.loads((folder / "run.json").read_text())
        run_json["config"]["backend"] = "vllm"
        (folder / "run.json").write_text(json.dumps(run_json))
    result = run_cli_fast("run", "needle", *pair_options(tiny_models), *SMALL, "--out", str(runs / "next"), "--dry-run")
    assert result.returncode == 0, result.stderr
    assert {cells[4] for cells in _table(result.stdout).values()} == {"n/a"}
    assert [line for line in result.stdout.splitlines() if line.startswith("no time estimate")] == [
        f"no time estimate: no run folder beside {runs / 'next'} records the speed of this checkpoint on hf; give "
        "--tokens-per-s N, or run a few samples first (--limit 2) and dry-run again"
    ]


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
    sized = [name for name, task in TASKS.items() if task.sizing is not None]
    titles = [line.strip() for line in result.stdout.splitlines() if "dry run into" in line]
    assert [title.split(":")[0] for title in titles] == ["needle", "attention", "icl", "hallucination"]
    assert set(title.split(":")[0] for title in titles) <= set(sized)
    assert _notes(result.stdout) == ["time estimate from --tokens-per-s 1,000"] * 4
    rows = _table(result.stdout)
    assert set(rows) == {"diff", "base"} and all(cells[4].endswith(" s") for cells in rows.values())
    assert not out.exists()
