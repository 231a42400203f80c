"""Multi-needle needle-in-a-haystack (paper Table 2 and Figure 5; the LWM / Gemini 1.5 protocol).

Recipe (the rest is the haystack family's machinery, diffeval/tasks/haystack, on the long-context toolkit):
1. samples: N needles "The special magic number for CITY is: NNNNNNN." with unique cities (data/cities.py) and 7-digit
   numbers; the first of the R queried needles sits at the cell's depth, the others at seeded random depths: a pure
   function of (seed, ctx, depth, N, R, index), the same for every model.
2. prompt: instruction, haystack with the needles, question, answer prefix, fitted to ctx minus the token limit with
   the token spans of every needle and number. The limit is --max-new-tokens, or the expected answer's length in the
   model's own tokens plus a margin per queried needle, at least 32: a tokenizer that spends a token per digit is
   never cut short.
3. score: the fraction of the R expected numbers found in the output (`default` rule at run time; `diffeval report
   --scoring ruler` rescores the stored outputs); `correct` = all found.
Its options are in needle_options; its tables (Table 2), plots, rescoring and view are in needle_report.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from diffeval.data.cities import CITIES
from diffeval.longctx import scoring
from diffeval.models.backend import Backend
from diffeval.records import MayBeAbsent
from diffeval.tasks import thinking
from diffeval.tasks.base import ContextBudget, Reporting, RunContext, Scoring, Task, Viewing
from diffeval.tasks.haystack import samples, tables
from diffeval.tasks.haystack.needle_options import NeedleOptions
from diffeval.tasks.haystack.needle_report import needle_plots, needle_tables, paper_coverage, pieces, rescore
from diffeval.tasks.haystack.recipe import Recipe, check_haystack, running
from diffeval.tasks.haystack.samples import ANSWER, DISTRACTOR, HaystackPrompt, HaystackSample, Insert
from diffeval.tasks.haystack.view import sample_view_for
from diffeval.tasks.thinking import THINKING_SCHEMA

INSTRUCTION = (
    "Some special magic numbers are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the numbers afterwards."
)


def needle_sentence(city: str, number: str) -> str:
    return f"The special magic number for {city} is: {number}."


def question(cities: list[str]) -> str:
    if len(cities) == 1:
        return f"What is the special magic number for {cities[0]} mentioned in the provided text?"
    return f"What are all the special magic numbers for {_join(cities)} mentioned in the provided text?"


def answer_prefix(cities: list[str]) -> str:
    if len(cities) == 1:
        return f"The special magic number for {cities[0]} mentioned in the provided text is:"
    return f"The special magic numbers for {_join(cities)} mentioned in the provided text are:"


def _join(items: list[str]) -> str:
    return ", ".join(items[:-1]) + " and " + items[-1]


def make_sample(seed: int, ctx: int, depth: int, n: int, r: int, index: int, haystack: str = "noise",
                cities: Sequence[str] = CITIES) -> HaystackSample:  # fmt: skip
    """N needles at their depths (the first queried one at `depth`), the first R queried; their cities and numbers
    in `extra`."""
    key = f"seed={seed}|ctx={ctx}|depth={depth}|N={n}|R={r}|i={index}"
    rng = samples.sample_rng("needle", key)
    chosen = rng.sample(list(cities), n)
    numbers: list[str] = []
    while len(numbers) < n:
        number = str(rng.randint(1_000_000, 9_999_999))
        if number not in numbers:
            numbers.append(number)
    depths = [float(depth)] + [round(rng.uniform(0, 100), 2) for _ in range(n - 1)]
    inserts = [Insert(d, needle_sentence(c, number), ANSWER if i < r else DISTRACTOR, [number])
               for i, (d, c, number) in enumerate(zip(depths, chosen, numbers))]  # fmt: skip
    return samples.new_sample(
        "needle", key, ctx=ctx, depth=depth, setting=f"{n}/{r}", seed=seed, index=index, head=INSTRUCTION + "\n\n",
        tail="\n\n" + question(chosen[:r]) + " ", answer_prefix=answer_prefix(chosen[:r]), inserts=inserts,
        expected=numbers[:r], haystack=haystack, haystack_seed=rng.randrange(2**31), token_limit=None,
        extra={"cities": chosen, "numbers": numbers},
    )  # fmt: skip


def make_cell_sample(options: NeedleOptions, seed: int, ctx: int, depth: int, setting: str, index: int):
    n, r = (int(count) for count in setting.split("/"))
    return make_sample(seed, ctx, depth, n, r, index, options.haystack)


def sample_fields(sample: HaystackSample) -> dict[str, Any]:
    """The sample as needle's and attention's records hold it."""
    return {
        "ctx": sample.ctx, "depth": sample.depth, "needles": len(sample.inserts), "queries": len(sample.expected),
        "seed": sample.seed, "index": sample.index, "cities": sample.extra["cities"],
        "numbers": sample.extra["numbers"], "needle_depths": [i.depth for i in sample.inserts],
    }  # fmt: skip


def describe(sample: HaystackSample, prompt: HaystackPrompt) -> dict[str, Any]:
    return {**sample_fields(sample), "haystack_words": prompt.haystack_words, "depth_actual": prompt.depth_actual,
            "spans": prompt.spans, "expected": sample.expected}  # fmt: skip


def refusal(sample: HaystackSample) -> str:
    return (
        f"context {sample.ctx} cannot hold the instruction, {len(sample.inserts)} needles, the question and "
        "--max-new-tokens: use a longer --ctx or fewer needles"
    )


def build_prompt(sample: HaystackSample, backend: Backend, budget: int, chat_template: bool,
                 too_long: str | None = None) -> HaystackPrompt:  # fmt: skip
    """Fit the sample into `budget` tokens of this model (the most haystack words that fit), with the token spans of
    every needle and of every needle's number; `too_long` (default: needle's) when even no haystack fits."""
    fitted = samples.fitted_haystack(sample, backend, budget, chat_template, too_long or refusal(sample))
    number_spans = [fitted.token_span_of(insert.values[0], i) for i, insert in enumerate(sample.inserts)]
    spans: dict[str, list] = {
        "needles": fitted.insert_spans,
        "numbers": number_spans,
        "haystack": list(fitted.haystack_span),
    }
    return HaystackPrompt(fitted.ids, fitted.text, fitted.offsets, fitted.haystack_words, spans, fitted.depth_of(0))


MIN_NEW_TOKENS = 32
ANSWER_MARGIN_PER_QUERY = 16  # tokens per queried needle beyond its number: a city name, punctuation, a restated phrase


def token_limit(sample: HaystackSample, tokenizer: Any, context: RunContext[Any]) -> int:
    """Tokens to generate for this sample on this model, also reserved in its prompt budget: --max-new-tokens when
    given; else the expected answer's length in the model's own tokens plus a margin per queried needle, at least
    MIN_NEW_TOKENS."""
    if context.max_new_tokens is not None:
        return context.max_new_tokens
    answer = tokenizer.encode(" " + ", ".join(sample.expected), special_tokens=False).ids
    return max(MIN_NEW_TOKENS, len(answer) + ANSWER_MARGIN_PER_QUERY * len(sample.expected))


# what needle's tables, rescoring (output against expected and the other needles' numbers) and view read; the view's
# prompt rebuild needs the sample's seed, index and spans, and says so where hand-made or older records lack them
SPANS = {"needles": list[list[int]], "numbers": list[list[int]], "haystack": list[int]}
RECORD_SCHEMA = {
    "ctx": int, "depth": int, "needles": int, "queries": int, "numbers": list[str], "expected": list[str],
    "output": str, "score": float | None, "correct": bool | None,  # null: thinking that never closed
    "hit_token_limit": MayBeAbsent(bool),  # kept since the token limit was recorded
    "seed": MayBeAbsent(int), "index": MayBeAbsent(int), "spans": MayBeAbsent(SPANS), "prompt_tokens": MayBeAbsent(int),
    **THINKING_SCHEMA,  # a thinking run's (--thinking-budget)
}  # fmt: skip


MIN_PROMPT_TOKENS = 65  # the least prompt a context must leave beside the answer: instruction, needles and question


def budget(context: RunContext[NeedleOptions]) -> ContextBudget:
    """Each length holds a prompt and the answer's token limit: --max-new-tokens, else at least MIN_NEW_TOKENS (the
    rest of a longer expected answer is fitted per sample, `token_limit`)."""
    answer = context.max_new_tokens or MIN_NEW_TOKENS
    return ContextBudget(context.lengths, answer, MIN_PROMPT_TOKENS, thinking=thinking.reserve(context))


def rebuild(recipe: Recipe, options: NeedleOptions, record: dict[str, Any]) -> HaystackSample:
    setting = f"{record['needles']}/{record['queries']}"
    return recipe.make_sample(options, record["seed"], record["ctx"], record["depth"], setting, record["index"])


RECIPE = Recipe(name="needle", make_sample=make_cell_sample, fit=build_prompt, refusal=refusal, token_limit=token_limit,
                describe=describe, rebuild=rebuild, rules=("default", "ruler"), pieces=pieces,
                sized_by_estimate=True)  # fmt: skip
TASK = Task(
    name="needle",
    help="Multi-needle needle-in-a-haystack (paper Table 2 / Figure 5).",
    options=NeedleOptions,
    run_options=("chat_template", "max_new_tokens", *thinking.RUN_OPTIONS),
    running=running(RECIPE, budget, check_haystack),
    reporting=Reporting(
        tables=needle_tables,
        paper_coverage=paper_coverage,
        titles={
            "table2": "Table 2 layout: accuracy by model and N/R",
            "answers": "Answers: accuracy, outputs naming unqueried needles' numbers, precision, samples stopped at "
            "the token limit",
            "depth_grid": tables.DEPTH_GRID_TITLE,
            "effective_length": f"{tables.EFFECTIVE_LENGTH_TITLE}, as the 2.5th-97.5th percentile lengths",
            "thinking": thinking.TITLE,
        },
        note=(
            "accuracy = mean per-sample score (fraction of the R queried numbers found in the output), "
            "as in LWM and the DIFF paper; averaged over depths in Table 2; precision counts distinct numbers in an "
            "output, over outputs that contain one"
        ),
        summary_keys=["model", "ctx", "depth", "needles", "queries"],
        pair_keys=["ctx", "needles", "queries"],
        metrics={"accuracy": "score"},
        # a count in a column that missing values (models without an effective length) turn into floats
        decimals={"resamples with base below floor": 0, thinking.UNCLOSED: 0},
        plots=needle_plots,
    ),
    viewing=Viewing(sample_view=sample_view_for(RECIPE)),
    scoring=Scoring(record_schema=RECORD_SCHEMA, rules=scoring.described(RECIPE.rules), rescore=rescore),
)
