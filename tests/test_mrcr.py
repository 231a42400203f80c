"""MRCR (tasks/conversations/mrcr.py, data/mrcr.py): OpenAI's grade on hand cases, the built conversations'
structure, token-exact fitting on different tokenizers, plain and chat rendering, OpenAI's rows from the fixture and a
parquet file, and records through the command line on the built-in pair, resumed. Bad input is
tests/test_damage_tasks.py's (MRCR); hf against vLLM is tests/test_mrcr_vllm.py's."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest
from test_chat_templates import TINY_TEMPLATE

from conftest import run_cli_in_process as run_cli
from diffeval.data import mrcr as data
from diffeval.errors import InputError
from diffeval.models.tokenizer import HFTokenizer, PromptTokenizer, render_plain
from diffeval.tasks.conversations import mrcr, turns
from diffeval.tasks.conversations.mrcr_options import MrcrOptions

FIXTURE = Path(__file__).resolve().parents[1] / "diffeval" / "fixtures" / "mrcr.jsonl"
PAIR = ["-m", "diff=toy-diff", "-m", "base=toy-base"]


def _tokenizer(folder: Path, name: str, template: str | None = None) -> PromptTokenizer:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(folder))
    if template is not None:
        hf.chat_template = template
    return PromptTokenizer(HFTokenizer(hf), name)


@pytest.mark.parametrize(
    ("response", "answer", "expected"),
    [
        ("ab12An owl sat.", "ab12An owl sat.", 1.0),  # reproduced exactly
        ("An owl sat.", "ab12An owl sat.", 0.0),  # the string missing: 0, however close the rest
        ("xab12An owl sat.", "ab12An owl sat.", 0.0),  # anything before the string: 0
        ("ab12hello", "ab12hallo", 0.8),  # 4 of 5 characters match on each side: 2 * 4 / 10
        ("ab12", "ab12An owl sat.", 0.0),  # the string alone: nothing matches the reply
    ],
)
def test_grade_is_openais_rule(response, answer, expected):
    assert mrcr.grade(response, answer, "ab12") == pytest.approx(expected)
    if response.startswith("ab12"):  # OpenAI's: SequenceMatcher(None, response, answer) without the string
        reference = difflib.SequenceMatcher(None, response[4:], answer[4:]).ratio()
        assert mrcr.grade(response, answer, "ab12") == reference


def test_a_reply_that_begins_with_whitespace_is_graded_as_a_chat_api_returns_it():
    assert mrcr.score(" ab12An owl sat.", "ab12An owl sat.", "ab12") == 1.0
    assert mrcr.grade(" ab12An owl sat.", "ab12An owl sat.", "ab12") == 0.0


def test_what_an_output_reproduces_is_told_apart_from_its_grade():
    conversation = data.build("copy|0", "book", 4, 2)
    messages, needles = conversation.messages(12)
    asked, rs = needles[1], conversation.random_string
    right = mrcr.copied(rs + conversation.needle_replies[1], rs, messages, asked, needles)
    assert right == {"copied": "asked", "copied_ratio": 1.0}
    wrong = conversation.needle_replies[3]  # the 4th needle's reply, without the string: graded 0
    assert mrcr.copied(wrong, rs, messages, asked, needles)["copied"] == "look-alike"
    assert mrcr.score(wrong, conversation.expected, rs) == 0.0
    filler = next(m["content"] for i, m in enumerate(messages) if m["role"] == "assistant" and i not in needles)
    assert mrcr.copied(" " + filler[:-3], rs, messages, asked, needles)["copied"] == "other"
    assert mrcr.copied("in in in in in", rs, messages, asked, needles)["copied"] == "none"
    partly = rs + conversation.needle_replies[1][: len(conversation.needle_replies[1]) // 2]
    ratio = difflib.SequenceMatcher(None, partly[len(rs) :], conversation.needle_replies[1]).ratio()
    assert mrcr.copied(partly, rs, messages, asked, needles)["copied_ratio"] == round(ratio, 4)


def test_a_built_conversation_has_openais_structure():
    conversation = data.build("t|0", "book", 4, None)
    assert conversation == data.build("t|0", "book", 4, None)  # pure and seeded
    messages, needles = conversation.messages(30)
    request = data.request(conversation.needle_format, conversation.needle_topic)
    users = [m["content"] for m in messages[:-1:2]]
    assert [messages[i - 1]["content"] for i in needles] == [request] * 4 and users.count(request) == 4
    look_alikes = [u for u in users if u != request]
    assert len(look_alikes) == 30 and all(u.startswith("write a") for u in users)
    allowed = {data.request(f, t) for f in conversation.formats for t in conversation.topics} - {request}
    assert set(look_alikes) <= allowed  # the conversation's few formats and topics
    assert any(conversation.needle_format in u or conversation.needle_topic in u for u in look_alikes)  # near-misses
    replies = [m["content"] for m in messages[1::2]]
    assert len(set(replies)) == len(replies)  # each reply a distinct passage
    assert [messages[i]["content"] for i in needles] == list(conversation.needle_replies)
    fillers = [r for i, r in enumerate(replies) if 2 * i + 1 not in needles]
    assert not any(n in f for n in conversation.needle_replies for f in fillers)
    index, rs = conversation.index, conversation.random_string
    assert messages[-1] == {"role": "user", "content": f"Prepend {rs} to the {data.ordinal(index)} (1 indexed) "
                            f"{request.split(' ', 2)[2]}. Do not include any other text in your response."}  # fmt: skip
    assert conversation.expected == rs + conversation.needle_replies[index - 1] and len(rs) == 10
    assert [data.ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd"]  # fmt: skip
    assert data.request("essay", "owls") == "write an essay about owls"


def _check_fit(tokenizer, conversation, budget: int, chat: bool) -> turns.Rendered:
    fitted = turns.fit_turns(tokenizer, conversation.messages, budget, chat)
    assert fitted.fillers >= 2  # the budget holds filler turns beside the needles
    assert 0.99 * budget <= len(fitted.ids) <= budget, (len(fitted.ids), budget)
    assert len(tokenizer.encode(tokenizer.render_messages(fitted.messages, chat)).ids) == len(fitted.ids)
    messages, needles = conversation.messages(fitted.fillers, fitted.last_words)
    assert messages == fitted.messages
    # the same stream for every model: its filler replies are the stream's, in order, the last one cut or continued
    fillers = [m["content"] for i, m in enumerate(messages[:-1]) if m["role"] == "assistant" and i not in needles]
    whole = [conversation.fillers.turn(i)[1] for i in range(fitted.fillers - 1)]
    assert fillers[:-1] == whole and len(fillers[-1].split()) == fitted.last_words
    for i in needles:  # each needle reply's token span decodes to the reply
        start, end = fitted.spans[i]
        assert messages[i]["content"][:20] in tokenizer.decode(fitted.ids[start:end])
    return fitted


@pytest.mark.parametrize("budget", [2000, 6000])
def test_fitting_is_token_exact_on_two_tokenizers(tiny_models, budget):
    conversation = data.build("fit|0", "book", 2, None)
    a = _check_fit(_tokenizer(tiny_models["tok_a"], "a"), conversation, budget, False)
    b = _check_fit(_tokenizer(tiny_models["tok_b"], "b"), conversation, budget, False)
    assert a.fillers != b.fillers or a.last_words != b.last_words  # each cut the stream at its own budget


def test_fitting_on_real_tokenizers_in_their_chat_rendering():
    from real_checkpoints import llama3_tokenizer, mistral_tokenizer

    folders = {"mistral": mistral_tokenizer(), "llama3": llama3_tokenizer()}
    if any(isinstance(f, str) for f in folders.values()):
        pytest.skip(f"real tokenizers unavailable: {[f for f in folders.values() if isinstance(f, str)]}")
    conversation = data.build("fit|1", "book", 4, 2)
    for name, folder in folders.items():
        tokenizer = _tokenizer(folder, name, TINY_TEMPLATE)
        fitted = _check_fit(tokenizer, conversation, 2000, True)
        assert fitted.text.count("[USER]") == len(fitted.messages) and fitted.text.endswith(" [ASSISTANT] ")


def test_plain_and_chat_renderings_and_the_refusal(tiny_models):
    messages = [{"role": "user", "content": "write a poem about owls"}, {"role": "assistant", "content": "An owl."},
                {"role": "user", "content": "Prepend x to the 1st (1 indexed) poem about owls."}]  # fmt: skip
    assert render_plain(messages) == ("User: write a poem about owls\n\nAssistant: An owl.\n\nUser: Prepend x to the "
                                      "1st (1 indexed) poem about owls.\n\nAssistant:")  # fmt: skip
    plain = _tokenizer(tiny_models["tok_a"], "plain")
    assert plain.render_messages(messages, False) == render_plain(messages)
    with pytest.raises(InputError, match="model plain has no chat template in its tokenizer: pass --rendering plain"):
        plain.render_messages(messages, True)
    chat = _tokenizer(tiny_models["tok_a"], "chat", TINY_TEMPLATE)
    rendered = turns.render(chat, messages, True)
    assert rendered.text == ("[USER] write a poem about owls [/USER][USER] An owl. [/USER][USER] Prepend x to the 1st "
                             "(1 indexed) poem about owls. [/USER] [ASSISTANT] ")  # fmt: skip
    assert chat.decode(rendered.ids[slice(*rendered.spans[1])]).strip() == "An owl."


def test_openais_rows_from_the_fixture_and_from_parquet(tmp_path):
    rows = data.load(str(FIXTURE), [2, 4])
    assert [r.n_needles for r in rows] == [2, 2, 4, 4, 2] and [r.id for r in rows] == ["0", "1", "2", "3", "4"]
    raw = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    for row, item in zip(rows, raw):
        assert len(row.needle_messages) == row.n_needles and row.desired_msg_index in row.needle_messages
        assert row.answer == row.random_string_to_prepend + row.messages[row.desired_msg_index]["content"]
        assert f"to the {data.ordinal(row.index)} (1 indexed)" in row.messages[-1]["content"]
        assert len(row.messages) == item["total_messages"]
    assert [r.id for r in data.load(str(FIXTURE), [4], count=1)] == ["2"]
    import pandas as pd

    pd.DataFrame(raw).to_parquet(tmp_path / "mrcr.parquet")
    assert data.load(str(tmp_path), [2, 4]) == rows  # a folder's mrcr.parquet, read first
    with pytest.raises(InputError, match="holds no row with 8 needles"):
        data.load(str(FIXTURE), [8])


def _records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines() if line.strip()]


def test_records_through_the_command_line_and_resume(tmp_path):
    out = tmp_path / "run"
    args = ["run", "mrcr", *PAIR, "--rendering", "plain", "--ctx", "1k", "--needles", "2", "--samples", "2",
            "--out", str(out)]  # fmt: skip
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    records = _records(out)
    assert {(r["model"], r["n_needles"], r["ctx"]) for r in records} == {("diff", 2, 1024), ("base", 2, 1024)}
    assert len(records) == 4
    for r in records:
        assert (
            r["rendering"] == "plain"
            and r["source"] == "generated"
            and r["expected"].startswith(r["random_string_to_prepend"])
        )
        assert r["score"] == mrcr.score(r["output"], r["expected"], r["random_string_to_prepend"])
        assert r["copied"] in ("asked", "look-alike", "other", "none") and 0 <= r["copied_ratio"] <= 1
        assert 0.99 * r["prompt_budget"] <= r["prompt_tokens"] <= r["prompt_budget"]
        assert r["prompt_budget"] == 1024 - r["answer_budget"] and r["distance_to_end"] > r["distance_to_last_needle"]
    assert "rendering: plain" in (out / "table.md").read_text()
    kept = (out / "samples.jsonl").read_text().splitlines()
    (out / "samples.jsonl").write_text("\n".join(kept[:2]) + "\n")  # a run cut short after two records
    again = run_cli(*args)
    assert again.returncode == 0, again.stderr
    resumed = _records(out)
    assert resumed[:2] == records[:2] and len(resumed) == 4
    assert sorted((r["model"], r["sample_id"], r["output"]) for r in resumed) == sorted(
        (r["model"], r["sample_id"], r["output"]) for r in records
    )  # greedy: the same outputs again


def test_openais_fixture_through_the_command_line(tmp_path):
    out = tmp_path / "openai"
    result = run_cli("run", "mrcr", *PAIR, "--rendering", "plain", "--source", "openai", "--data-dir",
                     "package:fixtures", "--ctx", "256,1k", "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = _records(out)
    assert len(records) == 10 and {r["ctx"] for r in records} == {1024}  # each fits 1K, none 256 beside its answer
    assert all(r["source"] == "openai" and r["prompt_tokens"] + r["answer_budget"] <= 1024 for r in records)
    short = tmp_path / "short"
    result = run_cli("run", "mrcr", *PAIR, "--rendering", "plain", "--source", "openai", "--data-dir",
                     "package:fixtures", "--ctx", "256", "--out", str(short))  # fmt: skip
    assert result.returncode == 0, result.stderr
    too_long = _records(short)
    assert len(too_long) == 10 and all(r["outcome"] == "too_long" and r["score"] is None for r in too_long)
    assert "| diff    |         5 |          5 |" in (short / "table.md").read_text()  # counted, not dropped


def test_the_distractor_attention_probe_reads_the_asked_reply_against_its_look_alikes(tmp_path):
    out = tmp_path / "attention"
    result = run_cli("run", "distractor-attention", *PAIR, "--probe", "mrcr", "--rendering", "plain", "--ctx", "1k",
                     "--needles", "2", "--samples", "1", "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = {r["model"]: r for r in _records(out)}
    for model, maps in (("diff", {"A1", "A2", "diff"}), ("base", {"softmax"})):
        record = records[model]
        assert set(record["shares"]) == maps and record["setting"] == "2 needles" and record["probe"] == "mrcr"
        assert min(record["tokens"][s] for s in ("answer", "needles", "noise", "scaffold")) > 0
        assert record["tokens"]["sink"] == 1 and sum(record["tokens"].values()) == record["prompt_tokens"]
    # the same conversation as mrcr's own run: the asked reply's tokens are those of one needle reply
    sample = mrcr.make_samples(MrcrOptions(ctx=[1024], needles=[2], samples=1, rendering="plain"), 0)[0]
    assert records["diff"]["key"] == sample.conversation.key and records["diff"]["index"] == sample.conversation.index
    assert "Attention on the answer's sentences against the distractors'" in (out / "table.md").read_text()
