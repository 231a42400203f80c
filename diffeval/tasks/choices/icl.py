"""Many-shot in-context learning and its robustness to example order (paper Figures 6 and 7; Bertsch et al. 2024).

Recipe:
1. runs: for each dataset, draw and k, a seeded draw of k demonstrations from the train split (the first k of one
   seeded permutation, so smaller k are prefixes of larger ones); each order (`random:K`, `alternating:K`,
   `grouped:K`) is a permutation of that same multiset, identical for every model. `shots=max` is the largest k
   whose prompt fits every model's context.
2. samples: one per run × test query; the test set is the protocol's fixed indices (`--test-indices`) or a seeded
   sample of the test split.
3. prompt: "Question: …\\nType: label" demonstrations joined by blank lines, then the query; each model tokenizes the
   same text. With `--chat-template` the demonstrations and the query are the user turn of the model's own template
   and the label is the assistant's reply. A run that does not fit a model's context is recorded as over budget,
   never truncated.
4. backend: constrained decoding. The log-likelihood of every label's tokens after the prompt, each query and label
   tokenized inside the whole prompt; the demonstration block's KV cache is computed once per (model, run) and reused
   for every query and label.
5. score: the best-scoring label (summed log-probability; `--length-norm` divides by the label's token count).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from itertools import groupby

from diffeval.errors import InputError
from diffeval.models.backend import Backend, Tokenizer
from diffeval.models.tokenizer import PromptTokenizer, encode_choices_in_context
from diffeval.records import MayBeAbsent, Record, sample_id
from diffeval.tasks.base import Listing, Reporting, RunContext, Running, Scoring, Task, Viewing
from diffeval.tasks.choices.icl_demonstrations import (
    Run,
    dataset,
    demonstration_block,
    demonstrations,
    format_example,
    test_ids,
)
from diffeval.tasks.choices.icl_options import IclOptions, parse_orders
from diffeval.tasks.choices.icl_report import SUMMARY_KEYS, paper_coverage, plots, sample_view, tables
from diffeval.tasks.choices.prompts import (
    best_choice,
    count_by_block,
    fitting_count,
    longest,
    longest_prompt,
    prompt_texts,
)

SHARED = "the ICL demonstrations"  # what a run's prompts share, named where a chat template cannot share it


@dataclass(frozen=True)
class ICLSample:
    sample_id: str
    run: Run
    shots_requested: str
    test_id: int
    seed: int


def resolve_max_shots(context: RunContext[IclOptions], tokenizers: dict[str, Tokenizer]) -> dict[tuple[str, int], int]:
    """`shots=max`: per dataset and draw, the largest k whose prompts fit every model's context in every order.

    A first k comes from the draw's demonstrations encoded as one block (`prompts.count_by_block`), beside the
    longest query and label and the chat template's turns; then each order's whole prompt is built and encoded as
    `evaluate` encodes it, and k shrinks until the longest fits."""
    options = context.options
    ctx = options.ctx[0]
    best = {}
    for name in options.datasets:
        data = dataset(name, options.data_dir)
        queries = [format_example(name, data.test[i].text, None) for i in test_ids(options, name, context.seed)]
        for draw in range(options.draws):
            pool = demonstrations(name, options.data_dir, context.seed, draw, len(data.train))
            texts = [format_example(name, data.train[i].text, data.labels[data.train[i].label]) + "\n\n" for i in pool]
            k = len(texts)
            for model, tokenizer in tokenizers.items():
                k = min(
                    k, count_by_block(tokenizer, model, texts[:k], queries, data.labels, context.chat_template, ctx)
                )
                renderer = PromptTokenizer(tokenizer, model)
                longest_at = partial(_longest_prompt, renderer, name, draw=draw, queries=queries, context=context)
                k = fitting_count(longest_at, k, ctx)
            best[(name, draw)] = k
    return best


def _longest_prompt(
    renderer: PromptTokenizer, name: str, shots: int, draw: int, queries: list[str], context: RunContext[IclOptions]
) -> int:
    """The tokens of the longest prompt (block, query and label, in one piece) over every order of `shots`."""
    options, labels = context.options, dataset(name, context.options.data_dir).labels
    most = 0
    for kind, variants in parse_orders(options.orders):
        for variant in range(variants):
            block = demonstration_block(Run(name, shots, kind, variant, draw), options.data_dir, context.seed)
            texts = prompt_texts(block, queries, labels, renderer, context.chat_template, renderer.name, SHARED)
            most = max(most, longest_prompt(renderer, texts))
    return most


def make_samples(options: IclOptions, seed: int, limit: int | None = None, prepared=None) -> list[ICLSample]:
    """`prepared`: the `shots=max` resolution from `prepare`."""
    samples = []
    for name in options.datasets:
        ids = test_ids(options, name, seed)[:limit] if limit else test_ids(options, name, seed)
        for draw in range(options.draws):
            for requested in options.shots:
                shots = prepared[(name, draw)] if requested == "max" else int(requested)
                for kind, variants in parse_orders(options.orders):
                    for variant in range(variants):
                        run = Run(name, shots, kind, variant, draw)
                        for test_id in ids:
                            key = f"icl|{seed}|{'|'.join(map(str, run.key))}|{test_id}"
                            samples.append(ICLSample(sample_id(key), run, str(requested), test_id, seed))
    return samples


def prepare(context: RunContext[IclOptions], tokenizers: dict[str, Tokenizer]) -> dict[tuple[str, int], int] | None:
    """Resolve `shots=max` against every model's tokenizer before any sample is built."""
    return resolve_max_shots(context, tokenizers) if "max" in context.options.shots else None


def check_inputs(context: RunContext[IclOptions]) -> None:
    for name in context.options.datasets:
        test_ids(context.options, name, context.seed)
        data = dataset(name, context.options.data_dir)
        for shots in context.options.shots:
            if shots != "max" and int(shots) > len(data.train):
                raise InputError(f"--shots {shots}: {name} holds {len(data.train)} training examples: give at most "
                                 f"{len(data.train)}, or max")  # fmt: skip


def batches(todo: list[ICLSample], context: RunContext[IclOptions]) -> list[list[ICLSample]]:
    """All queries of one run together: its demonstration block is encoded once."""
    return [list(group) for _, group in groupby(todo, key=lambda s: s.run.key)]


def evaluate(batch: list[ICLSample], backend: Backend, context: RunContext[IclOptions]) -> Iterator[Record]:
    """Yields one record per test query as soon as it is scored."""
    options = context.options
    run = batch[0].run
    data = dataset(run.dataset, options.data_dir)
    # every query and label is tokenized inside its prompt: prefix + queries[i] + choices[i][j] are the ids of the
    # whole prompt "block, query i, label j" encoded in one piece
    prefix, queries, choices = encode_choices_in_context(
        backend,
        *prompt_texts(
            demonstration_block(run, options.data_dir, context.seed),
            [format_example(run.dataset, data.test[s.test_id].text, None) for s in batch],
            data.labels,
            backend,
            context.chat_template,
            backend.info.name,
            SHARED,
        ),
    )
    most = longest(prefix, queries, choices)
    run_fields = {
        "dataset": run.dataset,
        "shots": run.shots,
        "order": run.order,
        "order_seed": run.order_seed,
        "draw": run.draw,
        "demonstration_tokens": len(prefix),
    }

    def make(sample: ICLSample, prompt_tokens: int, seconds: float, **outcome) -> Record:
        gold = data.test[sample.test_id].label
        fields = {
            **run_fields,
            "shots_requested": sample.shots_requested,
            "test_id": sample.test_id,
            "gold": gold,
            "gold_label": data.labels[gold],
            **outcome,
        }
        return Record("icl", backend.info.name, sample.sample_id, prompt_tokens, 0, seconds, fields)

    if most > options.ctx[0]:
        for sample in batch:
            yield make(
                sample,
                most,
                0.0,
                status="over_budget",
                prediction=None,
                predicted_label=None,
                correct=None,
                score=None,
                label_scores=None,
            )
        return
    start = time.perf_counter()
    for sample, query, scores in zip(batch, queries, backend.score_choices(prefix, queries, choices)):
        values, prediction = best_choice(scores, options.length_norm)
        gold = data.test[sample.test_id].label
        now = time.perf_counter()
        yield make(
            sample,
            len(prefix) + len(query),
            now - start,
            status="ok",
            prediction=prediction,
            predicted_label=data.labels[prediction],
            correct=prediction == gold,
            score=float(prediction == gold),
            label_scores=[round(v, 4) for v in values],
        )
        start = now


def sizing(samples: list[ICLSample], tokenizer, context: RunContext[IclOptions]) -> tuple[int, int]:
    """Prompt tokens as computed: each run's demonstration block once (its KV cache serves every query), plus every
    query (with the chat template: the template's turns around them too). Labels are scored, not generated."""
    total, blocks = 0, {}  # run key → its demonstration block
    for sample in samples:
        run, first = sample.run, sample.run.key not in blocks
        data = dataset(run.dataset, context.options.data_dir)
        if first:
            blocks[run.key] = demonstration_block(run, context.options.data_dir, context.seed)
        query = format_example(run.dataset, data.test[sample.test_id].text, None)
        shared, [text], _ = prompt_texts(
            blocks[run.key], [query], data.labels, tokenizer, context.chat_template, tokenizer.name, SHARED
        )
        if first:
            total += len(tokenizer.encode(shared).ids)
        total += len(tokenizer.encode(text, special_tokens=False).ids)
    return total, 0


# an over-budget record holds null where a scored one holds its prediction; the view's fields are absent from
# hand-made and older records, and test_id from records older than the clusters
RECORD_SCHEMA = {
    "dataset": str,
    "shots": int,
    "order": str,
    "order_seed": int,
    "draw": int,
    "status": str,
    "score": float | None,
    "correct": bool | None,
    "test_id": MayBeAbsent(int),
    "gold": MayBeAbsent(int),
    "gold_label": MayBeAbsent(str),
    "prediction": MayBeAbsent(int | None),
    "predicted_label": MayBeAbsent(str | None),
    "label_scores": MayBeAbsent(list[float] | None),
}


TASK = Task(
    name="icl",
    help="Many-shot in-context learning and order robustness (paper Figures 6 and 7).",
    options=IclOptions,
    run_options=("chat_template",),
    running=Running(
        make_samples=make_samples,
        evaluate=evaluate,
        needs=frozenset({"score"}),
        # no budget: a run whose prompt does not fit its length is recorded as over budget, per model
        check_inputs=check_inputs,
        prepare=prepare,
        batches=batches,
        sizing=sizing,
    ),
    reporting=Reporting(
        tables=tables,
        paper_coverage=paper_coverage,
        titles={
            "icl_accuracy": "ICL accuracy per dataset and shots (mean over draws and orders)",
            "icl_orders": "ICL accuracy across orders of the same demonstrations",
            "figure7_margins": "Figure 7 layout: best - worst accuracy margin over orders (points)",
            "over_budget": "Runs over the context budget (not scored)",
        },
        note=(
            "accuracy = fraction of test queries whose highest-likelihood label is the gold label; margin = best - "
            "worst accuracy (points) over the orders of the same demonstrations; over-budget runs are excluded and "
            "counted"
        ),
        summary_keys=SUMMARY_KEYS,
        pair_keys=["dataset", "shots"],
        metrics={"accuracy": "score"},
        cluster_keys=["dataset", "test_id"],  # a test query is asked under every order, draw and shot count
        decimals={"margin": 1, "figure7_margins": 1},  # margins are in points
        plots=plots,
    ),
    viewing=Viewing(
        sample_view=sample_view, listing=Listing(answer="predicted_label", expected="gold_label", outcome="correct")
    ),
    scoring=Scoring(record_schema=RECORD_SCHEMA),
)
