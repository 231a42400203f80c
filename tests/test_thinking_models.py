"""Reasoning models, the models side: thinking markers resolved from the tokenizer, the chat template or
--think-markers, and refused in one line where a model has none or where they do not tokenize as the template writes
them; the id rule that ends a thinking; the template's switches rendered and checked; `think_then_answer` on scripted
tiny Llamas (tests/thinking_models.py) on hf: answered after thinking, answered wrong (the number only in the
thinking), cut while thinking, ended by EOS, closed by the template, and markers of several tokens each; a judge that
reads its verdict after its thinking."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from thinking_models import EOS, scripted_models
from transformers import AutoTokenizer

from diffeval.errors import InputError
from diffeval.judges import parse_verdict
from diffeval.models.backend import EngineSettings, Thought, make_backend
from diffeval.models.spec import ModelSpec
from diffeval.models.thinking import (
    MARGIN,
    Markers,
    ThinkingPrompt,
    closed_in,
    reserve,
    resolve_markers,
    split_at_answer_prefix,
    strip_markers,
    think_then_answer,
)
from diffeval.models.tiny import thinking_tokenizer, train_tokenizer
from diffeval.models.tokenizer import HFTokenizer, check_chat_template, find_ids, through_ids

pytestmark = pytest.mark.transformers_floor  # tokenizers, chat templates, generate: again at transformers' low end
PREFIX = "The answer is:"
NUMBER = "1234567"
USER = "What is the special magic number?"


@pytest.fixture(scope="module")
def scripted(tiny_models, tmp_path_factory) -> dict[str, Path]:
    return scripted_models(tmp_path_factory.mktemp("scripted"), tiny_models["tok_a"], NUMBER)


def _backend(path: Path, **switches):
    settings = EngineSettings(device="cpu", dtype="float32", template_switches=tuple(switches.items()))
    return make_backend(ModelSpec(path.name, str(path)), settings, "hf")


def _prompt(backend, user: str = USER, prefix: str = PREFIX, chat_template: bool = True) -> ThinkingPrompt:
    text = backend.render_prompt(user, prefix, chat_template)
    ids = backend.encode(text).ids
    return ThinkingPrompt(ids, split_at_answer_prefix(backend, ids, text, prefix, backend.info.name), prefix)


def test_the_id_rule():
    assert find_ids([5, 1, 2, 3, 1, 2], [1, 2]) == 3
    assert find_ids([5, 1, 3], [1, 2]) is None
    assert find_ids([5, 1], []) is None
    assert through_ids([5, 1, 2, 3, 1, 2], [1, 2]) == [5, 1, 2]
    assert through_ids([5, 1, 3], [1, 2]) == [5, 1, 3]
    assert through_ids([5, 1, 3], None) == [5, 1, 3]
    assert reserve(None) == 0 and reserve(100) == 100 + MARGIN


def test_closed_in_and_strip_markers():
    markers = Markers("<think>", "</think>", (7,), (8, 9), "test")
    assert not closed_in([1, 2, 3], markers)  # neither: the model thinks
    assert not closed_in([1, 7], markers)  # opened (R1's generation prompt)
    assert closed_in([1, 7, 8, 9], markers)  # opened and closed (Qwen3 with enable_thinking=false)
    assert not closed_in([1, 7, 8, 9, 5, 7], markers)
    assert strip_markers("<think>\n a plan </think>", markers) == "a plan"
    assert strip_markers("\n a plan", markers) == "a plan"


def test_markers_from_tokenizer_template_and_option(scripted):
    tok = AutoTokenizer.from_pretrained(scripted["tok"])
    found = resolve_markers(tok, "m")
    assert found.source == "tokenizer" and (found.start, found.end) == ("<think>", "</think>")
    assert found.start_ids == tuple(tok.convert_tokens_to_ids(["<think>"]))
    assert len(found.end_ids) == 1
    plain = AutoTokenizer.from_pretrained(scripted["tok_plain"])
    named = resolve_markers(plain, "m")  # no marker tokens: the template names </think>
    assert named.source == "chat template" and len(named.end_ids) > 1
    given = resolve_markers(plain, "m", ["<think>", "</think>"])
    assert given.source == "--think-markers" and given.end_ids == named.end_ids
    assert given.to_dict() == {"start": "<think>", "end": "</think>", "start_ids": list(given.start_ids),
                               "end_ids": list(given.end_ids), "source": "--think-markers"}  # fmt: skip


def test_a_model_without_markers_is_refused(tiny_models):
    tok = AutoTokenizer.from_pretrained(tiny_models["tok_a"])
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    with pytest.raises(InputError) as refused:
        resolve_markers(tok, "m")
    message = str(refused.value)
    assert "\n" not in message
    assert message == ("model m has no thinking markers in its chat template or tokenizer: give them with "
                       "--think-markers START,END, or leave out --thinking-budget")  # fmt: skip


def test_markers_that_do_not_tokenize_as_the_template_writes_them_are_refused(scripted, tiny_models, tmp_path):
    tok = AutoTokenizer.from_pretrained(scripted["tok"])
    # "<think" alone is plain BPE; where the template writes it (enable_thinking=false) it is part of the <think> token
    with pytest.raises(InputError, match="thinking marker '<think' does not tokenize as its chat template writes it"):
        resolve_markers(tok, "m", ["<think", "</think"], {"enable_thinking": False})
    # a trailing space: " " alone, but merged with the newline after it in place (a tokenizer that learned " \n")
    merging = train_tokenizer(["a plan </think> \n\nthe answer is 1. " * 40], 400, tmp_path / "merging")
    assert len(merging(" \n", add_special_tokens=False).input_ids) == 1
    thinking_tokenizer(tmp_path / "merging", tmp_path / "merging_think", marker_tokens=False)
    merging = AutoTokenizer.from_pretrained(tmp_path / "merging_think")
    resolve_markers(merging, "m", ["<think>", "</think>"])  # whole markers pass
    with pytest.raises(InputError) as refused:
        resolve_markers(merging, "m", ["<think>", "</think> "])
    message = str(refused.value)
    assert "\n" not in message and "thinking marker '</think> ' does not tokenize" in message
    assert message.endswith("give markers that are whole tokens with --think-markers, or leave out --thinking-budget")


def test_switches_render_the_template_and_are_checked(scripted):
    tok = AutoTokenizer.from_pretrained(scripted["tok"])
    assert HFTokenizer(tok).render_prompt("hi", "A:", True, "m") == "<|user|>\nhi<|end|>\n<|assistant|>A:"
    closed = HFTokenizer(tok, {"enable_thinking": False}).render_prompt("hi", "A:", True, "m")
    assert closed == "<|user|>\nhi<|end|>\n<|assistant|><think></think>A:"
    check_chat_template(tok, "m", {"enable_thinking": False})
    with pytest.raises(InputError) as refused:
        check_chat_template(tok, "m", {"reasoning_effort": "high"})
    assert str(refused.value) == ("model m: its chat template does not read reasoning_effort: leave out "
                                  "--template-switch reasoning_effort=high")  # fmt: skip
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(InputError, match="leave out --template-switch enable_thinking=false$"):
        check_chat_template(tok, "m", {"enable_thinking": False})


def test_split_at_answer_prefix_refuses_a_shared_token(scripted):
    tok = HFTokenizer(AutoTokenizer.from_pretrained(scripted["tok"]))
    text = "the special magic number"
    ids = tok.encode(text).ids
    assert split_at_answer_prefix(tok, ids, text, "", "m") == ids
    with pytest.raises(InputError, match="share a token, so the thinking cannot come between them"):
        split_at_answer_prefix(tok, ids, text, "ber", "m")  # " num" + "ber" is one token " number" in the prompt


def test_answered_after_thinking(scripted):
    backend = _backend(scripted["answers"])
    markers = backend.thinking_markers(None)
    (out,) = think_then_answer(backend, [_prompt(backend)], markers, 16, 12, ["\n\n"])
    assert out.thought == Thought("the", 4, True, False)  # <think> \n " the" </think>
    assert out.text == " " + NUMBER and out.new_tokens == len(NUMBER) + 2  # " ", the digits, EOS
    assert out.ids[-1] == EOS and out.seconds > 0


def test_answered_wrong_the_number_only_in_the_thinking(scripted):
    backend = _backend(scripted["wrong"])
    (out,) = think_then_answer(backend, [_prompt(backend)], backend.thinking_markers(None), 16, 12, ["\n\n"])
    assert out.thought == Thought(NUMBER, len(NUMBER) + 3, True, False)
    assert out.text == " the" and NUMBER not in out.text


def test_cut_while_thinking(scripted):
    backend = _backend(scripted["loops"])
    markers = backend.thinking_markers(None)
    prompts = [_prompt(backend), _prompt(backend, "Another question?")]
    for out in think_then_answer(backend, prompts, markers, 6, 12, ["\n\n"]):
        assert out.thought == Thought("", 6, False, True)  # "<think>" then newlines, stripped
        assert (out.text, out.new_tokens) == ("", 0) and len(out.ids) == 6


def test_thinking_ended_by_eos_is_unclosed_not_at_budget(scripted):
    backend = _backend(scripted["answers"])
    # a raw prompt: its last token is followed by EOS in every script, so the thinking is EOS alone
    raw = _prompt(backend, "What is it?", PREFIX, chat_template=False)
    (out,) = think_then_answer(backend, [raw], backend.thinking_markers(None), 16, 12, ["\n\n"])
    assert out.thought == Thought("", 1, False, False) and out.text == "" and out.ids == [EOS]


def test_the_template_closed_the_thinking(scripted):
    backend = _backend(scripted["answers"], enable_thinking=False)
    prompt = _prompt(backend)
    markers = backend.thinking_markers(None)
    assert closed_in(prompt.head, markers)
    (out,) = think_then_answer(backend, [prompt], markers, 16, 12, ["\n\n"])
    assert out.thought == Thought("", 0, True, False) and out.text == " " + NUMBER


def test_markers_of_several_tokens(scripted):
    backend = _backend(scripted["plain"])
    markers = backend.thinking_markers(["<think>", "</think>"])
    assert len(markers.end_ids) > 1
    (out,) = think_then_answer(backend, [_prompt(backend)], markers, 24, 12, ["\n\n"])
    assert out.thought == Thought("the", 2 + len(markers.end_ids), True, False)
    assert out.text == " " + NUMBER
    (cut,) = think_then_answer(backend, [_prompt(backend)], markers, 4, 12, ["\n\n"])  # the marker not yet whole
    assert cut.thought == Thought("the</", 4, False, True) and cut.text == ""


def test_generation_ids_without_an_end(scripted):
    backend = _backend(scripted["answers"])
    prompt = _prompt(backend)
    (plain,) = backend.generate([prompt.ids], 12, ["\n\n"])
    assert plain.ids[-1] == EOS and plain.new_tokens == len(plain.ids) and plain.thought is None
    (stopped,) = backend.generate([prompt.head], 12, [], end=backend.thinking_markers(None).end_ids)
    assert stopped.ids[-1] == backend.thinking_markers(None).end_ids[-1] and len(stopped.ids) == 4


def test_a_judges_verdict_is_read_after_its_thinking():
    thought = "<think>\nVerdict: no? The document says 12. Verdict: yes</think>\n\nVerdict: yes\nRationale: supported."
    assert parse_verdict(thought, thinking=True).hallucination_free is True
    assert parse_verdict("<think>Verdict: no</think>Verdict: yes", thinking=True).hallucination_free is True
    assert parse_verdict("<think>Verdict: no</think>Verdict: yes").hallucination_free is None  # no budget: whole reply
    unclosed = parse_verdict("<think>\nVerdict: yes, maybe", thinking=True)
    assert unclosed.hallucination_free is None and unclosed.rationale == "thinking unclosed"
    assert parse_verdict("Verdict: no\nRationale: made up.", thinking=True).hallucination_free is False  # no markers


def test_a_reasoning_hf_judge_scores_its_verdict_after_thinking(scripted, tmp_path):
    from diffeval.judges import JudgeItem, make_judge

    item = JudgeItem("summary", "The number is 12.", "", "12.", "12.")
    judge = make_judge(f"hf:{scripted['judge_yes']}", str(tmp_path), device="cpu", thinking_budget=16)
    assert judge.id == f"hf:{scripted['judge_yes']}@thinking=16"
    (verdict,) = judge.judge([item])
    judge.close()
    assert verdict.hallucination_free is True and verdict.rationale.endswith("after thinking")
    looping = make_judge(f"hf:{scripted['loops']}", str(tmp_path), device="cpu", thinking_budget=8)
    (unclosed,) = looping.judge([item])
    looping.close()
    assert unclosed.hallucination_free is None
    assert unclosed.rationale == "thinking unclosed within the judge's budget of 8 tokens"
    assert looping.cache.get(looping.id, item.prompt()) is None  # never cached: a rerun asks again
    plain = make_judge(f"hf:{scripted['judge_yes']}", str(tmp_path), device="cpu")
    assert plain.id == f"hf:{scripted['judge_yes']}"  # without a budget: the id (and cache keys) as before


def test_a_thinking_judge_is_refused_without_a_template_or_markers(scripted, tiny_models, tmp_path):
    from diffeval.judges import make_judge

    with pytest.raises(InputError) as refused:  # a reasoning judge thinks in its chat template
        make_judge(f"hf:{tiny_models['base_a']}", str(tmp_path), device="cpu", thinking_budget=8)
    assert str(refused.value) == (
        f"judge hf:{tiny_models['base_a']}@thinking=8 has no chat template in its tokenizer, where a reasoning model "
        "thinks: leave out --judge-thinking-budget"
    )
    folder = tmp_path / "no_markers"
    shutil.copytree(scripted["loops"], folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "added_tokens_decoder": {}}))
    (folder / "chat_template.jinja").write_text("{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}")
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    tokenizer["added_tokens"] = [t for t in tokenizer["added_tokens"] if "think" not in t["content"]]
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(InputError) as refused:
        make_judge(f"hf:{folder}", str(tmp_path), device="cpu", thinking_budget=8)
    assert str(refused.value) == (f"model judge hf:{folder} has no thinking markers in its chat template or "
                                  "tokenizer: leave out --judge-thinking-budget")  # fmt: skip
