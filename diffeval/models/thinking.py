"""Reasoning models: a thinking phase of its own budget before the answer, on every engine.

With a thinking budget B each generating sample runs in two phases. Phase 1 is the prompt without its answer prefix
(the chat template's generation prompt is its last part); it generates at most B tokens, with no stop strings, and stops
once the generated ids hold the model's end-marker ids (`models.tokenizer.find_ids`, the one id rule of every engine).
Where the end marker never comes, the thinking is unclosed (`UNCLOSED`): no answer. Where it comes, phase 2 is the
task's own generate call, unchanged (its token limit, stop strings and answer prefix), on the prompt head + the thinking
ids through the end marker + the ids of `SEPARATOR + answer_prefix`. A chat template that has already closed the
thinking in the prompt (Qwen3 with enable_thinking=false) skips phase 1: the prompt is answered as it is.

The markers come from --think-markers, else the tokenizer (a known pair of added tokens), else the chat template's
source (it names a known end marker); each is checked to tokenize as the template writes it (`check_markers`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from diffeval.errors import InputError
from diffeval.models.backend import Backend, Encoder, Generation, Thought
from diffeval.models.tokenizer import CHAT_PROBE, find_ids, template_source

SEPARATOR = "\n\n"  # between the thinking's end marker and the answer prefix
MARGIN = 8  # tokens a context reserves beyond the budget: SEPARATOR + answer prefix, encoded after the thinking
UNCLOSED = "thinking_unclosed"  # the outcome of a thinking that never closed within its budget
# marker pairs known by name: found among a tokenizer's added tokens, or an end marker named by its chat template
KNOWN = (("<think>", "</think>"), ("<thinking>", "</thinking>"))
MARKER_PROBE = "\nx\n"  # what the check puts between the start and end markers


@dataclass(frozen=True)
class Markers:
    start: str
    end: str
    start_ids: tuple[int, ...]
    end_ids: tuple[int, ...]
    source: str  # "--think-markers", "tokenizer" or "chat template"

    def to_dict(self) -> dict[str, Any]:
        """As run.json records them (models[name]["thinking"])."""
        return {
            "start": self.start,
            "end": self.end,
            "start_ids": list(self.start_ids),
            "end_ids": list(self.end_ids),
            "source": self.source,
        }


@dataclass(frozen=True)
class ThinkingPrompt:
    ids: list[int]  # the whole prompt, its answer prefix included: what runs where the template closed the thinking
    head: list[int]  # the prompt without its answer prefix (`split_at_answer_prefix`): what the model thinks after
    answer_prefix: str


def reserve(budget: int | None) -> int:
    """Tokens a context keeps for the thinking beside the answer's own: 0 without a budget, else budget + MARGIN."""
    return 0 if budget is None else budget + MARGIN


def resolve_markers(
    tokenizer, model: str, given: Sequence[str] | None = None, switches: Mapping[str, Any] | None = None
) -> Markers:
    """A model's thinking markers: `given` (--think-markers START,END), else a known pair both of which are added
    tokens of its tokenizer, else the known pair whose end marker its chat template names; checked to tokenize as the
    template (rendered with `switches`) writes them. `tokenizer` is the transformers tokenizer. One line where the
    model has none."""
    if given:
        (start, end), source = tuple(given), "--think-markers"
    else:
        added = tokenizer.get_added_vocab()
        found = next(((s, e) for s, e in KNOWN if s in added and e in added), None)
        source = "tokenizer"
        if found is None:
            text = template_source(tokenizer)
            found = next(((s, e) for s, e in KNOWN if e in text), None)
            source = "chat template"
        if found is None:
            raise InputError(
                f"model {model} has no thinking markers in its chat template or tokenizer: give them with "
                "--think-markers START,END, or leave out --thinking-budget"
            )
        start, end = found
    ids = [tuple(tokenizer(text, add_special_tokens=False).input_ids) for text in (start, end)]
    for text, marker_ids in zip((start, end), ids):
        if not marker_ids:
            raise InputError(
                f"model {model}: thinking marker {text!r} has no tokens: give markers with --think-markers"
            )
    markers = Markers(start, end, ids[0], ids[1], source)
    check_markers(tokenizer, model, markers, switches)
    return markers


def check_markers(tokenizer, model: str, markers: Markers, switches: Mapping[str, Any] | None = None) -> None:
    """Each marker tokenizes, where the chat template writes it and where the model would, to its own ids: its tokens
    start and end on the marker's characters. The probe is the generation prompt (with the switches), then `start`,
    a line, `end`, SEPARATOR and a word; every occurrence of a marker in the rendered prompt is checked too."""
    rendered = ""
    if tokenizer.chat_template:
        try:
            messages = [{"role": "user", "content": CHAT_PROBE}]
            rendered = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, **dict(switches or {})
            )
        except Exception:  # the template's own failures are check_chat_template's to report
            rendered = ""
    after = len(rendered) + len(markers.start) + len(MARKER_PROBE)
    probe = rendered + markers.start + MARKER_PROBE + markers.end + SEPARATOR + "y"
    spans = [(len(rendered), markers.start, markers.start_ids), (after, markers.end, markers.end_ids)]
    for text, ids in ((markers.start, markers.start_ids), (markers.end, markers.end_ids)):
        at = rendered.find(text)
        while at >= 0:
            spans.append((at, text, ids))
            at = rendered.find(text, at + 1)
    encoded = tokenizer(probe, add_special_tokens=False, return_offsets_mapping=True)
    offsets = encoded["offset_mapping"]
    for begin, text, ids in spans:
        stop = begin + len(text)
        covering = [i for i, (a, b) in enumerate(offsets) if b > begin and a < stop]
        placed = [encoded["input_ids"][i] for i in covering]
        if not covering or offsets[covering[0]][0] != begin or offsets[covering[-1]][1] != stop or placed != list(ids):
            raise InputError(
                f"model {model}: thinking marker {text!r} does not tokenize as its chat template writes it "
                f"({list(ids)} alone, {placed} in place): give markers that are whole tokens with --think-markers, "
                "or leave out --thinking-budget"
            )


def _last(ids: Sequence[int], sub: Sequence[int]) -> int:
    """Where the last occurrence of `sub` in `ids` starts, or -1."""
    width, target = len(sub), list(sub)
    for i in range(len(ids) - width, -1, -1):
        if ids[i] == target[0] and list(ids[i : i + width]) == target:
            return i
    return -1


def closed_in(head: Sequence[int], markers: Markers) -> bool:
    """Whether the prompt has already closed the thinking: its last end marker comes after its last start marker (a
    template that writes an empty thinking, "<think>\\n\\n</think>\\n\\n"). A prompt with neither opens no thinking of
    its own: the model thinks."""
    end = _last(head, markers.end_ids)
    return end >= 0 and end > _last(head, markers.start_ids)


def strip_markers(text: str, markers: Markers) -> str:
    """The thinking's text without a leading start marker and a trailing end marker, surrounding whitespace stripped
    (special-token markers are already absent from decoded text)."""
    text = text.strip()
    if text.startswith(markers.start):
        text = text[len(markers.start) :]
    if text.endswith(markers.end):
        text = text[: len(text) - len(markers.end)]
    return text.strip()


def split_at_answer_prefix(encoder: Encoder, ids: list[int], text: str, answer_prefix: str, model: str) -> list[int]:
    """The ids of a prompt (`ids`, encoded from `text`) without its answer prefix: what the model thinks after. They
    must be the first ids of the whole prompt's; a template whose generation prompt merges into the prefix's first
    token is refused in one line."""
    # every task renders its prompt as render_prompt(user, answer_prefix, ...), which ends in the prefix
    assert text.endswith(answer_prefix), f"the prompt does not end with its answer prefix {answer_prefix!r}"
    if not answer_prefix:
        return list(ids)
    head = encoder.encode(text[: len(text) - len(answer_prefix)]).ids
    if list(ids[: len(head)]) != list(head):
        raise InputError(
            f"model {model}: its chat template's generation prompt and the answer prefix {answer_prefix!r} share a "
            "token, so the thinking cannot come between them: leave out --thinking-budget"
        )
    return list(head)


def think_then_answer(
    backend: Backend,
    prompts: list[ThinkingPrompt],
    markers: Markers,
    budget: int,
    max_new_tokens: int,
    stop: list[str],
) -> list[Generation]:
    """Per prompt, the answer after its thinking (`Generation.thought` set): phase 1 thinks for at most `budget`
    tokens after the head, phase 2 answers after head + thinking + SEPARATOR + the answer prefix with the task's own
    `max_new_tokens` and `stop`. An unclosed thinking gets no answer: text "", new_tokens 0, `ids` the thinking's."""
    thinking = [i for i, p in enumerate(prompts) if not closed_in(p.head, markers)]
    first = backend.generate([prompts[i].head for i in thinking], budget, [], end=markers.end_ids) if thinking else []
    thoughts: dict[int, tuple[Generation, Thought]] = {}
    answer_prompts: dict[int, list[int]] = {}
    for i, generated in zip(thinking, first):
        closed = find_ids(generated.ids, markers.end_ids) is not None
        tokens = len(generated.ids)
        thought = Thought(strip_markers(generated.text, markers), tokens, closed, not closed and tokens >= budget)
        thoughts[i] = (generated, thought)
        if closed:
            after = backend.encode(SEPARATOR + prompts[i].answer_prefix, special_tokens=False).ids
            answer_prompts[i] = prompts[i].head + generated.ids + after
    for i, prompt in enumerate(prompts):
        if i not in thoughts:  # the template closed the thinking: today's prompt, answered as it is
            answer_prompts[i] = prompt.ids
    order = sorted(answer_prompts)
    answered = backend.generate([answer_prompts[i] for i in order], max_new_tokens, stop) if order else []
    answers = dict(zip(order, answered))
    results = []
    for i in range(len(prompts)):
        if i not in thoughts:
            results.append(replace(answers[i], thought=Thought("", 0, True, False)))
            continue
        generated, thought = thoughts[i]
        if thought.closed:
            answer = answers[i]
            results.append(replace(answer, seconds=generated.seconds + answer.seconds, thought=thought))
        else:
            results.append(Generation("", 0, generated.seconds, generated.batch, ids=generated.ids, thought=thought))
    return results
