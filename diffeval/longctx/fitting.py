"""Token-exact fitting of a haystack prompt into a model's budget, on haystack streams cached per model.

A task describes its prompt as a `Layout`: a head (an instruction), the haystack with sentences inserted at depths
(needles, facts), a tail (the question) and the answer prefix. `fit` cuts the same haystack stream with each model's
own tokenizer so that the prompt fills the budget to within 1 % of ctx (binary search on words, as RULER does), and
returns the prompt's ids with the token span of every insert and of the haystack. `estimated_tokens` sizes a prompt
for a dry run without fitting it.
"""

from __future__ import annotations

import bisect
import re
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from diffeval.data.haystack import haystack_sentences
from diffeval.errors import InputError
from diffeval.models.backend import Backend, Encoding

Span = tuple[int, int]  # [start, end)


class Haystack:
    """A sample's haystack stream as words, with the word indices where sentences end."""

    def __init__(self, sentences: list[str]):
        self.words: list[str] = []
        self.sentence_ends: list[int] = []
        for sentence in sentences:
            self.words.extend(sentence.split())
            self.sentence_ends.append(len(self.words))

    def render(self, n_words: int, inserts: list[tuple[float, str]]) -> tuple[str, list[Span], Span]:
        """The first n_words words with each (depth, sentence) insert at the nearest sentence boundary.

        Returns the text, each insert's character span (input order) and the whole haystack's span.
        """
        boundaries = [0] + [e for e in self.sentence_ends if e < n_words] + [n_words]
        placed = []
        for i, (depth, _) in enumerate(inserts):
            target = depth / 100 * n_words
            j = bisect.bisect_left(boundaries, target)
            nearest = min(boundaries[max(j - 1, 0) : j + 1], key=lambda b: (abs(b - target), b))
            placed.append((nearest, depth, i))
        placed.sort()
        parts: list[str] = []
        spans: list[Span | None] = [None] * len(inserts)
        length, cursor = 0, 0

        def add(piece: str) -> Span:
            nonlocal length
            if parts:
                parts.append(" ")
                length += 1
            parts.append(piece)
            length += len(piece)
            return length - len(piece), length

        for boundary, _, i in placed:
            if boundary > cursor:
                add(" ".join(self.words[cursor:boundary]))
                cursor = boundary
            spans[i] = add(inserts[i][1])
        if n_words > cursor:
            add(" ".join(self.words[cursor:n_words]))
        return "".join(parts), [span for span in spans if span is not None], (0, length)


@dataclass(frozen=True)
class Layout:
    """A haystack prompt before fitting: `head`, then the haystack with each (depth in percent, sentence) insert at
    the sentence boundary nearest its depth, then `tail`; the model's prompt format (plain or its chat template) ends
    it with `answer_prefix`. Head and tail carry their own separators."""

    head: str
    inserts: list[tuple[float, str]]
    tail: str
    answer_prefix: str

    def render(
        self, haystack: Haystack, n_words: int, backend: Backend, chat_template: bool
    ) -> tuple[str, list[Span], Span]:
        """The prompt with the haystack's first n_words words; each insert's and the whole haystack's character
        span."""
        body, insert_spans, hay_span = haystack.render(n_words, self.inserts)
        text = backend.render_prompt(self.head + body + self.tail, self.answer_prefix, chat_template)
        offset = text.index(self.head) + len(self.head)
        shift = [(s + offset, e + offset) for s, e in insert_spans]
        return text, shift, (hay_span[0] + offset, hay_span[1] + offset)


class CharToToken:
    """Character span → token span [start, end) through a fast tokenizer's offset mapping."""

    def __init__(self, offsets: list[tuple[int, int]]):
        self.starts: list[int] = []
        self.ends: list[int] = []
        for start, end in offsets:  # special tokens carry (0, 0): keep both lists sorted
            self.starts.append(max(start, self.starts[-1] if self.starts else 0))
            self.ends.append(max(end, self.ends[-1] if self.ends else 0))

    def span(self, char_start: int, char_end: int) -> Span:
        first = bisect.bisect_right(self.ends, char_start)
        last = bisect.bisect_left(self.starts, char_end)
        return first, max(last, first + 1)


@dataclass
class Fitted:
    """A layout fitted to a budget: the prompt's text and ids, and where its inserts and haystack are, in characters
    and in tokens."""

    text: str
    ids: list[int]
    offsets: list[tuple[int, int]]
    haystack_words: int
    insert_chars: list[Span]
    haystack_chars: Span
    to_tokens: CharToToken = field(init=False)

    def __post_init__(self):
        self.to_tokens = CharToToken(self.offsets)

    @property
    def insert_spans(self) -> list[Span]:
        return [self.to_tokens.span(*span) for span in self.insert_chars]

    @property
    def haystack_span(self) -> Span:
        return self.to_tokens.span(*self.haystack_chars)

    def token_span_of(self, part: str, insert: int) -> Span:
        """The token span of the first occurrence of `part` inside insert number `insert` (e.g. a needle's value)."""
        start, end = self.insert_chars[insert]
        at = self.text.index(part, start, end)
        return self.to_tokens.span(at, at + len(part))

    def depth_of(self, insert: int) -> float:
        """Where insert number `insert` starts, as a percentage of the haystack's own tokens (inserts not counted)."""
        spans, (hay_start, hay_end) = self.insert_spans, self.haystack_span
        first = spans[insert][0]
        before = sum(e - s for s, e in spans if s < first)
        hay_tokens = (hay_end - hay_start) - sum(e - s for s, e in spans)
        return round(100 * (first - hay_start - before) / max(hay_tokens, 1), 2)


def fixed_part(layout: Layout, backend: Backend, budget: int, chat_template: bool, too_long: str) -> Encoding:
    """The prompt without haystack words (head, inserts, tail, answer prefix); refused with `too_long` when it
    overflows the budget."""
    encoding = backend.encode(layout.render(Haystack([]), 0, backend, chat_template)[0])
    if len(encoding.ids) > budget:
        raise InputError(too_long)
    return encoding


def fit(
    layout: Layout,
    backend: Backend,
    source: str,
    seed: int,
    budget: int,
    ctx: int,
    chat_template: bool,
    too_long: str,
    exclude: tuple[str, ...] = (),
) -> Fitted:
    """Fit the layout into `budget` tokens of this model: the most words of the (source, seed) haystack stream that
    fit, without its sentences that hold a word of `exclude`. `too_long` is the refusal when even no haystack
    overflows."""
    encodings: dict[int, Encoding] = {0: fixed_part(layout, backend, budget, chat_template, too_long)}
    room = budget - len(encodings[0].ids)
    haystack, tokens_through_word = stream(backend, source, seed, room, exclude)

    def fits(n_words: int) -> bool:
        if n_words not in encodings:
            encodings[n_words] = backend.encode(layout.render(haystack, n_words, backend, chat_template)[0])
        return len(encodings[n_words].ids) <= budget

    # Aim a little below the budget: one exact tokenization then usually lands in the top 1 %; when it does
    # not (merges at the joins, odd tokenizers), search for the largest fitting word count.
    lowest_accepted = budget - 0.01 * ctx
    guess = _first_guess(tokens_through_word, room, ctx)
    if fits(guess) and len(encodings[guess].ids) >= lowest_accepted:
        n_words = guess
    else:
        n_words = largest_fitting(fits, guess, len(haystack.words))
    text, insert_chars, haystack_chars = layout.render(haystack, n_words, backend, chat_template)
    encoding = encodings[n_words]
    return Fitted(text, encoding.ids, encoding.offsets, n_words, insert_chars, haystack_chars)


def estimated_tokens(
    layout: Layout,
    backend: Backend,
    source: str,
    seed: int,
    budget: int,
    ctx: int,
    chat_template: bool,
    too_long: str,
) -> int:
    """The tokens `fit` would give this layout, without fitting it: its fixed part plus the haystack words a fit
    tries first, read off the (source, seed) stream's per-word token counts. It misses what merges at the joins and
    a search below the first guess change; a fit lands within 1 % of ctx below its budget either way."""
    fixed = len(fixed_part(layout, backend, budget, chat_template, too_long).ids)
    room = budget - fixed
    _, tokens_through_word = stream(backend, source, seed, room)
    return fixed + tokens_through_word[max(_first_guess(tokens_through_word, room, ctx), 0)]


def _first_guess(tokens_through_word: list[int], room: int, ctx: int) -> int:
    """The haystack word count a fit tries first: a little below the room, so that one exact tokenization usually
    lands in the top 1 % of the budget."""
    return bisect.bisect_right(tokens_through_word, room - max(2, ctx // 500)) - 1


_streams: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def stream(
    backend: Backend, source: str, seed: int, room: int, exclude: tuple[str, ...] = ()
) -> tuple[Haystack, list[int]]:
    """A haystack stream holding more than `room` tokens, with its per-word token counts (cached per model); with
    `exclude`, the stream without its sentences that name one of those words (`without_words`)."""
    key = (source, 0 if source == "noise" else seed, exclude)  # the noise stream is the same for every seed
    cache = _streams.setdefault(backend, {})
    if key in cache and cache[key][1][-1] > room:
        return cache[key]
    min_words = room + 64  # tokenizers give at least about one token per word; doubled below if not
    while True:
        sentences = haystack_sentences(source, seed, min_words)
        if exclude:
            sentences = without_words(sentences, exclude)
            if not sentences:
                raise InputError(f"every sentence of haystack {source!r} names one of {', '.join(exclude)}: "
                                 "give another --haystack")  # fmt: skip
        haystack = Haystack(sentences)
        counts = _tokens_through_word(backend, haystack.words)
        if counts[-1] > room:
            cache[key] = (haystack, counts)
            return haystack, counts
        min_words *= 2


def without_words(sentences: list[str], words: tuple[str, ...]) -> list[str]:
    """The sentences that hold none of `words` (case-insensitive, at the start of a word, so "law" also drops
    "lawyer" and "cat" "cats"): NoLiMa's rule that the haystack must not mention what the question or the needle
    names."""
    pattern = re.compile(r"\b(?:" + "|".join(re.escape(w) for w in words) + r")", re.IGNORECASE)
    return [s for s in sentences if not pattern.search(s)]


def _tokens_through_word(backend: Backend, words: list[str]) -> list[int]:
    """tokens_through_word[i] = how many tokens the first i words take (one tokenization of the stream)."""
    text = " ".join(words)
    token_ends = sorted(end for _, end in backend.encode(text).offsets)
    counts, char = [0], 0
    for word in words:
        char += len(word)
        counts.append(bisect.bisect_right(token_ends, char))
        char += 1
    return counts


def largest_fitting(fits, guess: int, upper: int) -> int:
    """Largest n in [0, upper] with fits(n), for a monotone fits (fits(0) holds): gallop from guess, then bisect."""
    guess = min(max(guess, 0), upper)
    step = 4
    if fits(guess):
        low, high = guess, guess
        while high < upper and fits(high):
            low, high = high, min(high + step, upper)
            step *= 2
        if fits(high):
            return high
    else:
        low, high = guess, guess
        while not fits(low):
            high, low = low, max(low - step, 0)
            step *= 2
    while high - low > 1:  # fits(low), not fits(high)
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def fit_document(
    render: Callable[[str], str], document: str, backend: Backend, budget: int, reserved: int, beside: str
) -> tuple[list[int], int, str]:
    """The token ids of `render(document)` within `budget`, the document tokens cut from its middle (its first and
    last halves kept, as LongBench truncates) and the prompt's text. `reserved`: the tokens the context holds beside
    the budget (the answer's, the thinking's), named in the refusal (`beside` says what they are) of a prompt that
    does not fit even without any document."""
    text = render(document)
    ids = backend.encode(text).ids
    if len(ids) <= budget:
        return ids, 0, text
    context = backend.encode(document, special_tokens=False).ids
    cut = len(ids) - budget
    while True:  # decoding and re-encoding the two halves can shift a few tokens: cut until it fits
        keep = max(len(context) - cut, 0)
        head = backend.decode(context[: keep // 2])
        tail = backend.decode(context[len(context) - (keep - keep // 2) :]) if keep else ""
        text = render(head + tail)
        ids = backend.encode(text).ids
        if len(ids) <= budget:
            return ids, len(context) - keep, text
        if keep == 0:  # the template and question alone exceed the budget: no cut of the document helps
            raise InputError(
                f"--ctx {budget + reserved}: the prompt without any document takes {len(ids)} tokens, more than the "
                f"{budget} left beside {beside}: use a longer --ctx"
            )
        cut += len(ids) - budget
