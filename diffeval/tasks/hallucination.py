"""Contextual hallucination on summarization and QA (paper Table 4; the Lookback Lens protocol).

Recipe:
1. samples: the first `samples` documents of each dataset, the same for every model.
2. prompt: the dataset's template around the document (LongBench's templates for its sets); a document too long for
   the model's budget (ctx − the dataset's output length) loses its middle tokens, as LongBench truncates.
3. backend: greedy generation with the dataset's output length and stop strings.
4. judge: a binary verdict (hallucination-free or not) from the chosen judge, given the document, the reference and
   the output; `overlap` gives a proxy, labelled as such.
5. score: 1 when judged hallucination-free; accuracy = the fraction of judged samples that are.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from diffeval.data import hallucination as data
from diffeval.judges import JudgeItem, make_judge
from diffeval.models.backend import Backend
from diffeval.paper import TABLE4
from diffeval.report.plotting import plt

SUMMARY_KEYS = ["model", "dataset"]
PAIR_KEYS = ["dataset"]
METRICS = {"accuracy": "score"}
TABLE_NOTE = (
    "accuracy = fraction of outputs judged hallucination-free (Table 4); unparsed verdicts are excluded and counted; "
    "with the overlap judge the numbers are a lexical proxy, not a hallucination rate"
)


@dataclass(frozen=True)
class HallucinationSample:
    sample_id: str
    dataset: str
    document: data.Document


def make_samples(options, seed: int, limit: int | None = None) -> list[HallucinationSample]:
    count = min(options.samples, limit) if limit else options.samples
    return [
        HallucinationSample(hashlib.sha256(f"halluc|{name}|{doc.id}".encode()).hexdigest()[:16], name, doc)
        for name in options.datasets
        for doc in data.load(name, options.data_dir, count)
    ]


def check_inputs(config) -> None:
    options = config.options
    for name in options.datasets:
        data.load(name, options.data_dir, 1)
    _judge(config)  # a bad --judge, or a missing API key, fails before any generation


_judges: dict = {}


def _judge(config):
    options = config.options
    key = (options.judge, options.judge_cache)
    if key not in _judges:
        _judges[key] = make_judge(
            options.judge,
            options.judge_cache,
            timeout=options.judge_timeout,
            retries=options.judge_retries,
            concurrency=options.judge_concurrency,
            device=config.device,
        )
    return _judges[key]


def fit_prompt(spec: data.DatasetSpec, doc: data.Document, backend: Backend, budget: int) -> tuple[list[int], int]:
    """The prompt's token ids within `budget`, cutting the middle of the document; and how many tokens were cut."""
    ids = backend.encode(spec.template.format(context=doc.context, input=doc.question)).ids
    if len(ids) <= budget:
        return ids, 0
    context = backend.encode(doc.context, special_tokens=False).ids
    cut = len(ids) - budget
    while True:  # decoding and re-encoding the two halves can shift a few tokens: cut until it fits
        keep = max(len(context) - cut, 0)
        head = backend.tokenizer.decode(context[: keep // 2])
        tail = backend.tokenizer.decode(context[len(context) - (keep - keep // 2) :]) if keep else ""
        ids = backend.encode(spec.template.format(context=head + tail, input=doc.question)).ids
        if len(ids) <= budget:
            return ids, len(context) - keep
        cut += len(ids) - budget


def batches(todo: list[HallucinationSample], config) -> list[list[HallucinationSample]]:
    """As many outputs per batch as the judge may judge at once, so an API judge works concurrently."""
    size = max(config.batch_size, config.options.judge_concurrency)
    return [todo[i : i + size] for i in range(0, len(todo), size)]


def evaluate(batch: list[HallucinationSample], backend: Backend, config) -> list[dict]:
    ctx = config.options.ctx[0]
    generated = []
    for sample in batch:
        spec = data.SPECS[sample.dataset]
        start = time.perf_counter()
        ids, cut = fit_prompt(spec, sample.document, backend, ctx - spec.max_new_tokens)
        [out] = backend.generate([ids], spec.max_new_tokens, list(spec.stop))
        generated.append((sample, ids, cut, out, time.perf_counter() - start))
    judge = _judge(config)
    items = [
        JudgeItem(
            "summary" if data.SPECS[s.dataset].kind == "summarization" else "answer",
            s.document.context,
            s.document.question,
            s.document.reference,
            out.text,
        )
        for s, _, _, out, _ in generated
    ]
    verdicts = judge.judge(items)
    records = []
    for (sample, ids, cut, out, seconds), verdict in zip(generated, verdicts):
        free = verdict.hallucination_free
        records.append(
            {
                "task": "hallucination",
                "model": backend.info.name,
                "sample_id": sample.sample_id,
                "dataset": sample.dataset,
                "id": sample.document.id,
                "prompt_tokens": len(ids),
                "truncated_tokens": cut,
                "output": out.text,
                "reference": sample.document.reference,
                "new_tokens": out.new_tokens,
                "verdict": free,
                "score": None if free is None else float(free),
                "judge": judge.id,
                "judge_kind": judge.kind,
                "judge_rationale": verdict.rationale,
                "seconds": round(seconds, 4),
            }
        )
    return records


def plots(records: pd.DataFrame, folder: Path) -> list[Path]:
    judged = records.dropna(subset=["score"])
    bars = judged.pivot_table(index="dataset", columns="model", values="score", aggfunc="mean", sort=False)
    proxy = (records["judge_kind"] == "proxy").any()
    ax = bars.plot.bar(rot=0, figsize=(7, 3.6))
    ax.set(
        ylim=(0, 1),
        ylabel="proxy score" if proxy else "hallucination-free fraction",
        title="overlap PROXY (not a hallucination rate)" if proxy else "judged hallucination-free",
    )
    path = folder / "hallucination.png"
    ax.figure.tight_layout()
    ax.figure.savefig(path, dpi=120)
    plt.close(ax.figure)
    return [path]


def tables(records: pd.DataFrame, paper: bool = False) -> dict[str, pd.DataFrame]:
    judged = records.dropna(subset=["score"])
    table = judged.pivot_table(index="model", columns="dataset", values="score", aggfunc="mean", sort=False)
    order = [d for d in data.DATASETS if d in table.columns]
    table = table[order]
    proxy = (records["judge_kind"] == "proxy").any()
    if paper and not proxy:  # a proxy is not the paper's measurement: no paper rows beside it
        paper_rows = pd.DataFrame.from_dict(TABLE4, orient="index")[order]
        table = pd.concat([table, paper_rows])
    out = {"table4_proxy" if proxy else "table4": table.round(3)}
    counts = (
        records.assign(unparsed=records["score"].isna())
        .groupby(["model", "dataset"], sort=False)
        .agg(
            samples=("sample_id", "count"),
            unparsed_verdicts=("unparsed", "sum"),
            truncated=("truncated_tokens", lambda t: int((t > 0).sum())),
        )
    )
    counts["judge"] = records.groupby(["model", "dataset"], sort=False)["judge"].first()
    out["judging"] = counts
    return out
