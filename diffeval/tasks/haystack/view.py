"""How `diffeval view` shows a haystack sample: each model's prompt, rebuilt from the run's options (samples are pure
and seeded), cut at its token spans into scaffold, haystack stretches (their two ends when long) and marked inserts."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from diffeval.errors import InputError
from diffeval.longctx import fitting
from diffeval.tasks.base import RunContext
from diffeval.tasks.blocks import Block, Document, Elided, Mark, Notice, Section, Span, Text
from diffeval.tasks.haystack.recipe import Recipe, fitted_prompt
from diffeval.tasks.haystack.samples import ANSWER, HaystackPrompt, HaystackSample, Insert

VIEW_EDGE_TOKENS = 32  # haystack tokens shown on each side of an elided stretch
VIEW_FULL_TOKENS = 16384  # prompts up to this length come with their whole haystack text
PROMPT_DIFFERS = "the rebuilt prompt differs from the recorded one (tokenizer or data changed since the run)"


def sample_view_for(recipe: Recipe) -> Callable[..., Document]:
    def sample_view(context: RunContext[Any], records: dict[str, dict], tokenizer_for: Callable[[str], Any],
                    full_text: bool | None) -> Document:  # fmt: skip
        """Each model's prompt, cut at its token spans (the recorded ones, unless a notice says the rebuilt prompt
        differs): the answer's inserts marked strong with their expected strings, distractors faint, a long haystack
        stretch as its two ends, and whole too when `full_text` (None: when the prompt has at most VIEW_FULL_TOKENS
        tokens), so the page can show the middle."""
        first = next(iter(records.values()))
        sample = recipe.rebuild(recipe, context.options, first)
        if sample.sample_id != first["sample_id"]:
            raise InputError(
                "this diffeval builds another sample from the recorded parameters: view it with the version "
                f"that ran it ({first['sample_id']} vs {sample.sample_id})"
            )
        sections: list[Block] = []
        for model, stored in records.items():
            try:
                prompt = fitted_prompt(recipe, sample, tokenizer_for(model), context)
            except Exception as exc:  # a tokenizer or haystack unreachable where one views: the records still show
                sections.append(Section([Notice(f"prompt text unavailable: {exc}")], title=f"Prompt ({model})",
                                        model=model))  # fmt: skip
                continue
            whole = len(prompt.ids) <= VIEW_FULL_TOKENS if full_text is None else full_text
            spans = json.loads(json.dumps(prompt.spans))  # as a record stores them: tuples become lists
            blocks: list[Block] = []
            if len(prompt.ids) != stored.get("prompt_tokens") or spans != stored.get("spans"):
                blocks.append(Notice(PROMPT_DIFFERS, model=model))
            pieces = (recipe.pieces or insert_pieces)(prompt, sample, whole)
            blocks.append(Text(pieces, style="prompt", model=model))
            title = f"Prompt as {model} tokenized it ({len(prompt.ids)} tokens)"
            sections.append(Section(blocks, title=title, model=model))
        return Document(sections)

    return sample_view


class PromptText:
    """A fitted prompt's text cut at token boundaries: slices between tokens' first characters tile the text."""

    def __init__(self, prompt: HaystackPrompt, whole: bool):
        self.text, self.offsets, self.whole, self.tokens = prompt.text, prompt.offsets, whole, len(prompt.ids)
        self.starts = fitting.CharToToken(prompt.offsets).starts + [len(prompt.text)]

    def piece(self, a: int, b: int) -> str:
        """Tokens [a, b) as text."""
        return self.text[self.starts[a] : self.starts[b]]

    def haystack(self, a: int, b: int) -> Span | Elided:
        """A stretch of haystack: its two ends and how much lies between (the page shows that much until asked),
        with the whole text when `whole`; a short stretch whole."""
        edge = VIEW_EDGE_TOKENS
        if b - a <= 2 * edge + 16:
            return Span(self.piece(a, b))
        hidden = f"… {b - a - 2 * edge} haystack tokens …"
        whole = self.piece(a, b) if self.whole else None
        return Elided(self.piece(a, a + edge), self.piece(b - edge, b), hidden, whole, tone="muted")

    def tiled(self, spans: dict[str, list], marked: list[tuple[int, int, Any]]) -> list:
        """The prompt's pieces: the scaffold before and after the haystack, haystack stretches, and the `marked`
        pieces ((start, end, piece), in order, none overlapping) in their places."""
        hay_start, hay_end = spans["haystack"]
        pieces: list = [self.piece(0, hay_start)]
        cursor = hay_start
        for start, end, piece in marked:
            if start > cursor:
                pieces.append(self.haystack(cursor, start))
            pieces.append(piece)
            cursor = end
        if hay_end > cursor:
            pieces.append(self.haystack(cursor, hay_end))
        pieces.append(self.piece(hay_end, self.tokens))
        return pieces


def insert_pieces(prompt: HaystackPrompt, sample: HaystackSample, whole: bool) -> list:
    """The prompt's text in pieces that tile it: scaffold, haystack stretches (elided when long), each insert marked
    (the answer's strong with its expected strings inside, distractors faint)."""
    text = PromptText(prompt, whole)
    marked = []
    cursor = prompt.spans["haystack"][0]
    for (start, end), insert in sorted(zip(map(tuple, prompt.spans["inserts"]), sample.inserts),
                                       key=lambda pair: pair[0]):  # fmt: skip
        if start < cursor:  # inserts sharing a token with the previous one: shown with it
            continue
        sentence = text.piece(start, end)
        answer = insert.role == ANSWER
        note = f"{insert.role}: tokens {start}-{end}" + (f" (expected {', '.join(insert.values)})" if answer else "")
        marked.append((start, end, Mark(
            _marked_values(sentence, insert) if answer else [sentence], tone="highlight" if answer else "faint",
            kind="needle" if answer else "needle other", note=note,
        )))  # fmt: skip
        cursor = end
    return text.tiled(prompt.spans, marked)


def _marked_values(sentence: str, insert: Insert) -> list:
    """An answer insert's text with each of its expected strings marked."""
    pieces: list = []
    cursor = 0
    for value in insert.values:
        at = sentence.find(value, cursor)
        if at < 0:
            continue
        if at > cursor:
            pieces.append(sentence[cursor:at])
        pieces.append(Mark([value], tone="strong", kind="expected", note=f"expected {value}"))
        cursor = at + len(value)
    if cursor < len(sentence):
        pieces.append(sentence[cursor:])
    return pieces
