"""Prompts of choices after a shared context: their texts (raw or through a model's chat template), their one-piece
tokenization (`models.tokenizer.encode_choices_in_context`: `prefix + queries[i] + choices[i][j]`, the prefix's KV
cache serving every query and choice), fitting the most context items into a context length, and the best choice."""

from __future__ import annotations

import bisect
from collections.abc import Callable

from diffeval.errors import InputError
from diffeval.models.backend import Tokenizer
from diffeval.models.tokenizer import encode_choices_in_context


def prompt_texts(
    block: str,
    queries: list[str],
    labels: list[str],
    renderer,
    chat_template: bool,
    model: str,
    shared: str = "the shared context",
) -> tuple[str, list[str], list[str]]:
    """(context, per query the text after it, the choices) whose concatenations are the prompts a model scores.
    Raw: the shared block, each query, each label after a space. With the chat template: the block and the query form
    the user turn, and the label is the assistant's reply, right after the generation prompt; the context is the
    template's opening and the block (shared by every query, so its KV cache serves them all), each query text ends
    with the template's generation prompt. `renderer`: a backend or prompt tokenizer (`render_prompt`); `shared`
    names the block in the refusal of a template that rewrites the user turn."""
    if not chat_template:
        return block, queries, [" " + label for label in labels]
    context, tails = None, []
    for query in queries:
        text = renderer.render_prompt(block + query, "", True)
        at = text.find(block + query)
        if at < 0 or context not in (None, text[: at + len(block)]):
            raise InputError(
                f"model {model}'s chat template rewrites the user turn, so {shared} cannot be shared across queries: "
                "run it without --chat-template"
            )
        context = text[: at + len(block)]
        tails.append(text[at + len(block) :])
    return context or block, tails, list(labels)


def longest(prefix: list[int], queries: list[list[int]], choices: list[list[list[int]]]) -> int:
    """The tokens of the longest prompt: the prefix, a query and its longest choice."""
    return len(prefix) + max(len(q) + max(map(len, c)) for q, c in zip(queries, choices))


def longest_prompt(renderer, texts: tuple[str, list[str], list[str]]) -> int:
    """The tokens of the longest of `prompt_texts`' prompts, each encoded in one piece."""
    return longest(*encode_choices_in_context(renderer, *texts))


def count_by_block(
    tokenizer: Tokenizer,
    model: str,
    texts: list[str],
    queries: list[str],
    labels: list[str],
    chat_template: bool,
    ctx: int,
) -> int:
    """The most of `texts`, in their order, whose block (encoded as one: a BPE merge can cross the seam between two
    items, so they cost more or fewer than encoded one by one) fits `ctx` beside the longest query and label and the
    chat template's turns."""
    scaffold = len(tokenizer.encode(tokenizer.render_prompt("", "", True, model)).ids) if chat_template else 1
    labels = labels if chat_template else [" " + label for label in labels]
    reserve = (
        scaffold
        + max(map(len, tokenizer.encode_many(queries, special_tokens=False)))
        + max(map(len, tokenizer.encode_many(labels, False)))
    )
    encoding = tokenizer.encode("".join(texts), special_tokens=False)
    ends = [end for _, end in encoding.offsets]  # a token belongs to the block's items up to where it ends
    fitting, boundary = 0, 0
    for count, text in enumerate(texts, 1):
        boundary += len(text)
        if bisect.bisect_right(ends, boundary) + reserve > ctx:
            break
        fitting = count
    return fitting


def fitting_count(longest_at: Callable[[int], int], k: int, ctx: int) -> int:
    """The most items, at most k, whose longest prompt (`longest_at(count)`) fits `ctx`: k shrinks by about the items
    an overshoot holds, then grows back one at a time where a long step skipped some that fit."""
    over_at = None  # the fewest items known not to fit
    while k > 0 and (over := longest_at(k) - ctx) > 0:
        over_at = k
        k -= max(1, over * k // ctx)
    while over_at is not None and k + 1 < over_at:
        if longest_at(k + 1) > ctx:
            break
        k += 1
    return k


def best_choice(scores: list[tuple[float, int]], length_norm: bool) -> tuple[list[float], int]:
    """Each choice's value (summed log-probability, or its mean over the choice's tokens with `length_norm`) and the
    index of the best (the first of equals)."""
    values = [total / count if length_norm else total for total, count in scores]
    return values, max(range(len(values)), key=values.__getitem__)
