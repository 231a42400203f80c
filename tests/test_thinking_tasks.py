"""Reasoning models, the tasks side (#51): --thinking-budget, --think-markers and --template-switch as run options of
needle, the probes and hallucination.

- A run without them keeps its identity hash, folder name and run.json (the options are identity="set").
- Their bad values are refused in one line, exit 2, before any work.
- The budget is reserved in every prompt beside the answer's, and the dry run counts both.
- Thinking that never closes within its budget is an outcome of its own: no answer, no score, counted in every table;
  the tables show the thinking length by cell.
- Through the command line, on scripted tiny models (tests/thinking_models.py): answered after thinking, answered
  wrong (the number only in the thinking), cut while thinking, on needle, a probe and hallucination.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from test_bad_input import assert_one_line

from conftest import run_cli_in_process
from diffeval.models.thinking import MARGIN, reserve
from diffeval.results import run_format
from diffeval.tasks import TASKS, build_config
from diffeval.tasks.base import ContextBudget, RunContext
from diffeval.tasks.conversations.judging import judge_generations
from diffeval.tasks.haystack import needle
from diffeval.tasks.haystack.recipe import prompt_budget
from diffeval.tasks.thinking import UNCLOSED

TOY = {"models": ["diff=toy-diff", "base=toy-base"]}
NEW_KEYS = {"thinking_budget", "think_markers", "template_switch"}

# identity hashes of runs without the thinking options, as the commit before them computed them (6b075d7)
HASHES_BEFORE = {
    ("needle", ()): "2da084f3de",
    ("needle", (("chat_template", True), ("max_new_tokens", 40))): "36059c0492",
    ("hallucination", (("judge", ("overlap",)),)): "aae21da776",
    ("hallucination", (("judge", ("overlap",)), ("chat_template", True))): "b784aedfda",
    ("mv-niah", ()): "f8036eee4f",
    ("vt", ()): "22ab261df1",
    ("cwe", ()): "8acaf6dd01",
    ("attention", ()): "53c70b32c6",
}


@pytest.mark.parametrize(("key", "expected"), HASHES_BEFORE.items(), ids=[t for t, _ in HASHES_BEFORE])
def test_a_run_without_a_budget_keeps_its_identity_folder_and_run_json(key, expected):
    task, values = key
    config = build_config(task, dict(values), dict(TOY))
    assert config.identity_hash() == expected
    assert config.out_dir().name == f"{task}-{expected}"
    stored = config.to_dict()
    assert not NEW_KEYS & set(stored) and not NEW_KEYS & set(config.identity())
    assert "judge_thinking_budget" not in stored["options"]
    assert "judge_thinking_budget" not in config.identity()["options"]
    assert run_format(config) == 1
    # a folder written before the options existed (no keys) has the same identity: it resumes
    assert config.identity_of(stored) == config.identity()


def test_a_budget_joins_the_identity_and_run_json():
    plain = build_config("needle", {"chat_template": True}, dict(TOY))
    budget = build_config("needle", {"chat_template": True, "thinking_budget": 64}, dict(TOY))
    assert budget.identity_hash() != plain.identity_hash()
    assert budget.to_dict()["thinking_budget"] == 64 and budget.identity()["thinking_budget"] == 64
    assert not {"think_markers", "template_switch"} & set(budget.to_dict())
    assert run_format(budget) == 2
    marked = build_config("needle", {"chat_template": True, "thinking_budget": 64, "think_markers": "<think>,</think>"},
                          dict(TOY))  # fmt: skip
    assert marked.think_markers == ["<think>", "</think>"] and marked.identity_hash() != budget.identity_hash()
    assert RunContext.of(marked).think_markers == ("<think>", "</think>")
    assert RunContext.of(marked).thinking_budget == 64
    switched = build_config("needle", {"chat_template": True, "template_switch": ["enable_thinking=false", "depth=2"]},
                            dict(TOY))  # fmt: skip
    assert switched.switches == {"enable_thinking": False, "depth": 2}
    assert switched.to_dict()["template_switch"] == ["enable_thinking=false", "depth=2"]
    assert switched.identity_hash() != plain.identity_hash() and run_format(switched) == 1


REFUSALS = {
    "budget without --chat-template": (
        ["run", "needle", "--thinking-budget", "16"],
        "--thinking-budget needs --chat-template: a reasoning model thinks in its chat template's assistant turn",
    ),
    "budget of 0": (
        ["run", "needle", "--chat-template", "--thinking-budget", "0"],
        "--thinking-budget 0: give at least 1",
    ),
    "budget leaving no room at that --ctx": (
        ["run", "needle", "--chat-template", "--ctx", "512", "--thinking-budget", "500"],
        "--thinking-budget 500 leaves no room for the answer at context 512: use at most --thinking-budget "
        f"{512 - needle.MIN_NEW_TOKENS - needle.MIN_PROMPT_TOKENS - MARGIN}, or a longer --ctx",
    ),
    "budget leaving no room on a probe": (
        ["run", "mk-niah", "--chat-template", "--ctx", "1k", "--thinking-budget", "1000"],
        "--thinking-budget 1000 leaves no room for the answer at context 1024",
    ),
    "budget leaving no room on hallucination": (
        ["run", "hallucination", "--judge", "overlap", "--dataset", "xsum", "--chat-template", "--ctx", "256",
         "--thinking-budget", "200"],
        "--thinking-budget 200 leaves no room for the answer at context 256",
    ),
    "markers without a budget": (
        ["run", "needle", "--chat-template", "--think-markers", "<think>,</think>"],
        "--think-markers applies only with --thinking-budget: leave it out",
    ),
    "one marker": (
        ["run", "needle", "--chat-template", "--thinking-budget", "16", "--think-markers", "<think>"],
        "--think-markers <think>: give START,END, two different markers, e.g. <think>,</think>",
    ),
    "the same marker twice": (
        ["run", "needle", "--chat-template", "--thinking-budget", "16", "--think-markers", "<t>,<t>"],
        "give START,END, two different markers",
    ),
    "a switch without --chat-template": (
        ["run", "needle", "--template-switch", "enable_thinking=false"],
        "--template-switch applies only with --chat-template: leave it out",
    ),
    "a switch without a value": (
        ["run", "needle", "--chat-template", "--template-switch", "enable_thinking"],
        "bad --template-switch 'enable_thinking': give NAME=VALUE, e.g. enable_thinking=false",
    ),
    "a switch that is no name": (
        ["run", "needle", "--chat-template", "--template-switch", "enable thinking=1"],
        "bad --template-switch 'enable thinking=1'",
    ),
    "a switch given twice": (
        ["run", "needle", "--chat-template", "--template-switch", "a=1", "--template-switch", "a=2"],
        "--template-switch a is given twice",
    ),
    "a budget on a task that generates nothing": (
        ["run", "attention", "--chat-template", "--thinking-budget", "16"],
        "No such option: --thinking-budget",
    ),
    "a budget in a preset of a task that generates nothing": (
        ["run", "attention", "--config", "{preset}"],
        "--thinking-budget does not apply to attention, only to needle, hallucination, mrcr, mk-niah",
    ),
    "a judge budget on the overlap judge": (
        ["run", "hallucination", "--judge", "overlap", "--judge-thinking-budget", "16"],
        "--judge-thinking-budget",
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_bad_thinking_options_are_refused_in_one_line(case, tmp_path, monkeypatch):
    args, message = REFUSALS[case]
    preset = tmp_path / "preset.yaml"
    preset.write_text("thinking_budget: 16\nchat_template: true\n")
    monkeypatch.chdir(tmp_path)
    assert_one_line(run_cli_in_process(*[arg.format(preset=preset) for arg in args]), message)
    assert list(tmp_path.iterdir()) == [preset]  # refused before any work: no folder


def test_the_budget_is_reserved_beside_the_answer():
    budget = ContextBudget([1024], answer=32, least_prompt=65, thinking=reserve(100))
    assert budget.thinking == 100 + MARGIN and budget.generated == 140
    budget.check()
    assert ContextBudget([1024], 32, 65).generated == 32  # no thinking: what it was
    config = build_config("needle", {"chat_template": True, "thinking_budget": 100, "max_new_tokens": 32,
                                     "ctx": "1024"}, dict(TOY))  # fmt: skip
    context = RunContext.of(config)
    assert needle.budget(context).thinking == 108
    sample = needle.RECIPE.make_sample(config.options, 0, 1024, 50, "1/1", 0)
    assert prompt_budget(needle.RECIPE, sample, None, context) == 1024 - 32 - 108
    plain = RunContext.of(build_config("needle", {"max_new_tokens": 32, "ctx": "1024"}, dict(TOY)))
    assert prompt_budget(needle.RECIPE, sample, None, plain) == 1024 - 32


# ---------------------------------------------------------------------------------------------------------------
# Tables on hand-written records


def _needle_rows(thinking: bool) -> list[dict]:
    rows = []
    for model in ("flash", "mini"):
        for ctx in (1024, 2048):
            for i in range(4):
                unclosed = thinking and model == "flash" and (i == 0 or (ctx == 2048 and i == 1))
                row = {
                    "model": model, "sample_id": f"{ctx}-{i}", "ctx": ctx, "depth": 50, "needles": 1, "queries": 1,
                    "numbers": ["1234567"], "expected": ["1234567"],
                    "output": "" if unclosed else (" 1234567" if i % 2 == 0 else " the"),
                    "score": None if unclosed else float(i % 2 == 0), "correct": None if unclosed else i % 2 == 0,
                    "hit_token_limit": False,
                }  # fmt: skip
                if thinking:
                    tokens = 24 if unclosed else 4 * (ctx // 1024) + i
                    row.update(outcome=UNCLOSED if unclosed else "answered", thinking="x", thinking_tokens=tokens,
                               thinking_closed=not unclosed, thinking_at_budget=unclosed)  # fmt: skip
                rows.append(row)
    return rows


def _report(task_name: str, rows: list[dict]) -> dict:
    task = TASKS[task_name]
    frame = pd.DataFrame(rows)
    if task.scoring.rescore is not None:
        frame = task.scoring.rescore(frame, next(iter(task.scoring.rules)))
    return task.reporting.tables(frame, task.options(), False)


def test_needle_tables_count_unclosed_thinking_and_show_its_length_by_cell():
    rows = _needle_rows(thinking=True)
    task = TASKS["needle"]
    rescored = task.scoring.rescore(pd.DataFrame(rows), "default")
    unclosed = rescored["outcome"] == UNCLOSED
    assert rescored.loc[unclosed, "score"].isna().all() and rescored.loc[unclosed, "correct"].isna().all()
    assert rescored.loc[~unclosed, "score"].notna().all()
    tables = _report("needle", rows)
    table2 = tables["table2"]
    assert table2.loc["flash", UNCLOSED] == 3 and table2.loc["mini", UNCLOSED] == 0
    assert table2.attrs["cells"]["columns"][-1] == {"outcome": UNCLOSED}
    # accuracy over the answered samples only: flash at 1K answered 3 (1 right of the 2 even ones left)
    assert table2.loc["flash", "1K N/R=1/1"] == pytest.approx(round(1 / 3, 3))
    answers = tables["answers"]
    assert answers.loc["flash", UNCLOSED] == 3 and answers.loc["mini", UNCLOSED] == 0
    assert answers.loc["mini", "thinking_tokens"] == pytest.approx((4 + 5 + 6 + 7 + 8 + 9 + 10 + 11) / 8)
    thinking = tables["thinking"]
    assert list(thinking.columns) == ["1024 thinking tokens", "1024 unclosed", "2048 thinking tokens", "2048 unclosed"]
    assert thinking.loc["flash", "1024 unclosed"] == 1 and thinking.loc["flash", "2048 unclosed"] == 2
    assert thinking.loc["mini", "1024 thinking tokens"] == pytest.approx(5.5)
    assert thinking.loc["mini", "2048 thinking tokens"] == pytest.approx(9.5)
    assert thinking.attrs["cells"]["columns"][1] == {"ctx": 1024, "outcome": UNCLOSED}
    for table in tables.values():
        assert "thinking never closed within --thinking-budget: flash 3, mini 0 samples" in table.attrs["note"]
    assert "thinking" in task.reporting.titles and task.reporting.decimals[UNCLOSED] == 0


def test_tables_of_a_run_without_thinking_are_unchanged():
    tables = _report("needle", _needle_rows(thinking=False))
    assert "thinking" not in tables and UNCLOSED not in tables["table2"] and UNCLOSED not in tables["answers"]
    assert not any("thinking" in (t.attrs.get("note") or "") for t in tables.values())


def test_probe_tables_count_unclosed_thinking():
    rows = []
    for row in _needle_rows(thinking=True):
        row = {k: v for k, v in row.items() if k not in ("needles", "queries", "numbers")}
        rows.append({**row, "setting": "4", "seed": 0, "index": 0, "distractor_values": ["7654321"]})
    tables = _report("mk-niah", rows)
    assert tables["scores"].loc["flash", UNCLOSED] == 3 and tables["answers"].loc["flash", UNCLOSED] == 3
    assert tables["thinking"].loc["flash", "2048 unclosed"] == 2
    assert "flash 3, mini 0 samples" in tables["floor"].attrs["note"]


def _hallucination_rows() -> list[dict]:
    rows = []
    for model in ("flash", "mini"):
        for i in range(3):
            unclosed = model == "flash" and i == 0
            rows.append({
                "model": model, "sample_id": f"xsum-{i}", "dataset": "xsum", "id": f"fixture-{i}",
                "verdict": None if unclosed else True, "score": None if unclosed else 1.0, "judge": "overlap",
                "judge_kind": "proxy", "truncated_tokens": 0, "outcome": UNCLOSED if unclosed else "faithful",
                "output": "" if unclosed else "A summary.", "thinking": "x", "thinking_tokens": 16 if unclosed else 3,
                "thinking_closed": not unclosed, "thinking_at_budget": unclosed,
            })  # fmt: skip
    return rows


def test_hallucination_tables_count_unclosed_thinking():
    tables = _report("hallucination", _hallucination_rows())
    table = tables["table4_proxy"]
    assert table.loc["flash", UNCLOSED] == 1 and table.loc["mini", UNCLOSED] == 0
    assert table.loc["flash", "xsum"] == 1.0  # the unclosed sample is left out, not scored 0
    judging = tables["judging"]
    assert judging.loc[("flash", "xsum"), UNCLOSED] == 1
    assert judging.loc[("flash", "xsum"), "thinking_tokens"] == pytest.approx((16 + 3 + 3) / 3)
    assert "flash 1, mini 0 samples" in table.attrs["note"]


def test_unclosed_thinking_is_never_judged():
    rows = [{**row, "output": row["output"]} for row in _hallucination_rows()]
    for row in rows:
        for key in ("verdict", "score", "judge", "judge_kind", "outcome"):
            row.pop(key)
        row.update(task="hallucination", prompt_tokens=10, new_tokens=3, seconds=0.1)
    rows[0]["outcome"] = UNCLOSED
    seen: list = []

    class Judge:
        id, kind, batch = "fake", "proxy", 8

        def judge(self, items):
            seen.extend(items)
            from diffeval.judges import Verdict

            return [Verdict(True, "fine") for _ in items]

        def close(self):
            pass

    records = list(judge_generations(rows, lambda live: list(live), lambda spec: Judge(), ["fake"]))
    assert len(seen) == len(rows) - 1 and rows[0] not in seen
    first = records[0].fields
    assert first["outcome"] == UNCLOSED and first["verdict"] is None and first["score"] is None
    assert first["judge_rationale"] == "thinking never closed within --thinking-budget"
    assert all(r.fields["outcome"] == "faithful" for r in records[1:])


# ---------------------------------------------------------------------------------------------------------------
# Through the command line, on scripted tiny models (tests/thinking_models.py): each outcome on needle, a probe and
# hallucination, on both engines (vLLM in its own tier)

ENGINES = ["hf", pytest.param("vllm", marks=pytest.mark.vllm)]
CTX = "512"
BUDGET = 24


def _needle_number() -> tuple[int, str]:
    """A seed whose needle (512 tokens, depth 50, N/R 1/1, first sample) has a number of distinct digits: the scripts'
    walks give each digit one successor."""
    options = build_config("needle", {"ctx": CTX, "depths": "50"}, dict(TOY)).options
    for seed in range(200):
        number = needle.RECIPE.make_sample(options, seed, int(CTX), 50, "1/1", 0).expected[0]
        if len(set(number)) == len(number):
            return seed, number
    raise AssertionError("no seed below 200 gives a needle number of distinct digits")


@pytest.fixture(scope="module")
def scripted(tiny_models, tmp_path_factory) -> dict:
    from thinking_models import scripted_models

    seed, number = _needle_number()
    paths = scripted_models(tmp_path_factory.mktemp("scripted_tasks"), tiny_models["tok_a"], number)
    return {"seed": seed, "number": number, **paths}


def _engine(backend: str) -> list[str]:
    if backend == "vllm":
        pytest.importorskip("vllm")
    return ["--backend", backend, "--device", "cpu"]


def _models(scripted: dict, *names: str) -> list[str]:
    return [arg for name in names for arg in ("-m", f"{name}={scripted[name]}")]


def _records(folder: Path) -> dict[str, dict]:
    rows = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    return {row["model"]: row for row in rows}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ENGINES)
def test_needle_each_outcome_through_the_command_line(scripted, backend, tmp_path):
    out = tmp_path / "needle"
    result = run_cli_in_process(
        "run", "needle", *_models(scripted, "answers", "wrong", "loops"), "--seed", str(scripted["seed"]),
        "--ctx", CTX, "--depths", "50", "--samples", "1", "--chat-template", "--thinking-budget", str(BUDGET),
        *_engine(backend), "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    records, number = _records(out), scripted["number"]
    answers, wrong, loops = records["answers"], records["wrong"], records["loops"]
    # answered after thinking: the number in the answer, scored right
    assert answers["outcome"] == "answered" and answers["correct"] is True and answers["score"] == 1.0
    assert number in answers["output"] and number not in answers["thinking"] and answers["thinking_closed"]
    # answered wrong: the number only in the thinking, the answer scored (0), not the thinking
    assert wrong["outcome"] == "answered" and wrong["score"] == 0.0 and wrong["correct"] is False
    assert number in wrong["thinking"] and number not in wrong["output"]
    # cut while thinking: its own outcome, no answer, no score
    assert loops["outcome"] == UNCLOSED and loops["score"] is None and loops["correct"] is None
    assert loops["thinking_tokens"] == BUDGET and loops["thinking_at_budget"] and not loops["thinking_closed"]
    assert loops["output"] == "" and loops["hit_token_limit"] is False
    # the envelope counts every generated token: the thinking's and the answer's
    assert loops["new_tokens"] == BUDGET and answers["new_tokens"] > answers["thinking_tokens"]
    run = json.loads((out / "run.json").read_text())
    assert run["run_format"] == 2 and run["config"]["thinking_budget"] == BUDGET
    assert all(run["models"][name]["thinking"]["source"] == "tokenizer" for name in ("answers", "wrong", "loops"))
    assert run["models"]["loops"]["thinking"]["end"] == "</think>"
    # the report counts the unclosed thinking in every table and shows the thinking length by cell
    report = (out / "table.md").read_text()
    assert "thinking never closed within --thinking-budget: answers 0, wrong 0, loops 1 samples" in report
    assert "Thinking: mean tokens" in report
    table2 = pd.read_csv(out / "table2.csv", index_col=0)
    assert table2[UNCLOSED].to_dict() == {"answers": 0, "wrong": 0, "loops": 1}
    # the viewer reads the folder (format 2, null scores)
    viewed = run_cli_in_process("view", str(out), "--export", str(tmp_path / "page"))
    assert viewed.returncode == 0, viewed.stderr


@pytest.mark.slow
def test_the_dry_run_counts_both_budgets(scripted, tmp_path):
    def generated(*extra: str) -> int:
        result = run_cli_in_process(
            "run", "needle", *_models(scripted, "answers"), "--ctx", CTX, "--depths", "50", "--samples", "2",
            "--chat-template", "--dry-run", "--tokens-per-s", "1000", "--out", str(tmp_path / "dry"), *extra,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        row = next(line for line in result.stdout.splitlines() if line.strip().startswith("│ answers"))
        return int(row.split("│")[5].strip().replace(",", ""))

    assert generated("--thinking-budget", "100") == generated() + 2 * 100


@pytest.mark.slow
@pytest.mark.parametrize("backend", ENGINES)
def test_a_probe_answers_after_thinking_or_is_cut(scripted, backend, tmp_path):
    out = tmp_path / "mk"
    result = run_cli_in_process(
        "run", "mk-niah", *_models(scripted, "answers", "loops"), "--ctx", "1k", "--depths", "50", "--samples", "1",
        "--chat-template", "--thinking-budget", str(BUDGET), *_engine(backend),
        "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    answers = [row for row in rows if row["model"] == "answers"]
    loops = [row for row in rows if row["model"] == "loops"]
    assert answers and all(row["outcome"] == "answered" and row["score"] is not None for row in answers)
    assert loops and all(row["outcome"] == UNCLOSED and row["score"] is None for row in loops)
    assert f"answers 0, loops {len(loops)} samples" in (out / "table.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ENGINES)
def test_hallucination_answers_after_thinking_and_never_judges_unclosed_thinking(scripted, backend, tmp_path):
    out = tmp_path / "hall"
    fixtures = Path(__file__).resolve().parents[1] / "diffeval" / "fixtures"
    result = run_cli_in_process(
        "run", "hallucination", *_models(scripted, "answers", "loops"), "--judge", "overlap", "--dataset", "xsum",
        "--data-dir", str(fixtures), "--samples", "1", "--ctx", "1k", "--chat-template", "--thinking-budget",
        str(BUDGET), *_engine(backend), "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = _records(out)
    answers, loops = records["answers"], records["loops"]
    assert answers["outcome"] in ("faithful", "hallucinated") and answers["thinking_closed"]
    assert scripted["number"] in answers["output"] and answers["thinking_tokens"] > 0
    assert loops["outcome"] == UNCLOSED and loops["verdict"] is None and loops["score"] is None
    assert loops["judge_rationale"] == "thinking never closed within --thinking-budget"
    report = (out / "table.md").read_text()
    assert "answers 0, loops 1 samples" in report
    table4 = pd.read_csv(out / "table4_proxy.csv", index_col=0)
    assert table4[UNCLOSED].to_dict() == {"answers": 0, "loops": 1}  # a row though none of its samples was scored


@pytest.mark.slow
@pytest.mark.parametrize("backend", ENGINES)
def test_mrcr_answers_after_thinking_and_never_grades_unclosed_thinking(scripted, backend, tmp_path):
    out = tmp_path / "mrcr"
    result = run_cli_in_process(
        "run", "mrcr", *_models(scripted, "answers", "loops"), "--needles", "1", "--samples", "1", "--ctx", "2k",
        "--chat-template", "--thinking-budget", str(BUDGET), *_engine(backend), "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = _records(out)
    answers, loops = records["answers"], records["loops"]
    assert answers["outcome"] == "answered" and answers["thinking_closed"] and answers["thinking_tokens"] > 0
    assert answers["score"] == 0.0  # the script writes no random string: OpenAI's 0, graded after the thinking
    assert answers["rendering"] == "chat"
    assert answers["prompt_budget"] == 2048 - answers["answer_budget"] - (BUDGET + MARGIN)
    assert loops["outcome"] == UNCLOSED and loops["score"] is None and loops["output"] == ""
    assert "answers 0, loops 1 samples" in (out / "table.md").read_text()


@pytest.mark.slow
def test_a_template_switch_closes_the_thinking_in_the_prompt(scripted, tmp_path):
    out = tmp_path / "switch"
    result = run_cli_in_process(
        "run", "needle", *_models(scripted, "wrong"), "--seed", str(scripted["seed"]), "--ctx", CTX, "--depths", "50",
        "--samples", "1", "--chat-template", "--thinking-budget", str(BUDGET), "--template-switch",
        "enable_thinking=false", "--device", "cpu", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    record = _records(out)["wrong"]
    assert record["thinking_tokens"] == 0 and record["thinking_closed"] and record["outcome"] == "answered"
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["template_switch"] == ["enable_thinking=false"]


@pytest.mark.slow
def test_a_model_without_markers_is_refused_in_one_line(tiny_models, tmp_path, monkeypatch):
    from diffeval.models.tiny import thinking_tokenizer

    # tokenizer A with a chat template that names no marker, and no marker tokens
    model = tmp_path / "plain"
    import shutil

    shutil.copytree(tiny_models["base_a"], model)
    tokenizer = thinking_tokenizer(tiny_models["tok_a"], model, marker_tokens=False)
    tokenizer.chat_template = tokenizer.chat_template.replace("<think></think>", "")
    tokenizer.save_pretrained(model)
    monkeypatch.chdir(tmp_path)
    result = run_cli_in_process("run", "needle", "-m", f"plain={model}", "--ctx", CTX, "--chat-template",
                                "--thinking-budget", "16", "--device", "cpu")  # fmt: skip
    assert_one_line(result, "model plain has no thinking markers in its chat template or tokenizer")


def _rows_without_timing(folder: Path) -> list[dict]:
    rows = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    drop = ("seconds", "generation_batch")
    return sorted(({k: v for k, v in row.items() if k not in drop} for row in rows), key=lambda r: (r["model"],
                  r["sample_id"]))  # fmt: skip


@pytest.mark.vllm
@pytest.mark.parametrize("task", ["needle", "mk-niah", "hallucination", "mrcr"])
def test_hf_and_vllm_give_equal_thinking_records(scripted, task, tmp_path):
    pytest.importorskip("vllm")
    extra = {
        "needle": ["--seed", str(scripted["seed"]), "--ctx", CTX],
        "mk-niah": ["--ctx", "1k"],
        "hallucination": ["--judge", "overlap", "--dataset", "xsum", "--data-dir",
                          str(Path(__file__).resolve().parents[1] / "diffeval" / "fixtures"), "--ctx", "1k"],
        "mrcr": ["--needles", "1", "--ctx", "2k"],
    }[task]  # fmt: skip
    depths = [] if task in ("hallucination", "mrcr") else ["--depths", "50"]
    rows = {}
    for backend in ("hf", "vllm"):
        out = tmp_path / backend
        result = run_cli_in_process(
            "run", task, *_models(scripted, "answers", "wrong", "loops"), *extra, *depths, "--samples", "1",
            "--chat-template", "--thinking-budget", str(BUDGET), *_engine(backend), "--out", str(out),
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        rows[backend] = _rows_without_timing(out)
    assert rows["hf"] == rows["vllm"]
