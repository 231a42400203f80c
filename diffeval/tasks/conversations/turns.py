"""A multi-turn conversation rendered as the model reads it (`Backend.render_messages`: its chat template over every
turn, or plain with role prefixes), fitted token-exact to a budget, and the token span of each reply in it.

`fit_turns` takes turns from a seeded stream until the model's own tokenizer says the budget is full: the most filler
turns whose rendering fits with the last one's reply cut to one word, then that last reply cut (or continued through
its source) to the most words that still fit. The prompt then lands within one word's tokens of the budget: every
model cuts the same stream at its own budget, as the haystack tasks cut their text.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from diffeval.errors import InputError
from diffeval.longctx.fitting import CharToToken, Span

Messages = list[dict[str, str]]
# (filler turns, the last one's reply in words or None for whole) → (messages, message index of each needle reply)
Builder = Callable[[int, "int | None"], tuple[Messages, list[int]]]


@dataclass(frozen=True)
class Rendered:
    """A conversation as the model reads it: messages, prompt text and ids, each assistant reply's token span (in
    message order, keyed by message index), and the filler turns and last reply's words it was built with."""

    messages: Messages
    text: str
    ids: list[int]
    spans: dict[int, Span]  # message index → token span [start, end) of that assistant reply
    fillers: int = 0
    last_words: int | None = None


def render(backend, messages: Messages, chat_template: bool) -> Rendered:
    """The conversation's prompt and each assistant reply's token span (replies are found in order in the text; a
    template that trims a message's surrounding whitespace is allowed for)."""
    text = backend.render_messages(messages, chat_template)
    encoding = backend.encode(text)
    to_tokens, spans, cursor = CharToToken(encoding.offsets), {}, 0
    for i, message in enumerate(messages):
        content = message["content"].strip()
        at = text.find(content, cursor) if content else -1
        if message["role"] == "assistant" and at >= 0:
            spans[i] = to_tokens.span(at, at + len(content))
        cursor = at + len(content) if at >= 0 else cursor
    return Rendered(messages, text, encoding.ids, spans)


def fit_turns(backend, build: Builder, budget: int, chat_template: bool) -> Rendered:
    """The conversation with the most filler turns whose prompt fits `budget` tokens, the last filler reply cut or
    continued to fill it (module docstring). A conversation that does not fit even without filler turns is refused
    (the caller checks that first, with what fits)."""
    cache: dict[tuple[int, int | None], int] = {}

    def size(fillers: int, words: int | None) -> int:
        if (fillers, words) not in cache:
            cache[fillers, words] = len(backend.encode(backend.render_messages(build(fillers, words)[0],
                                                                               chat_template)).ids)  # fmt: skip
        return cache[fillers, words]

    if size(0, None) > budget:
        raise InputError(f"the conversation's needles and question alone take {size(0, None)} tokens, more than the "
                         f"{budget} of the prompt budget: use fewer --needles or a longer --ctx")  # fmt: skip
    fillers = _most(lambda n: size(n, 1) <= budget, 0)
    words = _most(lambda w: size(fillers, w) <= budget, 1) if fillers else None
    messages, _ = build(fillers, words)
    rendered = render(backend, messages, chat_template)
    return Rendered(rendered.messages, rendered.text, rendered.ids, rendered.spans, fillers, words)


def _most(fits: Callable[[int], bool], low: int) -> int:
    """The largest n ≥ low with fits(n), for a monotone `fits` true at `low`: doubling, then bisection."""
    high = max(low, 1)
    while fits(high):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def distance(spans: dict[int, Span], start: int, ends: Sequence[int]) -> list[int]:
    """Tokens from the end of reply `start` to the start of each of `ends` (message indices), 0 for itself."""
    return [max(spans[end][0] - spans[start][1], 0) if end != start else 0 for end in ends]


def closest_reply(text: str, messages: Messages) -> tuple[int, float]:
    """The assistant reply `text` is closest to, by difflib's SequenceMatcher(None, text, reply).ratio() (OpenAI-MRCR's
    grade), and that ratio; (-1, 0.0) where the conversation has none. A reply whose quick upper bounds cannot beat
    the best so far is skipped."""
    best, ratio = -1, 0.0
    matcher = difflib.SequenceMatcher(None)
    matcher.set_seq1(text)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        matcher.set_seq2(message["content"])
        if matcher.real_quick_ratio() <= ratio or matcher.quick_ratio() <= ratio:
            continue
        found = matcher.ratio()
        if found > ratio:
            best, ratio = i, found
    return best, ratio
