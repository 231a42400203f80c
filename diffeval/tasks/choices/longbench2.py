"""LongBench v2: multiple-choice questions over long real documents (Bai et al. 2024, THUDM/LongBench).

Recipe:
1. samples: each question of the data (after the --domain, --difficulty and --length-label filters; the first
   --samples of them) at each context length, the same for every model.
2. prompt: LongBench v2's 0-shot prompt (prompts/0shot.txt: the document in <text>, the question, choices (A)–(D),
   and "The correct answer is (insert answer here)" as the asked format), or lm-eval's longbench2 prompt (ending
   "Answer:") in choice mode. A document too long for the model's budget loses its middle tokens, its first and
   last halves kept, each model in its own tokens; the template, the question and the choices are never cut (pred.py
   halves the whole prompt's tokens instead, so its cut sits a little off the document's middle). With
   `--chat-template` the prompt is the user turn of the model's own template.
3. backend: `--mode generate`: greedy generation of at most 128 tokens (pred.py's budget without chain of thought);
   `--mode choices`: the log-likelihood of each letter after the prompt (`score_choices`: the prompt is the shared
   prefix, computed once; the letters its four continuations), after the answer prefix "The correct answer is ("
   with the official prompt, after "Answer:" and a space (lm-eval's target delimiter) with lm-eval's.
4. score: 1 when the answer is the gold letter, else 0. Generation reads the answer as pred.py's `extract_answer`
   does; an answer it cannot read scores 0 and is counted (unparsed). Choice mode picks the highest log-likelihood.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from diffeval.data import longbench2 as data
from diffeval.errors import InputError
from diffeval.models.backend import Backend, Tokenizer
from diffeval.models.tokenizer import PromptTokenizer, encode_choices_in_context
from diffeval.records import MayBeAbsent, Record, sample_id
from diffeval.tasks import thinking
from diffeval.tasks.base import ContextBudget, Listing, Reporting, RunContext, Running, Scoring, Task, Viewing
from diffeval.tasks.choices.longbench2_options import LongBench2Options
from diffeval.tasks.choices.longbench2_prompts import (
    CHOICE_TOKENS,
    MAX_NEW_TOKENS,
    MIN_PROMPT_TOKENS,
    extract_answer,
    fit,
    form,
)
from diffeval.tasks.choices.longbench2_report import TITLES, sample_view, tables


@dataclass(frozen=True)
class LongBench2Sample:
    sample_id: str
    ctx: int
    question: data.Question


def questions(options: LongBench2Options, limit: int | None = None) -> list[data.Question]:
    chosen = data.selected(options.data_dir, options.domains, options.difficulties, options.length_labels)
    count = min(n for n in (options.samples, limit, len(chosen)) if n is not None)
    return chosen[:count]


def make_samples(options: LongBench2Options, seed: int, limit: int | None = None, prepared=None) -> list:
    return [
        LongBench2Sample(sample_id(f"longbench2|{ctx}|{q.id}"), ctx, q)
        for ctx in options.ctx
        for q in questions(options, limit)
    ]


def check_inputs(context: RunContext[LongBench2Options]) -> None:
    if not questions(context.options, context.limit):
        raise InputError("no question passes --domain, --difficulty and --length-label: widen them")


def prepare(context: RunContext[LongBench2Options], tokenizers: dict[str, Tokenizer]) -> None:
    """Every question's prompt without its document fits every model's budget at every length: refused in one line,
    before any model loads, where it does not."""
    chosen = questions(context.options, context.limit)
    for model, tokenizer in tokenizers.items():
        renderer = PromptTokenizer(tokenizer, model)
        for ctx in context.options.ctx:
            for q in chosen:
                fit(replace(q, context=""), renderer, ctx, context)


def evaluate(batch: list[LongBench2Sample], backend: Backend, context: RunContext[LongBench2Options]) -> list[Record]:
    start = time.perf_counter()
    fitted = [fit(s.question, backend, s.ctx, context) for s in batch]
    document_tokens = [len(backend.encode(s.question.context, special_tokens=False).ids) for s in batch]
    fitting = (time.perf_counter() - start) / len(batch)
    if context.options.mode == "choices":
        return [_scored(s, f, d, backend, context, fitting) for s, f, d in zip(batch, fitted, document_tokens)]
    asks = [thinking.Ask(ids, text, "") for ids, _, text in fitted]
    outputs = thinking.generate(backend, context, asks, MAX_NEW_TOKENS, [])
    records = []
    for sample, (ids, cut, _), tokens, out in zip(batch, fitted, document_tokens, outputs):
        prediction = extract_answer(out.text) if thinking.answered(out) else None
        fields = {
            **_fields(sample, cut, tokens),
            "output": out.text,
            "prediction": prediction,
            **thinking.thinking_fields(out, outcome=False),
        }
        if not thinking.answered(out):  # no answer was read: neither right nor wrong, counted
            fields.update(outcome=thinking.UNCLOSED, correct=None, score=None)
        else:
            correct = prediction == sample.question.answer
            fields.update(outcome="answered" if prediction else "unparsed", correct=correct, score=float(correct))
        records.append(
            Record(
                "longbench2",
                backend.info.name,
                sample.sample_id,
                len(ids),
                thinking.generated_tokens(out),
                fitting + out.seconds,
                fields,
            )
        )
    return records


def _scored(sample, fitted, document_tokens: int, backend: Backend, context, fitting: float) -> Record:
    """One sample's letters scored after its prompt, each tokenized in one piece with it."""
    _, cut, text = fitted
    letters = form(context.options).letters
    prefix, [query], [choices] = encode_choices_in_context(backend, text, [""], list(letters))
    start = time.perf_counter()
    [scores] = list(backend.score_choices(prefix, [query], [choices]))
    values = [round(total, 4) for total, _ in scores]
    prediction = data.LETTERS[max(range(len(values)), key=[total for total, _ in scores].__getitem__)]
    correct = prediction == sample.question.answer
    fields = {
        **_fields(sample, cut, document_tokens),
        "choice_logprobs": values,
        "prediction": prediction,
        "outcome": "answered",
        "correct": correct,
        "score": float(correct),
    }
    seconds = fitting + time.perf_counter() - start
    return Record("longbench2", backend.info.name, sample.sample_id, len(prefix) + len(query), 0, seconds, fields)


def _fields(sample: LongBench2Sample, cut: int, document_tokens: int) -> dict:
    q = sample.question
    share = cut / document_tokens if document_tokens else 0.0
    return {
        "ctx": sample.ctx,
        "id": q.id,
        "domain": q.domain,
        "sub_domain": q.sub_domain,
        "difficulty": q.difficulty,
        "length_label": q.length,
        "gold": q.answer,
        "document_tokens": document_tokens,
        "truncated_tokens": cut,
        "truncation": "none" if not cut else "under half" if share < 0.5 else "half or more",
    }


def sizing(samples: list[LongBench2Sample], tokenizer, context: RunContext[LongBench2Options]) -> tuple[int, int]:
    """Each prompt as fitted to its budget; generation at most pred.py's 128 tokens (and the thinking budget)."""
    prompt = sum(len(fit(s.question, tokenizer, s.ctx, context)[0]) for s in samples)
    per_sample = 0 if context.options.mode == "choices" else MAX_NEW_TOKENS + (thinking.budget(context) or 0)
    return prompt, per_sample * len(samples)


def budget(context: RunContext[LongBench2Options]) -> ContextBudget:
    if context.options.mode == "choices" and thinking.budget(context) is not None:
        raise InputError(
            "--thinking-budget applies to --mode generate: a choice mode scores letters, nothing is "
            "generated to think before; leave it out"
        )
    answer = CHOICE_TOKENS if context.options.mode == "choices" else MAX_NEW_TOKENS
    return ContextBudget(context.lengths, answer, MIN_PROMPT_TOKENS, thinking=thinking.reserve(context))


def needs(options: LongBench2Options) -> frozenset[str]:
    """Generation, or scoring the choices: an engine without it is refused before any work."""
    return frozenset({"score"} if options.mode == "choices" else {"generate"})


# a generation's output and a choice mode's log-likelihoods are each absent from the other mode's records; the score
# is null where a thinking run's thinking never closed
RECORD_SCHEMA = {
    "ctx": int,
    "id": str,
    "domain": str,
    "difficulty": str,
    "length_label": str,
    "gold": str,
    "prediction": str | None,
    "correct": bool | None,
    "score": float | None,
    "outcome": str,
    "truncated_tokens": int,
    "document_tokens": int,
    "truncation": str,
    "sub_domain": MayBeAbsent(str),
    "output": MayBeAbsent(str),
    "choice_logprobs": MayBeAbsent(list[float]),
    **{name: kind for name, kind in thinking.THINKING_SCHEMA.items() if name != "outcome"},
}

TASK = Task(
    name="longbench2",
    help="LongBench v2: multiple-choice questions over long documents, generated or scored by log-likelihood.",
    options=LongBench2Options,
    run_options=("chat_template", *thinking.RUN_OPTIONS),
    running=Running(
        make_samples=make_samples,
        evaluate=evaluate,
        needs=frozenset(),
        needs_of=needs,
        budget=budget,
        check_inputs=check_inputs,
        prepare=prepare,
        sizing=sizing,
    ),
    reporting=Reporting(
        tables=tables,
        titles=TITLES,
        note=(
            "accuracy = fraction of questions answered with the gold letter; an answer pred.py's rule cannot read "
            "scores 0 and is counted (unparsed); chance is 0.25, and a cell where both models are at or below it "
            "reads no difference; truncation: the share of the document's tokens cut from its middle to fit"
        ),
        summary_keys=["model", "ctx"],
        pair_keys=["ctx"],
        metrics={"accuracy": "score"},
        decimals={"samples": 0, "correct": 0, "unparsed": 0, "truncated": 0, "tokens_cut": 1, thinking.UNCLOSED: 0},
        floor=0.25,  # chance with four choices: a model at or below it has shown nothing a guess would not
    ),
    viewing=Viewing(sample_view=sample_view, listing=Listing(answer="prediction", expected="gold", outcome="correct")),
    scoring=Scoring(record_schema=RECORD_SCHEMA),
)
