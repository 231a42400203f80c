"""The recipe contract of a haystack task and what runs it: the samples of every cell, the up-front fit check, the
prompt fitted per model, the generate loop (one generate call per token limit), the record and the dry run's sizing.

A recipe says how one sample is made (`make_sample`, pure and seeded: the same for every model) and, where it differs
from a probe's, how it is fitted, how many tokens its answer may take, and what its record holds. The rest is here,
the same for every haystack task:

1. samples: one per length × setting × depth × index; the answer's first insert sits at the cell's depth.
2. prompt: the recipe's fit (by default `samples.fit_haystack`) cuts the same haystack stream with each model's own
   tokenizer so that the prompt and the token limit fill 99-100 % of ctx; token spans of the inserts are kept.
3. backend: greedy generation, stopped at a blank line, on every engine.
4. score: the recipe's first scoring rule; `report --scoring` rescores the stored outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from rich.console import Console

from diffeval.data.haystack import haystack_sentences
from diffeval.errors import InputError
from diffeval.longctx import fitting, scoring
from diffeval.longctx.lengths import format_ctx
from diffeval.models.backend import Backend, Generation
from diffeval.models.spec import builtin_models
from diffeval.records import Record
from diffeval.tasks import thinking
from diffeval.tasks.base import ContextBudget, RunContext, Running
from diffeval.tasks.haystack.samples import (
    DISTRACTOR,
    HaystackPrompt,
    HaystackSample,
    fit_haystack,
    layout,
    refusal,
)

STOP = ["\n\n"]


def fixed_limit(sample: HaystackSample, tokenizer: Any, context: RunContext[Any]) -> int:
    """The sample's own token limit (RULER's tokens_to_generate), the same for every model."""
    if sample.token_limit is None:
        raise ValueError(f"{sample.task}'s samples carry no token limit: its recipe sizes the answer per model")
    return sample.token_limit


def describe_inserts(sample: HaystackSample, prompt: HaystackPrompt) -> dict[str, Any]:
    """A probe's record fields before its outcome: the cell, the inserts, the expected and distractor values, and
    what the fit gave."""
    return {
        "ctx": sample.ctx,
        "depth": sample.depth,
        "setting": sample.setting,
        "seed": sample.seed,
        "index": sample.index,
        "inserts": [{"role": i.role, "depth": i.depth, "values": i.values} for i in sample.inserts],
        "expected": sample.expected,
        "distractor_values": [v for i in sample.inserts if i.role == DISTRACTOR for v in i.values],
        "haystack_words": prompt.haystack_words,
        "depth_actual": prompt.depth_actual,
        "spans": prompt.spans,
    }


def rebuild_by_setting(recipe: Recipe, options: Any, record: dict[str, Any]) -> HaystackSample:
    """The sample a record was made from, rebuilt from its cell (samples are pure and seeded)."""
    return recipe.make_sample(options, record["seed"], record["ctx"], record["depth"], record["setting"],
                              record["index"])  # fmt: skip


@dataclass(frozen=True)
class Recipe:
    """What a haystack task's module gives: its samples, and how far its prompt and record bend the machinery."""

    name: str
    make_sample: Callable[..., HaystackSample]  # (options, seed, ctx, depth, setting, index) → sample
    # (options, sample, backend, budget, chat template) → the most the sample's length holds, in the recipe's own
    # units ("3 keys"): named in the refusal when a sample's fixed part (instruction, inserts, question) overflows,
    # and checked for every length before any engine starts. None: the refusal stands as the fit says it
    most_that_fits: Callable[..., str] | None = None
    # (options, sample, backend, budget, chat template) → options whose sample fits, or None: on the built-in models
    # only, a run whose fixed part overflows runs at the most that fits instead of being refused (their tokenizer is
    # a toy's, so a paper's setting may not fit where a real model's does)
    shrink_for_builtin: Callable[..., Any] | None = None
    # (sample, backend, budget, chat template, refusal) → prompt; the default fits a haystack with inserts
    fit: Callable[..., HaystackPrompt] = fit_haystack
    refusal: Callable[[HaystackSample], str] = refusal  # what a fit says when even no haystack fits
    # (sample, tokenizer, context) → tokens generated at most, also reserved in the prompt's budget
    token_limit: Callable[[HaystackSample, Any, RunContext[Any]], int] = fixed_limit
    # (sample, prompt) → the record's fields before the outcome (output, score, correct, ...)
    describe: Callable[[HaystackSample, HaystackPrompt], dict[str, Any]] = describe_inserts
    # (recipe, options, record) → the record's sample, for the viewer
    rebuild: Callable[[Recipe, Any, dict[str, Any]], HaystackSample] = rebuild_by_setting
    # the depth grid and depth curves apply (cwe has no depth)
    has_depth: bool = True
    rules: tuple[str, ...] = ("ruler",)
    # (prompt, sample, whole) → the view's pieces of the prompt; None: the inserts marked in the haystack
    pieces: Callable[..., list] | None = None
    # the dry run sizes prompts from one haystack stream's per-word token counts (one exact fit per length), not from
    # one exact fit per length and setting
    sized_by_estimate: bool = False


def make_samples_for(recipe: Recipe) -> Callable[..., list[HaystackSample]]:
    def make_samples(options: Any, seed: int, limit: int | None = None, prepared: Any = None) -> list[HaystackSample]:
        """`prepared`: the options the fit check shrank the run to (`Recipe.shrink_for_builtin`), if it did."""
        options = options if prepared is None else prepared
        count = min(options.samples, limit) if limit else options.samples
        return [
            recipe.make_sample(options, seed, ctx, depth, setting, i)
            for ctx in options.ctx
            for setting in options.settings()
            for depth in options.cell_depths()
            for i in range(count)
        ]

    return make_samples


def check_haystack(context: RunContext[Any]) -> None:
    """Fail before any work if the task's haystack cannot be read."""
    haystack_sentences(context.options.haystack, context.seed, 10)


def prompt_budget(recipe: Recipe, sample: HaystackSample, backend: Backend, context: RunContext[Any]) -> int:
    """The tokens the sample's prompt may take: its length less the answer (and the thinking) it reserves."""
    return sample.ctx - recipe.token_limit(sample, backend, context) - thinking.reserve(context)


def fitted_prompt(recipe: Recipe, sample: HaystackSample, backend: Backend, context: RunContext[Any]) -> HaystackPrompt:
    """The sample's prompt fitted to ctx minus its token limit (the task, the attention analyses and the viewer build
    prompts this one way); refused, naming the most that fits where the recipe says, when even no haystack leaves
    room."""
    budget = prompt_budget(recipe, sample, backend, context)
    too_long = recipe.refusal(sample)
    try:
        return recipe.fit(sample, backend, budget, context.chat_template, too_long)
    except InputError as exc:
        if recipe.most_that_fits is None or str(exc) != too_long:
            raise
        most = recipe.most_that_fits(context.options, sample, backend, budget, context.chat_template)
        raise InputError(f"{exc}: at {format_ctx(sample.ctx)} this model holds at most {most}") from None


def check_fits_with(recipe: Recipe) -> Callable[[RunContext[Any], dict], Any]:
    def prepare(context: RunContext[Any], tokenizers: dict) -> Any:
        """Refuse before any engine starts where a length cannot hold a sample's fixed part (too many keys, chains or
        common words): one fit per length and setting, per model, of the cell's first sample. On the built-in models,
        a recipe that can shrink its setting to fit does so, says so in one line, and returns the options it used."""
        from diffeval.models.tokenizer import PromptTokenizer

        prompt_tokenizers: list[Any] = [PromptTokenizer(tokenizer, name) for name, tokenizer in tokenizers.items()]
        builtin = all(spec.spec in builtin_models() for spec in context.models)
        shrink = recipe.shrink_for_builtin if builtin else None
        options, overflowed = context.options, None
        while True:
            try:
                for ctx in context.lengths:
                    for setting in options.settings():
                        sample = recipe.make_sample(options, context.seed, ctx, options.cell_depths()[0], setting, 0)
                        for tokenizer in prompt_tokenizers:
                            fitted_prompt(recipe, sample, tokenizer, replace(context, options=options))
                break
            except InputError:
                if shrink is None:
                    raise
                budget = prompt_budget(recipe, sample, tokenizer, context)
                smaller = shrink(options, sample, tokenizer, budget, context.chat_template)
                if smaller is None:
                    raise
                options, overflowed = smaller, overflowed or sample.ctx
        if overflowed is None:
            return None
        Console(stderr=True, markup=False).print(
            f"note: the built-in models' tokenizer cannot fit {recipe.name}'s {' '.join(context.options.settings())} "
            f"at {format_ctx(overflowed)}: it runs at {' '.join(options.settings())}, the most that fits",
            highlight=False,
            soft_wrap=True,
        )
        return options

    return prepare


Prepared = tuple[HaystackSample, HaystackPrompt, int]  # a sample, its prompt on one model, its token limit


def prepare_batch_with(recipe: Recipe) -> Callable[..., list[Prepared]]:
    def prepare_batch(batch: list[HaystackSample], backend: Backend, context: RunContext[Any]) -> list[Prepared]:
        return [(s, fitted_prompt(recipe, s, backend, context), recipe.token_limit(s, backend, context)) for s in batch]

    return prepare_batch


def evaluate_with(recipe: Recipe) -> Callable[..., list[Record]]:
    def evaluate(batch: list[Prepared], backend: Backend, context: RunContext[Any]) -> list[Record]:
        """Greedy answers for one batch on one model, as scored records; one generate call per token limit (with a
        thinking budget, each answer read after its thinking: tasks/thinking.py)."""
        outputs: dict[int, Generation] = {}
        for limit in dict.fromkeys(limit for _, _, limit in batch):
            same = [i for i, (_, _, each) in enumerate(batch) if each == limit]
            asks = [thinking.Ask(batch[i][1].ids, batch[i][1].text, batch[i][0].answer_prefix) for i in same]
            outputs.update(zip(same, thinking.generate(backend, context, asks, limit, STOP)))
        return [record(recipe, s, p, backend.info.name, outputs[i], limit) for i, (s, p, limit) in enumerate(batch)]

    return evaluate


def record(recipe: Recipe, sample: HaystackSample, prompt: HaystackPrompt, model: str, output: Generation,
           token_limit: int) -> Record:  # fmt: skip
    # thinking that never closed has no answer: no score (left out of the scores, counted in every table)
    answered = thinking.answered(output)
    value, correct = scoring.score(output.text, sample.expected, recipe.rules[0]) if answered else (None, None)
    fields = {
        **recipe.describe(sample, prompt),
        "output": output.text,
        "score": value,
        "correct": correct,
        "generation_batch": output.batch,  # prompts that shared the forward pass (hf runs long prompts one at a time)
        "max_new_tokens": token_limit,
        "hit_token_limit": answered and output.new_tokens >= token_limit,  # the answer may have been cut short
        **thinking.thinking_fields(output),
        **sample.record_fields,
    }
    return Record(sample.task, model, sample.sample_id, len(prompt.ids), thinking.generated_tokens(output),
                  output.seconds, fields)  # fmt: skip


def sizing_for(recipe: Recipe) -> Callable[..., tuple[int, int]]:
    def sizing(samples: list[HaystackSample], tokenizer: Any, context: RunContext[Any]) -> tuple[int, int]:
        """Prompt tokens of every sample, and generated tokens at most (each sample's token limit), without fitting
        every prompt: a fit fills 99-100 % of its budget, so the totals are within 1 % of fitting each."""
        return (estimated_sizing if recipe.sized_by_estimate else exact_sizing)(recipe, samples, tokenizer, context)

    return sizing


def exact_sizing(recipe: Recipe, samples: list[HaystackSample], tokenizer: Any,
                 context: RunContext[Any]) -> tuple[int, int]:  # fmt: skip
    """Every prompt counted at the size of one exact fit per length and setting."""
    exact: dict[tuple[int, str], int] = {}
    prompt_tokens = generated = 0
    for sample in samples:
        key = (sample.ctx, sample.setting)
        if key not in exact:
            exact[key] = len(fitted_prompt(recipe, sample, tokenizer, context).ids)
        prompt_tokens += exact[key]
        generated += recipe.token_limit(sample, tokenizer, context) + (thinking.budget(context) or 0)
    return prompt_tokens, generated


def estimated_sizing(recipe: Recipe, samples: list[HaystackSample], tokenizer: Any,
                     context: RunContext[Any]) -> tuple[int, int]:  # fmt: skip
    """Each prompt as its fixed part (instruction, inserts, question) plus the haystack words a fit tries first, read
    off one haystack stream's per-word token counts; one exact fit per length adds what that misses (merges at the
    joins, a search below the first guess). For samples whose answers differ in length (needle's N/R settings)."""
    stream_seeds: dict[int, int] = {}  # per length, the stream of its first sample: the one its exact fit reads
    corrections: dict[int, int] = {}
    prompt_tokens = generated = 0
    for sample in samples:
        limit = recipe.token_limit(sample, tokenizer, context)
        seed = stream_seeds.setdefault(sample.ctx, sample.haystack_seed)
        budget = sample.ctx - limit - thinking.reserve(context)
        estimate = fitting.estimated_tokens(layout(sample), tokenizer, sample.haystack, seed, budget,
                                            sample.ctx, context.chat_template, recipe.refusal(sample))  # fmt: skip
        if sample.ctx not in corrections:
            corrections[sample.ctx] = len(fitted_prompt(recipe, sample, tokenizer, context).ids) - estimate
        prompt_tokens += estimate + corrections[sample.ctx]
        generated += limit + (thinking.budget(context) or 0)
    return prompt_tokens, generated


def running(recipe: Recipe, budget: Callable[[RunContext[Any]], ContextBudget],
            check_inputs: Callable[[RunContext[Any]], None] | None = None) -> Running:  # fmt: skip
    """What a haystack task runs: its samples, the up-front fit check (where the recipe names the most that fits),
    prompts built one chunk ahead, the generate loop and the dry run's sizing."""
    return Running(
        make_samples=make_samples_for(recipe),
        evaluate=evaluate_with(recipe),
        needs=frozenset({"generate"}),
        budget=budget,
        check_inputs=check_inputs,
        prepare=check_fits_with(recipe) if recipe.most_that_fits else None,
        prepare_batch=prepare_batch_with(recipe),
        sizing=sizing_for(recipe),
    )
