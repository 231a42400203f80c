"""LongBench v2: pred.py's answer extraction, the loader on its three file forms and the fixture, the middle truncation
on two tokenizers, both modes through the command line with resume, the choice mode's log-likelihoods against a
forward pass of the model, and each bad input in one line."""

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import pair_options, run_cli_in_process
from diffeval.data import longbench2 as data
from diffeval.errors import InputError
from diffeval.models import backend as backend_module
from diffeval.models.backend import Engine
from diffeval.models.checkpoints.loading import load_model
from diffeval.models.engines.hf import HFBackend
from diffeval.models.spec import ModelSpec
from diffeval.tasks.choices import longbench2, longbench2_prompts
from diffeval.tasks.choices.longbench2_options import LongBench2Options

FIXTURE = Path(longbench2.__file__).resolve().parents[2] / "fixtures" / "longbench2.json"


@pytest.mark.parametrize(
    ("response", "letter"),
    [
        ("The correct answer is (B)", "B"),
        ("  The correct answer is (D).\nBecause the text says so.", "D"),
        ("**The correct answer is (A)**", "A"),  # markdown bold is removed before matching
        ("The correct answer is **(C)**", "C"),
        ("The correct answer is C", "C"),  # the fallback without parentheses
        ("I think the correct answer is (B)", None),  # the rule is case-sensitive, as pred.py's
        ("The correct answer is (E)", None),
        ("(A)", None),
        ("", None),
        ("The correct answer is (A) or The correct answer is (B)", "A"),  # the first match
    ],
)
def test_extract_answer_reads_as_pred_py(response, letter):
    assert longbench2_prompts.extract_answer(response) == letter


def _rows() -> list[dict]:
    return json.loads(FIXTURE.read_text())


def test_the_fixture_covers_the_dataset_s_labels():
    questions = data.load(str(FIXTURE.parent))
    assert len(questions) == 10 and questions[0].id == "fixture-00"
    assert {q.difficulty for q in questions} == set(data.DIFFICULTIES)
    assert {q.length for q in questions} == set(data.LENGTH_LABELS)
    assert len({q.domain for q in questions}) == 6 and {q.answer for q in questions} == set(data.LETTERS)


def test_json_list_jsonl_and_parquet_give_the_same_questions(tmp_path):
    import pandas as pd

    rows = _rows()[:4]
    (tmp_path / "data.json").write_text(json.dumps(rows))
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pd.DataFrame(rows).to_parquet(tmp_path / "rows.parquet")
    loaded = [data.load(str(tmp_path / name)) for name in ("data.json", "rows.jsonl", "rows.parquet")]
    assert loaded[0] == loaded[1] == loaded[2] and len(loaded[0]) == 4
    assert data.load(str(tmp_path)) == loaded[0]  # a folder holding the official data.json
    assert loaded[0][1].choices == tuple(rows[1][f"choice_{x}"] for x in "ABCD")


def test_filters_select_and_unknown_values_are_refused():
    chosen = data.selected(str(FIXTURE), ["Single-Document QA"], ["easy"], [])
    assert [q.id for q in chosen] == ["fixture-00", "fixture-02"]
    assert [q.length for q in data.selected(str(FIXTURE), [], [], ["long"])] == ["long"] * 3
    with pytest.raises(InputError, match="holds no such domain: use any of Code Repository"):
        data.selected(str(FIXTURE), ["Poetry"], [], [])


def _context(**options) -> SimpleNamespace:
    values = {"ctx": [512], "data_dir": str(FIXTURE), **options}
    return SimpleNamespace(options=LongBench2Options(**values), chat_template=False, thinking_budget=None)


@pytest.mark.transformers_floor
def test_middle_truncation_fits_each_tokenizer_to_the_same_budget(tiny_models):
    """One document, two tokenizers: each prompt fits its model's budget and fills it within 1 %, the document's
    first and last words kept and its middle cut."""
    words = " ".join(f"w{i}" for i in range(4000))
    question = replace(data.load(str(FIXTURE))[0], context="START " + words + " FINISH")
    budget = 512 - longbench2_prompts.MAX_NEW_TOKENS
    for name in ("diff", "base"):
        backend = HFBackend(load_model(ModelSpec(name, str(tiny_models[name])), "cpu"))
        ids, cut, text = longbench2_prompts.fit(question, backend, 512, _context())
        assert budget * 0.99 <= len(ids) <= budget and cut > 0
        assert "<text>\nSTART" in text and "FINISH\n</text>" in text and "w2000 " not in text
        assert text.endswith('"The correct answer is (insert answer here)".')


@pytest.mark.transformers_floor
def test_choice_log_likelihoods_equal_a_forward_pass(tiny_models):
    """The recorded log-likelihood of each letter is log-softmax of the model's logits over the whole prompt and
    letter, computed here in one plain forward pass."""
    import torch

    loaded = load_model(ModelSpec("diff", str(tiny_models["diff"])), "cpu")
    backend = HFBackend(loaded)
    context = _context(mode="choices", prompt="lm-eval")
    batch = longbench2.make_samples(context.options, 0, limit=3)
    records = [r.to_dict() for r in longbench2.evaluate(batch, backend, context)]
    for sample, record in zip(batch, records):
        _, _, text = longbench2_prompts.fit(sample.question, backend, 512, context)
        expected = []
        for letter in data.LETTERS:
            prompt, whole = backend.encode(text).ids, backend.encode(text + " " + letter).ids
            assert whole[: len(prompt)] == prompt
            with torch.no_grad():
                logits = loaded.model(torch.tensor([whole])).logits[0].float()
            logprobs = torch.log_softmax(logits, dim=-1)
            expected.append(sum(logprobs[i - 1, whole[i]].item() for i in range(len(prompt), len(whole))))
        assert record["choice_logprobs"] == pytest.approx(expected, abs=2e-3)
        assert record["prediction"] == data.LETTERS[max(range(4), key=expected.__getitem__)]


def _run(tmp_path, name: str, *args: str, models=()) -> tuple[object, list[dict]]:
    out = tmp_path / name
    result = run_cli_in_process("run", "longbench2", *models, "--data-dir", str(FIXTURE), "--out", str(out), *args)
    lines = (out / "samples.jsonl").read_text().splitlines() if (out / "samples.jsonl").exists() else []
    return result, [json.loads(line) for line in lines]


def test_generation_through_the_cli_scores_and_resumes(tiny_models, tmp_path):
    args = ("--ctx", "512", "--samples", "2")
    result, records = _run(tmp_path, "gen", *args, models=pair_options(tiny_models))
    assert result.returncode == 0, result.stderr
    assert len(records) == 4 and {r["model"] for r in records} == {"diff", "base"}
    for record in records:
        assert record["score"] == float(record["prediction"] == record["gold"])
        assert record["outcome"] == ("answered" if record["prediction"] else "unparsed")
        assert record["prompt_tokens"] <= 512 - 128 and "choice_logprobs" not in record
    table = (tmp_path / "gen" / "table.md").read_text()
    assert "Accuracy by domain" in table and "Accuracy by the dataset's length label" in table
    again, resumed = _run(tmp_path, "gen", *args, models=pair_options(tiny_models))
    assert again.returncode == 0 and resumed == records  # nothing run twice
    _, extended = _run(tmp_path, "gen", "--ctx", "512", "--samples", "3", models=pair_options(tiny_models))
    assert extended[:4] == records and len(extended) == 6


def test_choice_mode_on_the_built_in_pair(tmp_path):
    """The built-in pair (no -m), both prompts: four log-likelihoods and the best letter per record, documents cut."""
    for prompt in ("official", "lm-eval"):
        result, records = _run(tmp_path, prompt, "--ctx", "1k", "--mode", "choices", "--prompt", prompt)
        assert result.returncode == 0, result.stderr
        assert len(records) == 20 and {r["model"] for r in records} == {"diff", "base"}
        for record in records:
            values = record["choice_logprobs"]
            assert len(values) == 4 and all(v < 0 for v in values) and record["new_tokens"] == 0
            assert record["prediction"] == data.LETTERS[values.index(max(values))]
            assert record["prompt_tokens"] <= 1024
        assert any(r["truncated_tokens"] > 0 for r in records) and any(r["truncation"] == "none" for r in records)


def _one_line(result, expected: str) -> None:
    assert result.returncode == 2, result.stdout
    assert result.stderr.strip().splitlines() == [f"error: {expected}"], result.stderr


def test_bad_input_is_one_line(tiny_models, tmp_path, monkeypatch):
    model = ["-m", f"diff={tiny_models['diff']}"]
    other_schema = Path(longbench2.__file__).resolve().parents[2] / "fixtures" / "xsum.jsonl"
    malformed = tmp_path / "bad.json"
    malformed.write_text('[{"_id": "x",')
    a_dict = tmp_path / "dict.json"
    a_dict.write_text("{}")
    cases = {
        "missing": (["--data-dir", str(tmp_path / "none.json")], "no such file or folder"),
        "malformed": (["--data-dir", str(malformed)], "is not valid JSON (line 1"),
        "not a list": (["--data-dir", str(a_dict)], "holds a JSON dict, not a list of questions"),
        "another schema": (["--data-dir", str(other_schema)], "row 1 lacks _id, domain, sub_domain"),
        "empty folder": (["--data-dir", str(tmp_path)], "holds none of longbench2.json"),
    }
    for name, (args, said) in cases.items():
        result = run_cli_in_process("run", "longbench2", *model, *args, "--out", str(tmp_path / name))
        assert result.returncode == 2 and said in result.stderr, (name, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / name).exists()
    fixture = ["--data-dir", str(FIXTURE)]
    refusals = {
        "below the template": (["--ctx", "300"], "--ctx 300: the prompt without any document takes"),
        "below any prompt": (["--ctx", "200"], "context 200 leaves no room for a prompt: use at least 224"),
        "thinking in choice mode": (
            ["--mode", "choices", "--chat-template", "--thinking-budget", "16"],
            "--thinking-budget applies to --mode generate: a choice mode scores letters, nothing is generated to "
            "think before; leave it out",
        ),
        "lm-eval prompt when generating": (
            ["--prompt", "lm-eval"],
            "--prompt lm-eval is lm-eval's log-likelihood prompt: add --mode choices, or leave it out",
        ),
        "unknown mode": (["--mode", "cot"], "unknown --mode 'cot': use generate or choices"),
        "unknown difficulty": (["--difficulty", "medium"], "unknown --difficulty 'medium': use any of easy, hard"),
        "unknown length label": (
            ["--length-label", "huge"],
            "unknown --length-label 'huge': use any of short, medium, long",
        ),  # fmt: skip
        "unknown domain": (
            ["--domain", "Poetry"],
            "--domain 'Poetry': the data holds no such domain: use any of "
            "Code Repository Understanding, Long In-context Learning, Long Structured Data "
            "Understanding, Long-dialogue History Understanding, Multi-Document QA, Single-Document "
            "QA",
        ),  # fmt: skip
        "nothing selected": (
            ["--domain", "Multi-Document QA", "--length-label", "long"],
            "no question passes --domain, --difficulty and --length-label: widen them",
        ),  # fmt: skip
    }
    for name, (args, said) in refusals.items():
        out = tmp_path / name.replace(" ", "-")
        result = run_cli_in_process("run", "longbench2", *model, *fixture, *args, "--out", str(out))
        if name == "below the template":
            assert result.returncode == 2 and said in result.stderr and len(result.stderr.splitlines()) == 1
        else:
            _one_line(result, said)
        assert not out.exists()
    # an engine that generates but cannot score choices: the choice mode is refused before any work, generation runs
    monkeypatch.setitem(backend_module.BACKENDS, "gen-only", Engine("gen-only", "nowhere:X", frozenset({"generate"})))
    choices = ["--mode", "choices", "--backend", "gen-only", "--out", str(tmp_path / "g")]
    refused = run_cli_in_process("run", "longbench2", *model, *fixture, *choices)
    _one_line(refused, "task longbench2 needs score, which backend gen-only lacks: run it with --backend hf or vllm")
    assert longbench2.TASK.running.needs_for(LongBench2Options()) == {"generate"}


RESULTS = Path(__file__).resolve().parents[1] / "results" / "longctx-toy"


@pytest.mark.parametrize("mode", ["generate", "choices"])
def test_the_view_shows_the_question_the_gold_choice_and_each_model_s_answer(mode):
    """`diffeval view` on the committed reference runs: the choices with the gold one marked, and per model its
    output (generation) or its four log-likelihoods as bars, the chosen letter emphasised (choice mode)."""
    from diffeval.view.data import open_run, sample_detail, sample_index, summary

    view = open_run(0, RESULTS / ("longbench2" if mode == "generate" else "longbench2-choices"))
    detail = sample_detail(view, sample_index(view)["samples"][3])
    blocks = detail["view"]["blocks"]
    records = detail["records"]
    gold = next(iter(records.values()))["gold"]
    [choices] = [b for b in blocks if b.get("title", "").startswith("Choices")]
    assert choices["title"] == f"Choices (gold: {gold})" and f"({gold}) " in choices["pieces"][0]
    assert [line.startswith(f"({gold})") for line in choices["pieces"][0].splitlines() if "← gold" in line] == [True]
    if mode == "choices":
        for model, record in records.items():
            [bars] = [b for b in blocks if b["type"] == "bars" and b.get("model") == model]
            assert [b["value"] for b in bars["bars"]] == record["choice_logprobs"]
            assert [b["label"] for b in bars["bars"] if b["emphasis"]] == [record["prediction"]]
            assert [b["label"] for b in bars["bars"] if b["note"]] == [gold]
    else:
        [outputs] = [b for b in blocks if b["type"] == "outputs"]
        assert {row["model"]: row["text"] for row in outputs["rows"]} == {m: r["output"] for m, r in records.items()}
    assert {t["key"] for t in summary(view)["tables"]} >= {"accuracy", "by_domain", "by_length", "answers"}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_generation_answers_after_thinking_and_counts_unclosed_thinking(tiny_models, tmp_path_factory, backend):
    """Scripted reasoning models (tests/thinking_models.py) with --thinking-budget: the answer is read after a
    thinking that closed; a thinking that never closed has no answer and no score, and every table counts it."""
    from thinking_models import scripted_models

    if backend == "vllm":
        pytest.importorskip("vllm")
    paths = scripted_models(tmp_path_factory.mktemp("scripted_lb2"), tiny_models["tok_a"], "4071")
    out = tmp_path_factory.mktemp("lb2_thinking") / "run"
    models = ["-m", f"answers={paths['answers']}", "-m", f"loops={paths['loops']}"]
    result = run_cli_in_process(
        "run", "longbench2", *models, "--data-dir", str(FIXTURE), "--samples", "2", "--ctx", "1k", "--chat-template",
        "--thinking-budget", "24", "--backend", backend, "--device", "cpu", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    answers = [r for r in rows if r["model"] == "answers"]
    loops = [r for r in rows if r["model"] == "loops"]
    assert len(answers) == len(loops) == 2
    for row in answers:  # the thinking closed: an answer was read and scored (the script writes no letter)
        assert row["thinking_closed"] and row["thinking_tokens"] > 0 and row["outcome"] in ("answered", "unparsed")
        assert row["score"] == float(row["prediction"] == row["gold"])
    for row in loops:
        assert row["outcome"] == "thinking_unclosed" and row["score"] is None and row["correct"] is None
        assert row["thinking_tokens"] == 24 and row["output"] == "" and row["prediction"] is None
    report = (out / "table.md").read_text()
    assert "thinking never closed within --thinking-budget: answers 0, loops 2 samples" in report
    assert "thinking_unclosed" in (out / "answers.csv").read_text().splitlines()[0]


def test_the_fixture_ships_as_package_data():
    """`--data-dir package:fixtures` after `pip install`: a package-data pattern covers the fixture file."""
    import fnmatch

    import tomllib

    root = Path(__file__).resolve().parents[1]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["diffeval"]
    shipped = FIXTURE.relative_to(root / "diffeval").as_posix()
    assert any(fnmatch.fnmatch(shipped, pattern) and "/" in pattern for pattern in patterns), patterns
