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

import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pandas as pd

from diffeval.config import option, parse_ctx, parse_str_list
from diffeval.data import hallucination as data
from diffeval.errors import InputError
from diffeval.judges import JudgeItem, make_judge
from diffeval.models.backend import Backend
from diffeval.paper import TABLE4
from diffeval.plotting import plt
from diffeval.records import Record, sample_id
from diffeval.tasks.base import Task, with_cells


@dataclass(frozen=True)
class HallucinationOptions:
    """Contextual hallucination on summarization and QA (paper Table 4)."""

    ctx: list[int] = option([4096], help="the prompt budget, e.g. 4k (one length)", parse=parse_ctx)
    datasets: list[str] = option(
        ["xsum"], help="xsum, cnndm, multi_news, qasper, hotpotqa, 2wikimqa", flag="--dataset", parse=parse_str_list
    )
    samples: int = option(100, help="documents per dataset (the first N) [default: 100]", identity=False)
    judge: str | None = option(  # required: there is no silent default
        None, help="required: openai:MODEL | openai-compatible:BASE_URL#MODEL | hf:PATH | overlap (offline proxy)"
    )
    judge_backend: str = option("hf", help="engine of an hf:PATH judge: hf | vllm [default: hf]")
    data_dir: str | None = option(None, help="read local JSONL files (../shared/datasets/hallucination layout)")
    judge_cache: str | None = option(None, help="verdict cache folder [default: ~/.cache/diffeval]", identity=False)
    judge_timeout: float = option(60.0, help="seconds per judge request [default: 60]", identity=False)
    judge_retries: int = option(5, help="retries on 429, 5xx and timeouts [default: 5]", identity=False)
    judge_concurrency: int = option(4, help="judge requests in flight [default: 4]", identity=False)

    def validate(self) -> None:
        if not self.judge:
            raise InputError("--judge is required: openai:MODEL, openai-compatible:BASE_URL#MODEL, hf:PATH or overlap")
        if len(self.ctx) != 1:
            raise InputError(f"--ctx {self.ctx}: hallucination runs take one context length, e.g. --ctx 4k")
        unknown = [d for d in self.datasets if d not in data.DATASETS]
        if unknown or not self.datasets:
            raise InputError(f"unknown dataset(s) {unknown}: use any of {', '.join(data.DATASETS)}")
        if self.samples < 1 or self.judge_retries < 0 or self.judge_concurrency < 1 or self.judge_timeout <= 0:
            raise InputError("--samples and --judge-concurrency must be at least 1, --judge-timeout positive")


@dataclass(frozen=True)
class HallucinationSample:
    sample_id: str
    dataset: str
    document: data.Document


def make_samples(options, seed: int, limit: int | None = None, prepared=None) -> list[HallucinationSample]:
    count = min(options.samples, limit) if limit else options.samples
    return [
        HallucinationSample(sample_id(f"halluc|{name}|{doc.id}"), name, doc)
        for name in options.datasets
        for doc in data.load(name, options.data_dir, count)
    ]


def check_inputs(config) -> None:
    """A bad --judge, a missing API key or unreadable data fails before any generation."""
    _judge(config)
    for name in config.options.datasets:
        data.load(name, config.options.data_dir, 1)


_judges: dict = {}


def _judge(config):
    options = config.options
    key = (options.judge, options.judge_cache, options.judge_backend)
    if key not in _judges:
        _judges[key] = make_judge(
            options.judge,
            options.judge_cache,
            timeout=options.judge_timeout,
            retries=options.judge_retries,
            concurrency=options.judge_concurrency,
            device=config.device,
            backend=options.judge_backend,
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
        head = backend.decode(context[: keep // 2])
        tail = backend.decode(context[len(context) - (keep - keep // 2) :]) if keep else ""
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
        fields = {
            "dataset": sample.dataset,
            "id": sample.document.id,
            "truncated_tokens": cut,
            "output": out.text,
            "reference": sample.document.reference,
            "verdict": free,
            "score": None if free is None else float(free),
            "judge": judge.id,
            "judge_kind": judge.kind,
            "judge_rationale": verdict.rationale,
        }
        records.append(
            Record("hallucination", backend.info.name, sample.sample_id, len(ids), out.new_tokens, seconds, fields)
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
    row_cells = [{"model": m} for m in table.index]
    proxy = (records["judge_kind"] == "proxy").any()
    if paper and not proxy:  # a proxy is not the paper's measurement: no paper rows beside it
        paper_rows = pd.DataFrame.from_dict(TABLE4, orient="index")[order]
        table = pd.concat([table, paper_rows])
    table = with_cells(table.round(3), row_cells, [{"dataset": d, "verdict": [True, False]} for d in order])
    out = {"table4_proxy" if proxy else "table4": table}
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
    out["judging"] = with_cells(counts, [{"model": m, "dataset": d} for m, d in counts.index], [{}] * counts.shape[1])
    return out


@lru_cache(maxsize=4)
def _documents(name: str, data_dir: str | None, count: int) -> dict[str, data.Document]:
    """A dataset's documents by id, read once for all the samples a viewer opens."""
    return {d.id: d for d in data.load(name, data_dir, count)}


VIEW_EDGE_CHARS = 1500  # document characters shown on each side of an elided middle
VIEW_FULL_CHARS = 200_000  # documents up to this length come whole, for the page to show when asked


def sample_view(config, records: dict[str, dict], tokenizer_for, full_text: bool | None) -> dict:
    """For `diffeval view`: the sample's document and question, read again from the run's data. A long document comes
    as its two ends, and whole too when `full_text` (None: up to VIEW_FULL_CHARS). The records carry the reference,
    each output, the verdict and the judge's rationale."""
    first = next(iter(records.values()))
    document = _documents(first["dataset"], config.options.data_dir, config.options.samples).get(first["id"])
    if document is None:
        raise InputError(f"document {first['id']} is no longer in the run's {first['dataset']} data")
    text, edge = document.context, VIEW_EDGE_CHARS
    shown: dict = {"chars": len(text)}
    if len(text) > 2 * edge + 200:
        shown.update(head=text[:edge], tail=text[-edge:], elided=len(text) - 2 * edge)
    if (len(text) <= VIEW_FULL_CHARS if full_text is None else full_text) or "head" not in shown:
        shown["text"] = text
    return {"question": document.question, "document": shown}


def sizing(samples: list[HallucinationSample], tokenizer, config) -> tuple[int, int]:
    """Each document's prompt as fitted to the budget; generation at most the dataset's output length."""
    prompt = generated = 0
    for sample in samples:
        spec = data.SPECS[sample.dataset]
        prompt += len(fit_prompt(spec, sample.document, tokenizer, config.options.ctx[0] - spec.max_new_tokens)[0])
        generated += spec.max_new_tokens
    return prompt, generated


TASK = Task(
    name="hallucination",
    help="Contextual hallucination on summarization and QA (paper Table 4), judged.",
    options=HallucinationOptions,
    make_samples=make_samples,
    evaluate=evaluate,
    tables=tables,
    titles={
        "table4": "Table 4 layout: fraction judged hallucination-free",
        "table4_proxy": "Table 4 layout, PROXY (overlap judge): fraction with few unsupported units; not a "
        "hallucination rate",
        "judging": "Judging: samples, unparsed verdicts, truncated prompts, judge",
    },
    note=(
        "accuracy = fraction of outputs judged hallucination-free (Table 4); unparsed verdicts are excluded and "
        "counted; with the overlap judge the numbers are a lexical proxy, not a hallucination rate"
    ),
    summary_keys=["model", "dataset"],
    pair_keys=["dataset"],
    metrics={"accuracy": "score"},
    needs=frozenset({"generate"}),
    plots=plots,
    check_inputs=check_inputs,
    batches=batches,
    sizing=sizing,
    sample_view=sample_view,
)
