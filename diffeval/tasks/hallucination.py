"""Contextual hallucination on summarization and QA (paper Table 4; the Lookback Lens protocol).

Recipe:
1. samples: the first `samples` documents of each dataset, the same for every model.
2. prompt: the dataset's template around the document (LongBench's templates for its sets); a document too long for
   the model's budget (ctx − the dataset's output length) loses its middle tokens, as LongBench truncates.
3. backend: greedy generation with the dataset's output length and stop strings, a whole chunk per engine call.
4. judge, once every model has generated and been freed (a local judge loads only then): a binary verdict
   (hallucination-free or not) given the document, the reference and the output; `overlap` gives a proxy, labelled
   as such.
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
    """A bad --judge, a missing API key, a faulty judge checkpoint or unreadable data fails before any generation;
    no judge model is loaded here."""
    _make_judge(config).close()
    for name in config.options.datasets:
        data.load(name, config.options.data_dir, 1)


def _make_judge(config):
    options = config.options
    return make_judge(
        options.judge,
        options.judge_cache,
        timeout=options.judge_timeout,
        retries=options.judge_retries,
        concurrency=options.judge_concurrency,
        device=config.device,
        backend=options.judge_backend,
    )


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


def evaluate(batch: list[HallucinationSample], backend: Backend, config) -> list[Record]:
    """The chunk's generations, one engine call per dataset in it (output lengths differ); judged later, by `judge`."""
    ctx = config.options.ctx[0]
    start = time.perf_counter()
    fitted = [fit_prompt(data.SPECS[s.dataset], s.document, backend, ctx - data.SPECS[s.dataset].max_new_tokens)
              for s in batch]  # fmt: skip
    fitting = (time.perf_counter() - start) / len(batch)
    outputs = {}
    for name in dict.fromkeys(s.dataset for s in batch):  # each dataset has its own output length and stop strings
        spec, same = data.SPECS[name], [i for i, s in enumerate(batch) if s.dataset == name]
        outputs.update(zip(same, backend.generate([fitted[i][0] for i in same], spec.max_new_tokens, list(spec.stop))))
    records = []
    for i, sample in enumerate(batch):
        (ids, cut), out = fitted[i], outputs[i]
        fields = {
            "dataset": sample.dataset,
            "id": sample.document.id,
            "truncated_tokens": cut,
            "output": out.text,
            "reference": sample.document.reference,
        }
        seconds = fitting + out.seconds
        records.append(
            Record("hallucination", backend.info.name, sample.sample_id, len(ids), out.new_tokens, seconds, fields)
        )
    return records


def judge(generations: list[dict], config):
    """Judged records of the generations, as many per judge call as the judge takes at once; the judge is freed
    when done."""
    documents = {
        (name, doc.id): doc
        for name in config.options.datasets
        for doc in data.load(name, config.options.data_dir, config.options.samples)
    }
    judge = _make_judge(config)
    try:
        for i in range(0, len(generations), judge.batch):
            chunk = generations[i : i + judge.batch]
            items = []
            for row in chunk:
                doc, kind = documents[row["dataset"], row["id"]], data.SPECS[row["dataset"]].kind
                kind = "summary" if kind == "summarization" else "answer"
                items.append(JudgeItem(kind, doc.context, doc.question, doc.reference, row["output"]))
            for row, verdict in zip(chunk, judge.judge(items)):
                free = verdict.hallucination_free
                record = Record.from_dict(row)
                record.fields.update(
                    verdict=free,
                    score=None if free is None else float(free),
                    judge=judge.id,
                    judge_kind=judge.kind,
                    judge_rationale=verdict.rationale,
                )
                yield record
    finally:
        judge.close()


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
    judge=judge,
    sizing=sizing,
    sample_view=sample_view,
)
