"""A haystack sample and its prompt: the sentences inserted at depths (the answer's and the distractors'), the seeded
draws a recipe makes them with, and the fit of the sample into one model's budget on the long-context toolkit."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

from diffeval.longctx import fitting
from diffeval.longctx.lengths import format_ctx
from diffeval.models.backend import Backend
from diffeval.records import sample_id

ANSWER, DISTRACTOR = "answer", "distractor"


@dataclass(frozen=True)
class Insert:
    """A sentence inserted into the haystack at `depth` (percent): the answer's or a distractor's, with the strings in
    it a view marks (the expected values, or a distractor's values)."""

    depth: float
    text: str
    role: str  # ANSWER or DISTRACTOR
    values: list[str]


@dataclass(frozen=True)
class HaystackSample:
    sample_id: str
    task: str
    ctx: int
    depth: int | None  # where the answer's first insert sits (None: the task has no depth)
    setting: str  # the task's setting (a table column): "multikey_2", "chains=1 hops=4", needle's "N/R"
    seed: int
    index: int
    head: str  # instruction (with its separator)
    tail: str  # question (with its separator)
    answer_prefix: str
    inserts: list[Insert]
    expected: list[str]
    haystack: str  # the haystack source (data/haystack.py)
    haystack_seed: int
    # tokens generated at most, also reserved in the prompt (RULER's tokens_to_generate); None: the recipe sizes it
    # per model (needle: the expected answer in the model's own tokens)
    token_limit: int | None
    exclude: list[str] = field(default_factory=list)  # haystack sentences naming one of these are left out (NoLiMa)
    extra: dict[str, Any] = field(default_factory=dict)  # what a recipe's own fit or view needs (cwe's word list)
    record_fields: dict[str, Any] = field(default_factory=dict)  # what a recipe adds to each record (nolima's pair)


def new_sample(task: str, key: str, **fields: Any) -> HaystackSample:
    return HaystackSample(sample_id=sample_id(f"{task}|{key}"), task=task, **fields)


def sample_rng(task: str, key: str) -> random.Random:
    return random.Random(f"{task}|{key}")


def cell_key(seed: int, ctx: int, depth: int | None, setting: str, index: int) -> str:
    return f"seed={seed}|ctx={ctx}|depth={depth}|setting={setting}|i={index}"


def follow_depths(depth: float, count: int, rng: random.Random) -> list[float]:
    """`depth` and `count - 1` seeded depths after it, in order: an answer spread over several sentences (a chain)
    starts at the cell's depth."""
    return [float(depth)] + sorted(round(rng.uniform(depth, 100), 2) for _ in range(count - 1))


@dataclass
class HaystackPrompt:
    ids: list[int]
    text: str
    offsets: list[tuple[int, int]]
    haystack_words: int  # haystack words (cwe: list entries) the model's budget held
    # token [start, end) spans, by the recipe's names (the inserts, the expected strings, the haystack); as records
    # store them
    spans: dict[str, list] = field(default_factory=dict)
    depth_actual: float | None = None  # where the answer's first insert starts, as % of the haystack's tokens


def layout(sample: HaystackSample) -> fitting.Layout:
    return fitting.Layout(sample.head, [(i.depth, i.text) for i in sample.inserts], sample.tail, sample.answer_prefix)


def refusal(sample: HaystackSample) -> str:
    """What a probe's fit says when even no haystack leaves room for the sample's fixed part and its answer."""
    return (
        f"context {format_ctx(sample.ctx)} cannot hold {sample.task}'s instruction, inserts, question and "
        f"{sample.token_limit} answer tokens ({sample.setting})"
    )


def fitted_haystack(sample: HaystackSample, backend: Backend, budget: int, chat_template: bool,
                    too_long: str) -> fitting.Fitted:  # fmt: skip
    """The sample's layout fitted into `budget` tokens of this model: the most haystack words that fit."""
    return fitting.fit(layout(sample), backend, sample.haystack, sample.haystack_seed, budget, sample.ctx,
                       chat_template, too_long, tuple(sample.exclude))  # fmt: skip


def fit_haystack(sample: HaystackSample, backend: Backend, budget: int, chat_template: bool,
                 too_long: str) -> HaystackPrompt:  # fmt: skip
    """A probe's prompt: the fitted layout, with the token spans of every insert, of every expected string in an
    answer insert, and of the haystack."""
    fitted = fitted_haystack(sample, backend, budget, chat_template, too_long)
    answers = [
        list(fitted.token_span_of(value, i))
        for i, insert in enumerate(sample.inserts)
        if insert.role == ANSWER
        for value in insert.values
    ]
    first_answer = next((i for i, insert in enumerate(sample.inserts) if insert.role == ANSWER), None)
    return HaystackPrompt(
        ids=fitted.ids,
        text=fitted.text,
        offsets=fitted.offsets,
        haystack_words=fitted.haystack_words,
        spans={
            "inserts": [list(span) for span in fitted.insert_spans],
            "answers": answers,
            "haystack": list(fitted.haystack_span),
        },
        depth_actual=None if first_answer is None or sample.depth is None else fitted.depth_of(first_answer),
    )


def fixed_tokens(sample: HaystackSample, backend: Backend, chat_template: bool) -> int:
    """The sample's prompt without haystack words, in this model's tokens (a recipe's `most_that_fits` counts it)."""
    return len(backend.encode(layout(sample).render(fitting.Haystack([]), 0, backend, chat_template)[0]).ids)


def most_groups(sample: HaystackSample, backend: Backend, budget: int, chat_template: bool, per_group: int = 1) -> int:
    """The most leading groups of `per_group` inserts (keys, values, chains) whose fixed part fits `budget`, fewer
    than the sample has (it did not fit); 0 when none does. Fewer groups are the first of more (the recipes' draws
    do not depend on the count), so this is exact for the sample, and a bisection: a sample of thousands of chains
    is not encoded thousands of times."""

    def fits(count: int) -> bool:
        fewer = replace(sample, inserts=sample.inserts[: count * per_group])
        return count == 0 or fixed_tokens(fewer, backend, chat_template) <= budget

    return fitting.largest_fitting(fits, 1, len(sample.inserts) // per_group - 1)
