"""A run's identity and its folder (#49, rules 1 and 4).

Identity: the content of every file an option makes a run read is part of the run's identity (run.json's
`config.input_sha256`), so an input edited in place under the same path is another run; a folder written by a newer
diffeval (its `run_format`) or holding config fields this version does not know is refused, never rewritten. The
identity of a run that reads no user file, and so its default folder name, is what it was before input hashes.

Folder guard: a refusal while the samples are sized writes nothing, in `run` and in `run suite`; one raised once a
model is loaded undoes what the run wrote (an --overwrite'n folder is put back), unless records were appended.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import fields
from pathlib import Path

import pytest
from test_bad_input import _snapshot, assert_one_line, assert_refused_in_place

from conftest import run_cli_in_process as run_cli
from diffeval.config import RunConfig
from diffeval.errors import InputError
from diffeval.results import RUN_FORMAT, RunFolder
from diffeval.tasks import TASKS, build_config

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "diffeval"
TOY = ["-m", "diff=toy-diff", "-m", "base=toy-base"]
NEWER = 9.9
NEEDLE_SET = json.loads((PACKAGE / "data" / "needle_sets" / "nolima-diffeval.json").read_text())


def _inputs(root: Path) -> dict[str, Path]:
    """One copy of each kind of input file or folder an option reads, under `root`."""
    essays = root / "essays"
    essays.mkdir(parents=True)
    for n in range(2):
        (essays / f"essay{n}.txt").write_text(
            " ".join(f"The mill by the river turned for the {n}-th time, day {i}." for i in range(300))
        )
    (root / "essays.json").write_text(json.dumps(["A text of one sentence. " * 40, "Another text here. " * 40]))
    (root / "needles.json").write_text(json.dumps(NEEDLE_SET))
    shutil.copytree(PACKAGE / "data" / "texts", root / "books")
    shutil.copytree(PACKAGE / "fixtures", root / "fixtures")
    (root / "indices.json").write_text(json.dumps([0, 1, 2]))
    (root / "lm_tasks").mkdir()
    (root / "lm_tasks" / "mine.yaml").write_text("task: mine\ndataset_path: json\n")
    return {p.name: p for p in root.iterdir()}


# input option → (task, the option's values, the file a run reads, a file beside it the run does not read)
NOT_FILES = ("judge", "rendering", "source")  # values an entry gives that name no file
READS = {
    "needle --haystack essays:FOLDER": ("needle", {"haystack": "essays:{essays}"}, "essays/essay1.txt", "essays/x.md"),
    "needle --haystack essays:FILE": ("needle", {"haystack": "essays:{essays.json}"}, "essays.json", None),
    "attention --haystack": ("attention", {"haystack": "essays:{essays}"}, "essays/essay0.txt", None),
    "outliers --haystack": ("outliers", {"haystack": "essays:{essays}"}, "essays/essay0.txt", "essays/x.md"),
    "mk-niah --haystack": ("mk-niah", {"haystack": "essays:{essays}"}, "essays/essay0.txt", None),
    "mv-niah --haystack": ("mv-niah", {"haystack": "essays:{essays}"}, "essays/essay0.txt", None),
    "vt --haystack": ("vt", {"haystack": "essays:{essays}"}, "essays/essay0.txt", None),
    "nolima --haystack": ("nolima", {"haystack": "essays:{essays}"}, "essays/essay0.txt", None),
    "distractor-attention --haystack": (
        "distractor-attention",
        {"haystack": "essays:{essays}"},
        "essays/essay0.txt",
        None,
    ),
    "nolima --needle-set": ("nolima", {"needle_set": "{needles.json}"}, "needles.json", None),
    "nll --data-dir: its index": ("nll", {"data_dir": "{books}"}, "books/books.jsonl", "books/notes.txt"),
    "nll --data-dir: a book": ("nll", {"data_dir": "{books}"}, "books/austen-persuasion.txt", None),
    "icl --data-dir": ("icl", {"data_dir": "{fixtures}"}, "fixtures/trec/test.jsonl", "fixtures/xsum.jsonl"),
    "icl --test-indices": ("icl", {"data_dir": "{fixtures}", "test_indices": "{indices.json}"}, "indices.json", None),
    "hallucination --data-dir": (
        "hallucination",
        {"data_dir": "{fixtures}", "judge": ["overlap"]},
        "fixtures/xsum.jsonl",
        "fixtures/hotpotqa.jsonl",
    ),
    "longbench2 --data-dir": (
        "longbench2",
        {"data_dir": "{fixtures}"},
        "fixtures/longbench2.json",
        "fixtures/xsum.jsonl",
    ),
    "graphwalks --data-dir": (
        "graphwalks",
        {"source": "openai", "data_dir": "{fixtures}"},
        "fixtures/graphwalks.jsonl",
        "fixtures/xsum.jsonl",
    ),
    "mrcr --replies": (
        "mrcr",
        {"rendering": "plain", "replies": "essays:{essays}"},
        "essays/essay0.txt",
        "essays/x.md",
    ),
    "mrcr --data-dir": (
        "mrcr",
        {"rendering": "plain", "source": "openai", "data_dir": "{fixtures}"},
        "fixtures/mrcr.jsonl",
        "fixtures/xsum.jsonl",
    ),
    "quantize --include-path": ("quantize", {"include_path": "{lm_tasks}"}, "lm_tasks/mine.yaml", None),
    "zeroshot --include-path": ("zeroshot", {"include_path": "{lm_tasks}"}, "lm_tasks/mine.yaml", None),
}


def _config(task: str, values: dict, inputs: dict[str, Path]) -> RunConfig:
    filled = {k: ([str(v) for v in value] if isinstance(value, list) else value) for k, value in values.items()}
    for name, path in inputs.items():
        filled = {k: v.replace("{" + name + "}", str(path)) if isinstance(v, str) else v for k, v in filled.items()}
    return build_config(task, filled, {"models": ["diff=toy-diff", "base=toy-base"]})


def test_every_option_that_reads_a_file_is_in_the_table():
    """An option declared with `reads` (config.option) without an entry here fails: each is tested below."""
    declared = {(task.name, f.name) for task in TASKS.values() for f in fields(task.options) if f.metadata.get("reads")}
    tabled = {(task, name) for task, values, _, _ in READS.values() for name in values if name not in NOT_FILES}
    assert declared <= tabled, f"options that read files but have no entry in READS: {sorted(declared - tabled)}"


@pytest.mark.parametrize("entry", list(READS))
def test_the_identity_holds_the_content_an_option_reads(entry, tmp_path):
    """Editing a file the run reads, in place, gives another identity hash (another default folder) and names the
    option; editing a file beside it that the run does not read changes nothing."""
    task, values, read, unread = READS[entry]
    inputs = _inputs(tmp_path)
    before = _config(task, values, inputs)
    assert set(before.input_sha256) == {name for name in values if name not in NOT_FILES}
    assert before.to_dict()["input_sha256"] == before.input_sha256
    if unread is not None:
        (tmp_path / unread).write_text("not read by the run")
        assert _config(task, values, inputs).identity_hash() == before.identity_hash()
    with (tmp_path / read).open("a") as handle:
        handle.write("\n")
    after = _config(task, values, inputs)
    assert after.identity_hash() != before.identity_hash()
    assert after.out_dir() != before.out_dir()


# identity hashes of runs that read no user file, as the commit before input hashes computed them (c32d073)
HASHES_BEFORE = {
    ("needle", ()): "2da084f3de",
    ("nolima", ()): "43716f8076",
    ("nll", ()): "fbb13fbd94",
    ("icl", ()): "4a24f68666",
    ("mk-niah", (("keys", 8),)): "021dcbd3e3",
    ("quantize", ()): "937ed8cba4",
    ("outliers", ()): "a787998193",
}


@pytest.mark.parametrize(("key", "expected"), HASHES_BEFORE.items(), ids=[task for task, _ in HASHES_BEFORE])
def test_a_run_that_reads_no_user_file_keeps_its_identity_hash(key, expected):
    task, values = key
    config = build_config(task, dict(values), {"models": ["diff=toy-diff", "base=toy-base"]})
    assert config.input_sha256 == {} and "input_sha256" not in config.to_dict()
    assert config.identity_hash() == expected


# ---------------------------------------------------------------------------------------------------------------
# The identity table: a run folder, and its inputs or run.json damaged one way; the command that resumes it is
# refused in one line and leaves the folder byte-identical.


def _edit(path: Path) -> None:
    """The file edited in place, still valid: a sentence added to a text, a row to JSON lines, an item to JSON."""
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        path.write_text(json.dumps([*data, data[-1] + 1] if isinstance(data, list) else {**data, "name": "edited"}))
        return
    added = path.read_text().splitlines()[0] + "\n" if path.suffix == ".jsonl" else " An edited sentence."
    with path.open("a") as handle:
        handle.write(added)


def _run_json(folder: Path, change) -> None:
    path = folder / "run.json"
    run = json.loads(path.read_text())
    change(run)
    path.write_text(json.dumps(run, indent=2) + "\n")


def _newer(run: dict) -> None:
    run["run_format"] = RUN_FORMAT + 1
    run["versions"]["diffeval"] = str(NEWER)


def _unknown_field(run: dict) -> None:
    run["config"]["stream_order"] = "shuffled"
    run["versions"]["diffeval"] = str(NEWER)


def _unknown_option(run: dict) -> None:
    run["config"]["options"]["needle_font"] = "serif"
    run["versions"]["diffeval"] = str(NEWER)


NEEDLE_ARGS = ["run", "needle", *TOY, "--ctx", "1k", "--samples", "1", "--depths", "0", "--haystack", "essays:{essays}"]
NOLIMA_ARGS = [
    "run",
    "nolima",
    *TOY,
    "--ctx",
    "1k",
    "--samples",
    "1",
    "--depths",
    "0",
    "--needle-set",
    "{needles.json}",
]
NLL_ARGS = ["run", "nll", *TOY, "--ctx", "1k", "--data-dir", "{books}"]
ICL_ARGS = ["run", "icl", *TOY, "--ctx", "1k", "--dataset", "trec", "--shots", "1", "--test-size", "4"]
ICL_ARGS += ["--data-dir", "{fixtures}"]
CHANGED = "the content read through"

# damage → (the command, what damages the folder (run.json) or its inputs (a path under the inputs), the line)
IDENTITY_DAMAGES = {
    "essays edited in place": (NEEDLE_ARGS, "essays/essay0.txt", f"{CHANGED} --haystack changed since that run"),
    "an essay added": (NEEDLE_ARGS, "essays/essay2.txt", f"{CHANGED} --haystack changed"),
    "needle set edited in place": (NOLIMA_ARGS, "needles.json", f"{CHANGED} --needle-set changed"),
    "a book edited in place": (NLL_ARGS, "books/austen-persuasion.txt", f"{CHANGED} --data-dir changed"),
    "icl data edited in place": (ICL_ARGS, "fixtures/trec/train.jsonl", f"{CHANGED} --data-dir changed"),
    "icl indices edited in place": (
        [*ICL_ARGS, "--test-indices", "{indices.json}"],
        "indices.json",
        f"{CHANGED} --test-indices changed",
    ),
    "a newer run.json format": (
        NEEDLE_ARGS,
        _newer,
        f"written by diffeval {NEWER} in run.json format {RUN_FORMAT + 1}",
    ),
    "a config field unknown here": (NEEDLE_ARGS, _unknown_field, f"(stream_order), written by diffeval {NEWER}"),
    "an option unknown here": (NEEDLE_ARGS, _unknown_option, "(options.needle_font)"),
    "a damaged run_format": (NEEDLE_ARGS, lambda run: run.update(run_format="2"), "damaged run_format ('2')"),
    "damaged input hashes": (
        NEEDLE_ARGS,
        lambda run: run["config"].update(input_sha256=["x"]),
        "damaged input hashes (input_sha256)",
    ),
}


def _filled(args: list[str], inputs: dict[str, Path]) -> list[str]:
    for name, path in inputs.items():
        args = [arg.replace("{" + name + "}", str(path)) for arg in args]
    return args


def config_of(args: list[str]) -> RunConfig:
    """The RunConfig the command line `args` runs, as the CLI builds it (the runner is not called)."""
    from diffeval import runner

    built = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runner, "run", lambda config, console=None, infos=None: built.append(config))
        result = run_cli(*args)
    assert result.returncode == 0 and len(built) == 1, result.stderr
    return built[0]


def _started(cwd: Path, args: list[str]) -> Path:
    """The run folder `args` would resume, as the run started it (run.json, a record line): made without a model."""
    config = config_of(args)
    folder = RunFolder(cwd / "results" / "started")
    folder.path.mkdir(parents=True)
    folder.prepare(config, {"versions": {"diffeval": "0.1.0"}, "models": {}})
    folder.samples_path.write_text('{"model": "diff", "sample_id": "s1", "partial": true}\n')
    return folder.path


@pytest.mark.parametrize("damage", list(IDENTITY_DAMAGES))
def test_a_folder_of_another_identity_is_refused_in_place(damage, tmp_path):
    args, change, message = IDENTITY_DAMAGES[damage]
    inputs = _inputs(tmp_path / "inputs")
    args = _filled(args, inputs)
    folder = _started(tmp_path, args)
    if callable(change):
        _run_json(folder, change)
    else:
        _edit(tmp_path / "inputs" / change)
    assert_refused_in_place(tmp_path, [*args, "--out", str(folder)], message, kept=(folder, tmp_path / "inputs"))


def test_the_refusal_of_a_newer_folder_says_what_to_do(tmp_path):
    folder = _started(tmp_path, _filled(NEEDLE_ARGS, _inputs(tmp_path / "inputs")))
    _run_json(folder, _newer)
    with pytest.raises(InputError) as refused:
        RunFolder(folder).read_run()
    assert str(refused.value).endswith(f"newer than this diffeval (0.1.0) reads (format {RUN_FORMAT}): upgrade "
                                       "diffeval, or give another --out")  # fmt: skip


@pytest.mark.parametrize(
    "command",
    [["report", "{run}"], ["compare", "{run}", "{copy}"], ["view", "{run}", "--export", "{page}"]],
    ids=["report", "compare", "view"],
)
def test_report_compare_and_view_refuse_a_newer_folder_in_the_same_line(command, tmp_path):
    """A folder of a newer run.json format may mean what this version would misread: refused, not read."""
    run, copy = tmp_path / "run", tmp_path / "copy"
    shutil.copytree(REPO / "results" / "toy-pair", run)
    shutil.copytree(run, copy)
    _run_json(run, _newer)
    args = [arg.format(run=run, copy=copy, page=tmp_path / "page") for arg in command]
    before = _snapshot(run)
    result = run_cli(*args)
    assert_one_line(result, f"{run / 'run.json'} was written by diffeval {NEWER} in run.json format {RUN_FORMAT + 1}")
    assert _snapshot(run) == before and not (tmp_path / "page").exists()


def test_report_reads_a_folder_of_an_older_format_and_fields_it_does_not_know(tmp_path):
    """An older folder (no run_format) is read as format 0; a config field this version does not know is not used:
    the tables are computed from the records."""
    run = tmp_path / "run"
    shutil.copytree(REPO / "results" / "toy-pair", run)
    _run_json(run, lambda data: data["config"].update(stream_order="shuffled"))
    assert "run_format" not in json.loads((run / "run.json").read_text())
    result = run_cli("report", str(run), "--format", "md", "--out", str(tmp_path / "report"))
    assert result.returncode == 0, result.stderr


def test_an_edited_input_resumes_into_a_new_default_folder(tmp_path, monkeypatch):
    """Without --out, the edited input's run gets a folder of its own; the first run's folder is left as it was."""
    inputs = _inputs(tmp_path / "inputs")
    args = _filled(NEEDLE_ARGS, inputs)
    monkeypatch.chdir(tmp_path)
    assert run_cli(*args).returncode == 0
    (first,) = (tmp_path / "results").iterdir()
    before = _snapshot(first)
    _edit(inputs["essays"] / "essay0.txt")
    assert run_cli(*args).returncode == 0
    folders = sorted((tmp_path / "results").iterdir())
    assert len(folders) == 2 and first in folders and _snapshot(first) == before
    (second,) = [folder for folder in folders if folder != first]
    hashes = [json.loads((f / "run.json").read_text())["config"]["input_sha256"]["haystack"] for f in (first, second)]
    assert hashes[0] != hashes[1]


def test_a_folder_from_before_input_hashes_resumes_and_records_them(tmp_path):
    """A folder without `input_sha256` or `run_format` (written before them) resumes under an explicit --out, and
    gets both recorded; its records are kept."""
    inputs = _inputs(tmp_path / "inputs")
    args = [*_filled(NEEDLE_ARGS, inputs), "--out", str(tmp_path / "old")]
    assert run_cli(*args).returncode == 0
    records = (tmp_path / "old" / "samples.jsonl").read_bytes()
    _run_json(tmp_path / "old", lambda run: [run.pop("run_format"), run["config"].pop("input_sha256")])
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    run = json.loads((tmp_path / "old" / "run.json").read_text())
    # format 1: the newest (RUN_FORMAT, 2) is written by thinking runs alone (results.run_format)
    assert run["run_format"] == 1 and set(run["config"]["input_sha256"]) == {"haystack"}
    assert (tmp_path / "old" / "samples.jsonl").read_bytes() == records  # nothing left to run: all were done


# ---------------------------------------------------------------------------------------------------------------
# The folder guard: refusals raised while the samples are sized (after the check stage, before the folder is written).


def _sizing_inputs(root: Path) -> dict[str, Path]:
    """A haystack whose every sentence names a zebra, and a needle set whose keyword is `zebra`: no haystack can be
    kept free of the keyword (NoLiMa's rule); a books folder of the shipped book's first 20,000 characters (a few
    windows of 1K)."""
    (root / "zebras").mkdir(parents=True)
    (root / "zebras" / "z.txt").write_text(" ".join(f"The zebra number {i} walks by the river." for i in range(300)))
    pair = {
        "id": "z",
        "question": "Which character has seen a zebra?",
        "keywords": ["zebra"],
        "direct": "Actually, {character} feeds the zebra daily.",
        "inverted": "The zebra is fed by {character}.",
    }
    (root / "zebras.json").write_text(json.dumps({"name": "zebras", "characters": ["Yuki", "Stuart"], "pairs": [pair]}))
    (root / "short").mkdir()
    shutil.copy(PACKAGE / "data" / "texts" / "books.jsonl", root / "short")
    book = (PACKAGE / "data" / "texts" / "austen-persuasion.txt").read_text(encoding="utf-8")[:20_000]
    (root / "short" / "austen-persuasion.txt").write_text(book, encoding="utf-8")
    return {"zebras": root / "zebras", "zebras.json": root / "zebras.json", "short": root / "short"}


PROBE = ["--ctx", "1k", "--samples", "1"]
# refusal → (the command, the corrected option(s) that replace its last two arguments, what the one line says)
SIZING = {
    "nll --windows past the documents": (
        ["run", "nll", *TOY, "--ctx", "1k", "--data-dir", "{short}", "--windows", "50"],
        ["--windows", "2"],
        "use --windows 9",
    ),
    "mk-niah --keys 64 at 1K": (
        ["run", "mk-niah", *TOY, *PROBE, "--depths", "0", "--variants", "1", "--keys", "64"],
        ["--keys", "4"],
        "holds at most 31 keys (--keys 31)",
    ),
    "vt --chains 50 at 1K": (["run", "vt", *TOY, *PROBE, "--chains", "50"], ["--chains", "2"], "(--chains "),
    "mv-niah --values 64 at 1K": (
        ["run", "mv-niah", *TOY, *PROBE, "--depths", "0", "--values", "64"],
        ["--values", "4"],
        "holds at most 31 values (--values 31)",
    ),
    "nolima needles the haystack cannot be kept free of": (
        [
            "run",
            "nolima",
            *TOY,
            *PROBE,
            "--depths",
            "0",
            "--haystack",
            "essays:{zebras}",
            "--needle-set",
            "{zebras.json}",
        ],
        ["--templates", "direct"],  # the shipped needle set
        "every sentence of haystack",
    ),
}


def _sizing(refusal: str, root: Path) -> tuple[list[str], list[str], str]:
    args, corrected, message = SIZING[refusal]
    args = _filled(args, _sizing_inputs(root / "inputs"))
    return args, [*args[:-2], *corrected], message


@pytest.mark.parametrize("refusal", list(SIZING))
def test_a_refusal_while_sizing_writes_nothing(refusal, tmp_path):
    """No folder is created (default or --out), and a folder this config started (as an older version, sizing later,
    left it) stays byte-identical, with --overwrite too."""
    args, _, message = _sizing(refusal, tmp_path)
    assert_refused_in_place(tmp_path, args, message)
    assert_refused_in_place(tmp_path, [*args, "--out", "results/run"], message)
    folder = _started(tmp_path, args)
    assert_refused_in_place(tmp_path, [*args, "--out", str(folder)], message, kept=(folder,))
    assert_refused_in_place(tmp_path, [*args, "--out", str(folder), "--overwrite"], message, kept=(folder,))


@pytest.mark.slow  # a real run of each probe: about 30 s in all
@pytest.mark.parametrize("refusal", list(SIZING))
def test_the_corrected_command_runs_where_the_refused_one_was_pointed(refusal, tmp_path):
    args, corrected, message = _sizing(refusal, tmp_path)
    out = ["--out", "results/run"]
    assert_refused_in_place(tmp_path, [*args, *out], message)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        result = run_cli(*corrected, *out)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "results" / "run" / "samples.jsonl").stat().st_size > 0


def test_a_refusal_while_sizing_leaves_another_runs_folder_under_overwrite_as_it_was(tmp_path):
    args, _, message = _sizing("mk-niah --keys 64 at 1K", tmp_path)
    other = tmp_path / "results" / "other"
    shutil.copytree(REPO / "results" / "toy-pair", other)
    assert_refused_in_place(tmp_path, [*args, "--out", str(other), "--overwrite"], message, kept=(other,))


def test_a_suite_sizes_every_run_before_the_first_writes(tmp_path):
    """The second task's refusal while sizing leaves no folder, not even the first task's."""
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "suite: guarded\nmodels: {diff: toy-diff, base: toy-base}\nctx: 1k\nsamples: 1\ntasks:\n"
        "  - task: needle\n    depths: [0]\n  - task: mk-niah\n    depths: [0]\n    variants: [1]\n    keys: 64\n"
    )
    assert_refused_in_place(tmp_path, ["run", "suite", str(suite)], "holds at most 31 keys (--keys 31)")
    assert_refused_in_place(tmp_path, ["run", "suite", str(suite), "--overwrite"], "holds at most 31 keys")


# A refusal that only a loaded model can raise: nll on hf applies the LM head itself, so a model whose config
# transforms its logits (`logit_scale`) is refused at its first pass, after run.json was written.


@pytest.fixture
def scaled_head(tmp_path) -> Path:
    model = tmp_path / "scaled"
    shutil.copytree(PACKAGE / "toy_models" / "toy-base", model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "logit_scale": 2.0}))
    return model


SCALED = "error: model base transforms its logits (logit_scale): nll on hf supports plain LM heads only"


def _refused_after_loading(cwd: Path, args: list[str], kept: tuple[Path, ...] = ()) -> None:
    """`assert_refused_in_place` for a refusal that comes once the run has started: the model's progress bar, drawn
    by then, is taken off with it, so the error is still the one line."""
    assert_refused_in_place(cwd, args, SCALED.removeprefix("error: "), kept)


def test_a_refusal_once_a_model_is_loaded_undoes_what_the_run_wrote(scaled_head, tmp_path):
    args = ["run", "nll", "-m", f"base={scaled_head}", "--ctx", "1k"]
    folder = _started(tmp_path, args)  # a folder of the same config: its run.json is put back, byte-identical
    _refused_after_loading(tmp_path, [*args, "--out", "results/run"])
    _refused_after_loading(tmp_path, [*args, "--out", str(folder)], kept=(folder,))
    other = tmp_path / "results" / "other"  # --overwrite sets another run's folder aside: it is put back
    shutil.copytree(REPO / "results" / "toy-pair", other)
    _refused_after_loading(tmp_path, [*args, "--out", str(other), "--overwrite"], kept=(other,))
    assert not (other / ".replaced").exists()


def test_a_refusal_after_records_were_appended_keeps_them(scaled_head, tmp_path):
    out = tmp_path / "run"
    result = run_cli("run", "nll", "-m", "diff=toy-diff", "-m", f"base={scaled_head}", "--ctx", "1k", "--out", str(out))
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [SCALED], result.stderr
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert rows and {row["model"] for row in rows} == {"diff"}
    assert json.loads((out / "run.json").read_text())["config"]["task"] == "nll"


def test_an_option_stored_where_it_acts_on_nothing_leaves_the_identity_and_the_view_as_its_default():
    """An older version stored another probe's option (ignored then, refused now): the command without it resumes
    that folder, and the viewer rebuilds its config."""
    from diffeval.view.data import config_from_run

    config = build_config("distractor-attention", {"probe": "vt"}, {"models": ["diff=toy-diff", "base=toy-base"]})
    stored = config.to_dict()
    stored["options"]["keys"] = 8  # mk-niah's: vt never read it
    assert config.identity_of(stored) == config.identity()
    assert config_from_run({"config": stored}).identity() == config.identity()


def test_a_folder_input_hashes_what_a_tool_reads_not_what_it_leaves(tmp_path):
    """lm-eval's import writes __pycache__ beside an --include-path's task code; editors leave hidden files."""
    from diffeval.config import content_sha256, folder_files

    (tmp_path / "task.yaml").write_text("task: mine\n")
    before = content_sha256(folder_files(str(tmp_path)))
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "utils.cpython-311.pyc").write_bytes(b"compiled")
    (tmp_path / ".task.yaml.swp").write_bytes(b"swap")
    assert content_sha256(folder_files(str(tmp_path))) == before
    (tmp_path / "task.yaml").write_text("task: edited\n")
    assert content_sha256(folder_files(str(tmp_path))) != before
