"""`--chat-template` on every task that prompts a model (needle, attention, ICL, hallucination): each prompt rendered
with the checkpoint's own template and its generation prompt, shown exactly on SmolLM2-135M-Instruct's real template
(tokenizer only: no weights), still inside the token budget; refused, in one line before any work, on a checkpoint
without a template and on a task that builds no prompt."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_bad_input import assert_one_line

from conftest import run_cli, run_cli_in_process
from diffeval.data import hallucination as hallucination_data
from diffeval.models.checkpoints.loading import load_tokenizer
from diffeval.models.spec import ModelSpec
from diffeval.models.tokenizer import HFTokenizer, PromptTokenizer, encode_choices_in_context, encode_in_context
from diffeval.tasks.analyses import attention
from diffeval.tasks.analyses.attention import AttentionOptions
from diffeval.tasks.choices import icl
from diffeval.tasks.choices import icl_demonstrations as demos
from diffeval.tasks.choices import prompts as choice_prompts
from diffeval.tasks.choices.icl_options import IclOptions
from diffeval.tasks.conversations import prompts as conversation_prompts
from diffeval.tasks.haystack import needle, recipe, samples
from diffeval.tasks.haystack.needle_options import NeedleOptions

FIXTURES = Path(__file__).resolve().parents[1] / "diffeval" / "fixtures"
# SmolLM2's template: a default system turn when the messages have none, then the user turn, then the generation
# prompt that opens the assistant's turn
SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
USER = "<|im_start|>user\n"
ASSISTANT = "<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def smol(smollm2) -> PromptTokenizer:
    """SmolLM2's tokenizer and chat template, read from the GGUF header: what every task sizes and fits prompts with."""
    return PromptTokenizer(HFTokenizer(load_tokenizer(ModelSpec.parse(f"smol={smollm2}"))), "smol")


def _special(tokenizer: PromptTokenizer, ids: list[int]) -> str:
    """The ids as text with the template's special tokens kept."""
    return tokenizer.tokenizer.hf.decode(ids, skip_special_tokens=False)


def _needle_config(options, chat_template: bool = True):
    return SimpleNamespace(options=options, max_new_tokens=None, chat_template=chat_template)


@pytest.mark.slow
def test_needle_prompt_is_the_raw_prompt_in_smollm2s_turns(smol):
    """The instruction, haystack and question are the user turn; the answer prefix opens the assistant's turn; the
    haystack is cut so that the whole, template included, fills ctx minus the answer's tokens."""
    sample = needle.make_sample(0, 1024, 50, 1, 1, 0)
    config = _needle_config(NeedleOptions(ctx=[1024]))
    prompt, limit = recipe.fitted_prompt(needle.RECIPE, sample, smol, config), needle.token_limit(sample, smol, config)
    start, end = prompt.spans["haystack"]
    haystack = prompt.text[prompt.offsets[start][0] : prompt.offsets[end - 1][1]]
    question, prefix = needle.question(sample.extra["cities"][:1]), needle.answer_prefix(sample.extra["cities"][:1])
    user = needle.INSTRUCTION + "\n\n" + haystack + "\n\n" + question
    assert prompt.text == SYSTEM + USER + user + ASSISTANT + prefix
    assert needle.needle_sentence(sample.extra["cities"][0], sample.extra["numbers"][0]) in haystack
    # the same words make the raw prompt: the user turn is it, less the space that joined it to the answer prefix
    layout = samples.layout(sample)
    assert layout.head + haystack + layout.tail + layout.answer_prefix == user + " " + prefix
    assert prompt.ids == smol.encode(prompt.text).ids and _special(smol, prompt.ids[:1]) == "<|im_start|>"
    assert 0.99 * 1024 - limit <= len(prompt.ids) <= 1024 - limit
    (n_start, n_end) = prompt.spans["numbers"][0]
    assert smol.decode(prompt.ids[n_start:n_end]).strip() == sample.extra["numbers"][0]


@pytest.mark.slow
def test_attention_spans_point_inside_smollm2s_template(smol):
    """The attention analysis reads the needle prompt: its answer, needle and noise segments are the same tokens
    inside the rendered template, and the template's own tokens are scaffold; the teacher-forced answer follows the
    answer prefix in the assistant's turn."""
    sample = needle.make_sample(0, 1024, 50, 3, 1, 0)
    config = _needle_config(AttentionOptions(ctx=[1024], rows="answer"))
    prompt, limit = recipe.fitted_prompt(needle.RECIPE, sample, smol, config), needle.token_limit(sample, smol, config)
    extended = encode_in_context(smol, prompt.text, [" " + ", ".join(sample.expected)])
    ids = extended.prefix + extended.tails[0]
    assert _special(smol, ids[len(prompt.ids) :]).strip() == sample.extra["numbers"][0]
    segments = attention.segment_ids(prompt, len(ids), len(sample.expected), "answer")
    tokens = {name: [i for i, s in enumerate(segments) if s == attention.SEGMENTS.index(name)] for name in
              attention.SEGMENTS}  # fmt: skip
    assert smol.decode([ids[i] for i in tokens["answer"]]).strip() == sample.extra["numbers"][0]
    needles = _special(smol, [ids[i] for i in tokens["needles"]])
    assert all(city in needles for city in sample.extra["cities"]) and sample.extra["numbers"][1] in needles
    turns = [i for i, token in enumerate(ids) if _special(smol, [token]) in ("<|im_start|>", "<|im_end|>")]
    assert len(turns) == 5 and tokens["sink"] == [0]  # system start/end, user start/end, assistant start
    assert all(segments[i] == attention.SEGMENTS.index("scaffold") for i in turns[1:])
    user_start, user_end = turns[2], turns[3]
    assert user_start < min(tokens["noise"]) and max(tokens["noise"] + tokens["needles"]) < user_end
    assert _special(smol, ids[: user_start + 1]) == SYSTEM + "<|im_start|>"
    tail = _special(smol, ids[user_end : len(prompt.ids)])
    assert tail == ASSISTANT + needle.answer_prefix(sample.extra["cities"][:1])
    assert len(prompt.ids) <= 1024 - limit


@pytest.mark.slow
def test_icl_demonstrations_are_the_user_turn_and_the_label_the_reply(smol):
    """Demonstrations and query in the user turn, each label scored as the assistant's whole reply: the ids after
    the generation prompt, tokenized in context; the prompt, template and longest label included, fits ctx."""
    run = demos.Run("trec", 4, "random", 0, 0)
    data = demos.dataset("trec", str(FIXTURES))
    block = demos.demonstration_block(run, str(FIXTURES), 0)
    queries = [demos.format_example("trec", data.test[i].text, None) for i in (0, 1)]
    context, tails, choices = choice_prompts.prompt_texts(block, queries, data.labels, smol, True, "smol")
    assert context == SYSTEM + USER + block and tails == [q + ASSISTANT for q in queries]
    assert choices == data.labels
    first = data.test[0]
    assert context + tails[0] + choices[first.label] == (
        SYSTEM + USER + block + f"Question: {first.text}\nType:" + ASSISTANT + data.labels[first.label]
    )
    prefix, query_ids, choice_ids = encode_choices_in_context(smol, context, tails, choices)
    for i, query in enumerate(tails):
        for j, label in enumerate(choices):
            assert prefix + query_ids[i] + choice_ids[i][j] == smol.encode(context + query + label).ids
            assert _special(smol, choice_ids[i][j]) == label
        assert _special(smol, query_ids[i]).endswith(ASSISTANT)
    assert len(prefix) + max(len(q) + max(map(len, c)) for q, c in zip(query_ids, choice_ids)) <= 1024
    # raw, as before: the block, the query, the label after a space
    assert choice_prompts.prompt_texts(block, queries, data.labels, smol, False, "smol") == (
        block,
        queries,
        [" " + label for label in data.labels],
    )


@pytest.mark.slow
def test_icl_max_shots_leaves_room_for_the_template(smol):
    """`shots=max` with the chat template counts the template's turns beside the demonstrations: fewer shots, and a
    longest prompt no longer than the raw one at its own `max`."""
    options = IclOptions(ctx=[256], shots=["max"], datasets=["trec"], test_size=12, data_dir=str(FIXTURES))
    data = demos.dataset("trec", str(FIXTURES))
    queries = [demos.format_example("trec", test.text, None) for test in data.test]
    shots, longest = {}, {}
    for chat in (False, True):
        config = SimpleNamespace(options=options, seed=0, chat_template=chat)
        shots[chat] = icl.resolve_max_shots(config, {"smol": smol.tokenizer})[("trec", 0)]
        block = demos.demonstration_block(demos.Run("trec", shots[chat], "random", 0, 0), str(FIXTURES), 0)
        prefix, query_ids, choice_ids = encode_choices_in_context(
            smol, *choice_prompts.prompt_texts(block, queries, data.labels, smol, chat, "smol")
        )
        longest[chat] = len(prefix) + max(len(q) + max(map(len, c)) for q, c in zip(query_ids, choice_ids))
    assert 0 < shots[True] < shots[False] < len(data.train) and longest[True] <= longest[False]


@pytest.mark.slow
def test_hallucination_document_and_question_are_the_user_turn(smol):
    """The dataset's template up to its answer prefix is the user turn, "Summary:" opens the reply; a document too
    long for the budget loses its middle, never the template's turns."""
    spec = hallucination_data.SPECS["xsum"]
    doc = hallucination_data.load("xsum", str(FIXTURES), 1)[0]
    ids, cut = conversation_prompts.fit_prompt(spec, doc, smol, 1024 - spec.max_new_tokens, chat_template=True)
    instruction = "Summarize the document above in one sentence."
    assert cut == 0
    assert _special(smol, ids) == SYSTEM + USER + f"Document: {doc.context}\n\n{instruction}" + ASSISTANT + "Summary:"
    long = hallucination_data.Document("long", " ".join([doc.context] * 40), "", doc.reference)
    ids, cut = conversation_prompts.fit_prompt(spec, long, smol, 1024 - spec.max_new_tokens, chat_template=True)
    text = _special(smol, ids)
    assert cut > 0 and 0.99 * 1024 - spec.max_new_tokens <= len(ids) <= 1024 - spec.max_new_tokens
    assert text.startswith(SYSTEM + USER + "Document: " + doc.context[:40])
    assert text.endswith(doc.context[-40:] + f"\n\n{instruction}" + ASSISTANT + "Summary:")
    qa = hallucination_data.SPECS["hotpotqa"]
    question = hallucination_data.Document("q", "Passage 1: Paris is in France.", "Where is Paris?", "France")
    text = _special(smol, conversation_prompts.fit_prompt(qa, question, smol, 1024 - qa.max_new_tokens, True)[0])
    assert text.startswith(SYSTEM + USER) and text.endswith("Question: Where is Paris?" + ASSISTANT + "Answer:")
    assert conversation_prompts.prompt_text(spec, doc.context, "", smol, False) == spec.template.format(
        context=doc.context, input=""
    )


@pytest.mark.slow
def test_smollm2_finds_the_needle_in_its_chat_template_through_the_cli(smollm2, tmp_path):
    """The real model, prompted in its own template, answers in the assistant's turn: the number, at both ends."""
    out = tmp_path / "needle-chat"
    result = run_cli("run", "needle", "-m", f"smol={smollm2}", "--ctx", "1k", "--chat-template", "--depths", "0,100",
                     "--samples", "1", "--out", str(out), timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "samples.jsonl").open()]
    assert len(records) == 2 and all(r["correct"] for r in records), [r["output"] for r in records]
    assert all(0.99 * 1024 <= r["prompt_tokens"] + r["max_new_tokens"] <= 1024 for r in records)
    assert json.loads((out / "run.json").read_text())["config"]["chat_template"] is True


# a plain template for the tiny checkpoints, which have none
TINY_TEMPLATE = (
    "{% for m in messages %}[USER] {{ m['content'] }} [/USER]{% endfor %}{% if add_generation_prompt %} [ASSISTANT] "
    "{% endif %}"
)


@pytest.fixture(scope="module")
def tiny_chat(tiny_models, tmp_path_factory) -> Path:
    """The tiny baseline with TINY_TEMPLATE in its tokenizer_config.json."""
    folder = tmp_path_factory.mktemp("tiny-chat") / "base"
    shutil.copytree(tiny_models["base"], folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TINY_TEMPLATE}))
    return folder


def test_a_checkpoint_without_a_template_is_refused_before_any_work(tiny_models, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs = {
        "needle": ["--depths", "0", "--samples", "1"],
        "icl": ["--dataset", "trec", "--data-dir", "package:fixtures", "--shots", "1"],
    }
    for task, extra in runs.items():
        result = run_cli_in_process("run", task, "-m", f"plain={tiny_models['base']}", "--ctx", "1k", *extra,
                                    "--chat-template")  # fmt: skip
        assert_one_line(result, "model plain has no chat template in its tokenizer: leave out --chat-template")
    assert not (tmp_path / "results").exists()


def test_a_task_that_builds_no_prompt_refuses_the_chat_template(tiny_models, tmp_path, monkeypatch):
    """outliers feeds plain text; quantize and zeroshot leave prompts to lm-eval: the flag is not theirs, and a preset
    that sets it is refused rather than ignored."""
    monkeypatch.chdir(tmp_path)
    flag = run_cli_in_process("run", "outliers", "-m", f"m={tiny_models['base']}", "--chat-template")
    assert flag.returncode == 2 and "No such option: --chat-template" in flag.stderr
    preset = tmp_path / "outliers.yaml"
    preset.write_text("task: outliers\nchat_template: true\n")
    result = run_cli_in_process("run", "outliers", "-m", f"m={tiny_models['base']}", "--config", str(preset))
    assert_one_line(result, "--chat-template does not apply to outliers, only to needle, attention, icl, hallucination")
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_tiny_runs_score_and_judge_in_the_template(tiny_chat, tmp_path):
    """ICL and hallucination through the CLI with --chat-template on a checkpoint that has one: every query is
    scored, every document generated and judged, each prompt longer by the template's turns than without."""
    tokens = {}
    for chat in ("--no-chat-template", "--chat-template"):
        for task, extra in {
            "icl": ["--dataset", "trec", "--shots", "2", "--orders", "random:1", "--test-size", "3"],
            "hallucination": ["--dataset", "xsum", "--samples", "2", "--judge", "overlap"],
        }.items():
            out = tmp_path / f"{task}{chat}"
            result = run_cli_in_process("run", task, "-m", f"m={tiny_chat}", "--ctx", "1k", "--data-dir",
                                        str(FIXTURES), *extra, chat, "--out", str(out))  # fmt: skip
            assert result.returncode == 0, result.stderr
            records = [json.loads(line) for line in (out / "samples.jsonl").open()]
            assert records and all(r.get("status", "ok") == "ok" and r["score"] is not None for r in records)
            tokens[task, chat] = [r["prompt_tokens"] for r in records]
    for task in ("icl", "hallucination"):
        assert all(c > p for c, p in zip(tokens[task, "--chat-template"], tokens[task, "--no-chat-template"])), task
