"""Contextual hallucination on summarization and QA (paper Table 4; the Lookback Lens protocol).

Recipe:
1. samples: the first `samples` documents of each dataset, the same for every model.
2. prompt: the dataset's template around the document (LongBench's templates for its sets); a document too long for
   the model's budget (ctx − the dataset's output length) loses its middle tokens, as LongBench truncates. With
   `--chat-template` the template up to its answer prefix is the user turn of the model's own chat template, and the
   answer prefix ("Summary:") opens the assistant's reply.
3. backend: greedy generation with the dataset's output length and stop strings, a whole chunk per engine call.
4. outcome: an empty or degenerate output (one n-gram repeated through it) is its own outcome, never judged and
   never faithful. Every other output is judged once every model has generated and been freed (a local judge loads
   only then): a binary verdict (hallucination-free or not) given the document, the reference and the output;
   `overlap` gives a proxy, labelled as such. Further judges (`--judge` repeated) judge the same outputs; their
   verdicts are kept beside the first's, for agreement (Cohen's κ).
5. score: 1 when judged hallucination-free, 0 when judged not or degenerate, none when the verdict is unparsed;
   accuracy = the mean score over the scored samples.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from diffeval.data import hallucination as data
from diffeval.judges import Judge, JudgeItem, make_judge
from diffeval.models.backend import Backend, Generation
from diffeval.records import MayBeAbsent, Record, sample_id
from diffeval.tasks import thinking
from diffeval.tasks.base import ContextBudget, Listing, Reporting, RunContext, Running, Scoring, Task, Viewing
from diffeval.tasks.conversations.hallucination_options import HallucinationOptions
from diffeval.tasks.conversations.hallucination_report import paper_coverage, plots, sample_view, tables
from diffeval.tasks.conversations.judging import judge_generations
from diffeval.tasks.conversations.prompts import answer_prefix, fit_prompt, fit_prompt_text


@dataclass(frozen=True)
class HallucinationSample:
    sample_id: str
    dataset: str
    document: data.Document


def make_samples(
    options: HallucinationOptions, seed: int, limit: int | None = None, prepared=None
) -> list[HallucinationSample]:
    count = min(options.samples, limit) if limit else options.samples
    return [
        HallucinationSample(sample_id(f"halluc|{name}|{doc.id}"), name, doc)
        for name in options.datasets
        for doc in data.load(name, options.data_dir, count, up_to=options.documents_up_to())
    ]


def check_inputs(context: RunContext[HallucinationOptions]) -> None:
    """A bad --judge, a missing API key, a faulty judge checkpoint or unreadable data fails before any generation;
    no judge model is loaded here."""
    for spec in context.options.judge:
        _make_judge(context, spec).close()
    for name in context.options.datasets:
        data.load(name, context.options.data_dir, context.options.samples, up_to=context.options.documents_up_to())


def _make_judge(context: RunContext[HallucinationOptions], spec: str) -> Judge:
    options = context.options
    return make_judge(  # a judge that is a reasoning model reads its verdict after its thinking
        spec,
        options.judge_cache,
        timeout=options.judge_timeout,
        retries=options.judge_retries,
        concurrency=options.judge_concurrency,
        device=context.device,
        backend=options.judge_backend,
        thinking_budget=options.judge_thinking_budget,
    )


def evaluate(
    batch: list[HallucinationSample], backend: Backend, context: RunContext[HallucinationOptions]
) -> list[Record]:
    """The chunk's generations, one engine call per dataset in it (output lengths differ); judged later, by `judge`.
    With a thinking budget, each output is the answer read after the model's thinking, and a sample whose thinking
    never closed is an outcome of its own, never judged."""
    ctx, reserved = context.lengths[0], thinking.reserve(context)
    start = time.perf_counter()
    fitted = [fit_prompt_text(data.SPECS[s.dataset], s.document, backend,
                              ctx - data.SPECS[s.dataset].max_new_tokens - reserved, context.chat_template, reserved)
              for s in batch]  # fmt: skip
    fitting = (time.perf_counter() - start) / len(batch)
    outputs: dict[int, Generation] = {}
    for name in dict.fromkeys(s.dataset for s in batch):  # each dataset has its own output length and stop strings
        spec, same = data.SPECS[name], [i for i, s in enumerate(batch) if s.dataset == name]
        asks = [thinking.Ask(fitted[i][0], fitted[i][2], answer_prefix(spec)) for i in same]
        outputs.update(zip(same, thinking.generate(backend, context, asks, spec.max_new_tokens, list(spec.stop))))
    records = []
    for i, sample in enumerate(batch):
        (ids, cut, _), out = fitted[i], outputs[i]
        fields = {
            "dataset": sample.dataset,
            "id": sample.document.id,
            "truncated_tokens": cut,
            "output": out.text,
            "reference": sample.document.reference,
            **thinking.thinking_fields(out, outcome=False),  # the judge stage writes the outcome
        }
        if not thinking.answered(out):
            fields["outcome"] = thinking.UNCLOSED
        seconds = fitting + out.seconds
        records.append(Record("hallucination", backend.info.name, sample.sample_id, len(ids),
                              thinking.generated_tokens(out), seconds, fields))  # fmt: skip
    return records


def judge(generations: list[dict], context: RunContext[HallucinationOptions]) -> Iterator[Record]:
    """Judged records of the generations (`judging.judge_generations`), each judge given the document, its
    question, the reference and the output."""
    options = context.options
    documents = {
        (name, doc.id): doc
        for name in options.datasets
        for doc in data.load(name, options.data_dir, options.samples, up_to=options.documents_up_to())
    }

    def items(rows: list[dict]) -> list[JudgeItem]:
        out = []
        for row in rows:
            doc, kind = documents[row["dataset"], row["id"]], data.SPECS[row["dataset"]].kind
            out.append(JudgeItem("summary" if kind == "summarization" else "answer", doc.context, doc.question,
                                 doc.reference, row["output"]))  # fmt: skip
        return out

    yield from judge_generations(generations, items, lambda spec: _make_judge(context, spec), options.judge)


def sizing(samples: list[HallucinationSample], tokenizer, context: RunContext[HallucinationOptions]) -> tuple[int, int]:
    """Each document's prompt as fitted to the budget; generation at most the dataset's output length."""
    prompt = generated = 0
    for sample in samples:
        spec = data.SPECS[sample.dataset]
        room = context.lengths[0] - spec.max_new_tokens - thinking.reserve(context)
        prompt += len(fit_prompt(spec, sample.document, tokenizer, room, context.chat_template)[0])
        generated += spec.max_new_tokens + (thinking.budget(context) or 0)
    return prompt, generated


# an unparsed verdict is null (and its score); a degenerate output's verdict too. The view's fields (document id,
# output, reference, rationale) are absent from hand-made records, outcomes from records older than them
RECORD_SCHEMA = {
    "dataset": str,
    "verdict": bool | None,
    "score": float | None,
    "judge": str,
    "judge_kind": str,
    "truncated_tokens": int,
    "outcome": MayBeAbsent(str),
    "other_verdicts": MayBeAbsent(dict[str, bool | None]),
    "id": MayBeAbsent(str),
    "output": MayBeAbsent(str),
    "reference": MayBeAbsent(str),
    "judge_rationale": MayBeAbsent(str | None),
    **{name: kind for name, kind in thinking.THINKING_SCHEMA.items() if name != "outcome"},  # a thinking run's
}


MIN_PROMPT_TOKENS = 65  # the least prompt a context must leave beside the output: the template and some document


def budget(context: RunContext[HallucinationOptions]) -> ContextBudget:
    """Each sample reserves its dataset's output length (LongBench's), so each length holds the longest of the run's
    datasets beside a prompt."""
    answer = max(data.SPECS[name].max_new_tokens for name in context.options.datasets)
    return ContextBudget(context.lengths, answer, MIN_PROMPT_TOKENS, thinking=thinking.reserve(context))


TASK = Task(
    name="hallucination",
    help="Contextual hallucination on summarization and QA (paper Table 4), judged.",
    options=HallucinationOptions,
    run_options=("chat_template", *thinking.RUN_OPTIONS),
    running=Running(
        make_samples=make_samples,
        evaluate=evaluate,
        needs=frozenset({"generate"}),
        budget=budget,
        check_inputs=check_inputs,
        sizing=sizing,
        judge=judge,
    ),
    reporting=Reporting(
        tables=tables,
        paper_coverage=paper_coverage,
        titles={
            "table4": "Table 4 layout: fraction judged hallucination-free",
            "table4_proxy": "Table 4 layout, PROXY (overlap judge): fraction with few unsupported units; not a "
            "hallucination rate",
            # a thinking run's also counts thinking_unclosed and the mean thinking_tokens (its note says so)
            "judging": "Judging: samples, outcomes (faithful, hallucinated, degenerate, unparsed), truncated prompts, "
            "judge",
            "judges": "Judges: each judge's accuracy per model, and Cohen's kappa with the primary judge (95 % "
            "bootstrap CI over the outputs both judged)",
        },
        note=(
            "accuracy = fraction of scored outputs judged hallucination-free (Table 4); an empty or degenerate output "
            "scores 0 and is counted (degenerate); an unparsed verdict is excluded from its model's accuracy and "
            "counted (unparsed), so each model's denominator is its scored outputs; with the overlap judge the "
            "numbers are a lexical proxy, not a hallucination rate"
        ),
        summary_keys=["model", "dataset"],
        pair_keys=["dataset"],
        metrics={"accuracy": "score"},
        decimals={"degenerate": 0, "unparsed": 0, thinking.UNCLOSED: 0},  # counts, beside the paper's rows
        plots=plots,
    ),
    viewing=Viewing(
        sample_view=sample_view,
        listing=Listing(answer="output", expected="reference", outcome="verdict"),  # hallucination-free is right
    ),
    scoring=Scoring(record_schema=RECORD_SCHEMA),
)
