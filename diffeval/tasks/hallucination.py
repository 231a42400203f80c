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
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from diffeval.config import context_option, option, parse_str_list
from diffeval.data import hallucination as data
from diffeval.errors import InputError
from diffeval.judges import JudgeItem, make_judge
from diffeval.models.backend import Backend, available_backends
from diffeval.paper import TABLE4
from diffeval.records import MayBeAbsent, Record, sample_id
from diffeval.tasks.base import (
    ContextBudget,
    Listing,
    Reporting,
    Running,
    Scoring,
    Task,
    Viewing,
    with_cells,
    with_rows,
)

if TYPE_CHECKING:  # annotations only: heavy libraries load inside the functions that use them (a fast CLI)
    import numpy as np
    import pandas as pd


@dataclass(frozen=True)
class HallucinationOptions:
    """Contextual hallucination on summarization and QA (paper Table 4)."""

    ctx: list[int] = context_option([4096], help="the prompt budget, e.g. 4k (one length)")
    datasets: list[str] = option(
        ["xsum"], help="xsum, cnndm, multi_news, qasper, hotpotqa, 2wikimqa", flag="--dataset", parse=parse_str_list
    )
    samples: int = option(100, help="documents per dataset (the first N) [default: 100]", identity=False)
    judge: list[str] = option(  # required: there is no silent default
        [],
        type=list[str],
        parse=lambda value: [value] if isinstance(value, str) else [str(v) for v in value],
        help="required: openai:MODEL | openai-compatible:BASE_URL#MODEL | hf:PATH | overlap (offline proxy); "
        "repeat for more judges: the first is primary, the others are compared with it",
    )
    judge_backend: str = option("hf", help="engine of an hf:PATH judge: hf | vllm [default: hf]")
    data_dir: str | None = option(None, help="read local JSONL files (../shared/datasets/hallucination layout)")
    judge_cache: str | None = option(None, help="verdict cache folder [default: ~/.cache/diffeval]", identity=False)
    judge_timeout: float = option(60.0, help="seconds per judge request [default: 60]", identity=False)
    judge_retries: int = option(5, help="retries on 429, 5xx and timeouts [default: 5]", identity=False)
    judge_concurrency: int = option(4, help="judge requests in flight [default: 4]", identity=False)

    def validate(self) -> None:
        if len(set(self.judge)) != len(self.judge):
            raise InputError(f"--judge {self.judge}: each judge once")
        if not self.judge:
            raise InputError("--judge is required: openai:MODEL, openai-compatible:BASE_URL#MODEL, hf:PATH or overlap")
        if len(self.ctx) != 1:
            raise InputError(f"--ctx {self.ctx}: hallucination runs take one context length, e.g. --ctx 4k")
        unknown = [d for d in self.datasets if d not in data.DATASETS]
        if unknown or not self.datasets:
            raise InputError(f"unknown dataset(s) {unknown}: use any of {', '.join(data.DATASETS)}")
        if self.judge_cache and Path(self.judge_cache).expanduser().exists() and not Path(self.judge_cache).is_dir():
            raise InputError(f"--judge-cache {self.judge_cache} is a file: give a folder for the verdict cache")
        engines = available_backends()
        if self.judge_backend not in engines:
            raise InputError(f"unknown --judge-backend {self.judge_backend!r}: use one of {', '.join(engines)}")
        if self.judge_backend != "hf" and not any(j.startswith("hf:") for j in self.judge):
            raise InputError(
                f"--judge-backend {self.judge_backend} runs hf:PATH judges, and no --judge is one: leave it out"
            )
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
    for spec in config.options.judge:
        _make_judge(config, spec).close()
    for name in config.options.datasets:
        data.load(name, config.options.data_dir, 1)


def _make_judge(config, spec: str):
    options = config.options
    return make_judge(
        spec,
        options.judge_cache,
        timeout=options.judge_timeout,
        retries=options.judge_retries,
        concurrency=options.judge_concurrency,
        device=config.device,
        backend=options.judge_backend,
    )


def answer_prefix(spec: data.DatasetSpec) -> str:
    """The last line of the dataset's template ("Summary:", "Answer:"), which the output continues."""
    return spec.template.rsplit("\n", 1)[1]


def prompt_text(spec: data.DatasetSpec, context: str, question: str, backend: Backend, chat_template: bool) -> str:
    """The dataset's template around the document and question. With the chat template, the template up to its
    answer prefix (the document and the question) is the user turn and the answer prefix opens the assistant's reply."""
    text = spec.template.format(context=context, input=question)
    if not chat_template:
        return text
    prefix = answer_prefix(spec)
    return backend.render_prompt(text[: -len(prefix)], prefix, True)


def fit_prompt(
    spec: data.DatasetSpec, doc: data.Document, backend: Backend, budget: int, chat_template: bool = False
) -> tuple[list[int], int]:
    """The prompt's token ids within `budget`, cutting the middle of the document (never the template, nor the chat
    template's turns); and how many tokens were cut."""
    ids = backend.encode(prompt_text(spec, doc.context, doc.question, backend, chat_template)).ids
    if len(ids) <= budget:
        return ids, 0
    context = backend.encode(doc.context, special_tokens=False).ids
    cut = len(ids) - budget
    while True:  # decoding and re-encoding the two halves can shift a few tokens: cut until it fits
        keep = max(len(context) - cut, 0)
        head = backend.decode(context[: keep // 2])
        tail = backend.decode(context[len(context) - (keep - keep // 2) :]) if keep else ""
        ids = backend.encode(prompt_text(spec, head + tail, doc.question, backend, chat_template)).ids
        if len(ids) <= budget:
            return ids, len(context) - keep
        if keep == 0:  # the template and question alone exceed the budget: no cut of the document helps
            raise InputError(
                f"--ctx {budget + spec.max_new_tokens}: the prompt without any document takes {len(ids)} tokens, more "
                f"than the {budget} left beside the answer's {spec.max_new_tokens}: use a longer --ctx"
            )
        cut += len(ids) - budget


def evaluate(batch: list[HallucinationSample], backend: Backend, config) -> list[Record]:
    """The chunk's generations, one engine call per dataset in it (output lengths differ); judged later, by `judge`."""
    ctx = config.options.ctx[0]
    start = time.perf_counter()
    fitted = [fit_prompt(data.SPECS[s.dataset], s.document, backend, ctx - data.SPECS[s.dataset].max_new_tokens,
                         config.chat_template) for s in batch]  # fmt: skip
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


DEGENERATE_MIN_REPEATS = 4  # an n-gram this many times in a row is a loop, not a summary


def degenerate(output: str) -> str | None:
    """Why an output cannot be judged, or None: empty, whitespace only, or at least half of its words inside one
    n-gram (1 to 4 words) repeated DEGENERATE_MIN_REPEATS or more times in a row."""
    words = output.split()
    if not words:
        return "empty output" if not output else "whitespace-only output"
    for n in range(1, 5):
        for i in range(len(words) - n + 1):
            gram, repeats = words[i : i + n], 1
            while words[i + repeats * n : i + (repeats + 1) * n] == gram:
                repeats += 1
            if repeats >= DEGENERATE_MIN_REPEATS and 2 * repeats * n >= len(words):
                return f"degenerate output: {' '.join(gram)!r} repeated {repeats} times"
    return None


def judge(generations: list[dict], config):
    """Judged records of the generations. Degenerate outputs are recorded without a judge. Further judges judge
    every output first, one loaded at a time, their verdicts cached; then the primary judges as many per call as it
    takes at once, and each record carries every judge's verdict."""
    documents = {
        (name, doc.id): doc
        for name in config.options.datasets
        for doc in data.load(name, config.options.data_dir, config.options.samples)
    }
    reasons = [degenerate(row["output"]) for row in generations]
    judged = [row for row, reason in zip(generations, reasons) if reason is None]

    def items(rows: list[dict]) -> list[JudgeItem]:
        out = []
        for row in rows:
            doc, kind = documents[row["dataset"], row["id"]], data.SPECS[row["dataset"]].kind
            out.append(JudgeItem("summary" if kind == "summarization" else "answer", doc.context, doc.question,
                                 doc.reference, row["output"]))  # fmt: skip
        return out

    others: dict[str, dict[tuple[str, str], bool | None]] = {}  # judge id → (model, sample id) → verdict
    for spec in config.options.judge[1:]:
        other = _make_judge(config, spec)
        try:
            verdicts = other.judge(items(judged))
        finally:
            other.close()
        others[other.id] = {_key(row): v.hallucination_free for row, v in zip(judged, verdicts)}
    primary = _make_judge(config, config.options.judge[0])
    try:
        for i in range(0, len(generations), primary.batch):
            chunk, chunk_reasons = generations[i : i + primary.batch], reasons[i : i + primary.batch]
            live = [row for row, reason in zip(chunk, chunk_reasons) if reason is None]
            verdicts = dict(zip(map(_key, live), primary.judge(items(live)))) if live else {}
            for row, reason in zip(chunk, chunk_reasons):
                record = Record.from_dict(row)
                if reason is not None:
                    outcome, free, rationale = "degenerate", None, reason
                else:
                    verdict = verdicts[_key(row)]
                    free, rationale = verdict.hallucination_free, verdict.rationale
                    outcome = {True: "faithful", False: "hallucinated", None: "unparsed"}[free]
                record.fields.update(
                    outcome=outcome,
                    verdict=free,
                    score=0.0 if outcome == "degenerate" else None if free is None else float(free),
                    judge=primary.id,
                    judge_kind=primary.kind,
                    judge_rationale=rationale,
                    other_verdicts={judge_id: found.get(_key(row)) for judge_id, found in others.items()},
                )
                yield record
    finally:
        primary.close()


def _key(row: dict) -> tuple[str, str]:
    return row["model"], row["sample_id"]


def plots(records: pd.DataFrame, folder: Path) -> list[Path]:
    from diffeval.plotting import plt

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


def tables(records: pd.DataFrame, options: HallucinationOptions, paper: bool = False) -> dict[str, pd.DataFrame]:
    import pandas as pd

    records = _with_outcomes(records)
    judged = records.dropna(subset=["score"])
    table = judged.pivot_table(index="model", columns="dataset", values="score", aggfunc="mean", sort=False)
    order = [d for d in data.DATASETS if d in table.columns]
    table = table[order]
    outcomes = records.groupby("model", sort=False)["outcome"]
    table["degenerate"] = outcomes.apply(lambda o: int((o == "degenerate").sum()))
    table["unparsed"] = outcomes.apply(lambda o: int((o == "unparsed").sum()))
    row_cells = [{"model": m} for m in table.index]
    proxy = (records["judge_kind"] == "proxy").any()
    if paper and not proxy:  # a proxy is not the paper's measurement: no paper rows beside it
        paper_rows = pd.DataFrame.from_dict(TABLE4, orient="index")[order]
        table = with_rows(table, paper_rows)
    columns = [{"dataset": d, "verdict": [True, False]} for d in order]
    columns += [{"outcome": "degenerate"}, {"outcome": "unparsed"}]
    table = with_cells(table.round(3), row_cells, columns)
    out = {"table4_proxy" if proxy else "table4": table}
    counts = records.groupby(["model", "dataset"], sort=False).agg(
        samples=("sample_id", "count"),
        faithful=("outcome", lambda o: int((o == "faithful").sum())),
        hallucinated=("outcome", lambda o: int((o == "hallucinated").sum())),
        degenerate=("outcome", lambda o: int((o == "degenerate").sum())),
        unparsed_verdicts=("outcome", lambda o: int((o == "unparsed").sum())),
        truncated=("truncated_tokens", lambda t: int((t > 0).sum())),
    )
    counts["judge"] = records.groupby(["model", "dataset"], sort=False)["judge"].first()
    out["judging"] = with_cells(counts, [{"model": m, "dataset": d} for m, d in counts.index], [{}] * counts.shape[1])
    agreement = judge_agreement(records)
    if agreement is not None:
        out["judges"] = agreement
    return out


def _with_outcomes(records: pd.DataFrame) -> pd.DataFrame:
    """Each record's outcome; records from before outcomes were kept get theirs from the verdict."""
    derived = records["verdict"].map({True: "faithful", False: "hallucinated"}).fillna("unparsed")
    if "outcome" not in records:
        return records.assign(outcome=derived)
    return records.assign(outcome=records["outcome"].fillna(derived))


KAPPA_RESAMPLES = 2000


def judge_agreement(records: pd.DataFrame) -> pd.DataFrame | None:
    """With several judges: each judge's accuracy per model (over its parsed verdicts of judged outputs) and its
    agreement with the primary judge, Cohen's κ on the outputs both judged, with a 95 % bootstrap CI over those
    outputs (KAPPA_RESAMPLES resamples, seed 0). None with one judge."""
    import numpy as np
    import pandas as pd

    from diffeval.intervals import resample

    if "other_verdicts" not in records or not records["other_verdicts"].map(bool, na_action="ignore").any():
        return None
    live = records[records["outcome"] != "degenerate"]
    primary = live["judge"].iloc[0]
    verdicts = {primary: live["verdict"]}
    for judge_id in dict.fromkeys(k for found in live["other_verdicts"].dropna() for k in found):
        verdicts[judge_id] = live["other_verdicts"].map(lambda found, j=judge_id: (found or {}).get(j))
    rows = []
    for judge_id, values in verdicts.items():
        row: dict = {"judge": judge_id}
        for model in live["model"].unique():
            mine = values[live["model"] == model].dropna()
            row[f"accuracy {model}"] = mine.astype(float).mean() if len(mine) else np.nan
        both = pd.DataFrame({"a": verdicts[primary], "b": values}).dropna()
        row["both judged"] = len(both)
        if judge_id == primary:
            row.update({"kappa": np.nan, "kappa_low": np.nan, "kappa_high": np.nan})
        else:
            a, b = both["a"].astype(bool).to_numpy(), both["b"].astype(bool).to_numpy()
            draws = resample(lambda i, a=a, b=b: cohen_kappa(a[i], b[i]), len(a), resamples=KAPPA_RESAMPLES, seed=0)
            low, high = np.nanpercentile(draws, [2.5, 97.5]) if len(a) else (np.nan, np.nan)
            row.update({"kappa": cohen_kappa(a, b), "kappa_low": low, "kappa_high": high})
        rows.append(row)
    table = pd.DataFrame(rows).set_index("judge").round(3)
    return with_cells(table, [None] * len(table), [None] * table.shape[1])  # not a cell of records


def cohen_kappa(a: np.ndarray, b: np.ndarray) -> float:
    """Cohen's κ of two binary raters: (observed − chance agreement) ÷ (1 − chance); NaN when chance is 1."""
    import numpy as np

    if len(a) == 0:
        return np.nan
    observed = np.mean(a == b)
    chance = np.mean(a) * np.mean(b) + np.mean(~a) * np.mean(~b)
    return np.nan if chance == 1 else float((observed - chance) / (1 - chance))


@lru_cache(maxsize=4)
def _documents(name: str, data_dir: str | None, count: int) -> dict[str, data.Document]:
    """A dataset's documents by id, read once for all the samples a viewer opens."""
    return {d.id: d for d in data.load(name, data_dir, count)}


VIEW_EDGE_CHARS = 1500  # document characters shown on each side of an elided middle
VIEW_FULL_CHARS = 200_000  # documents up to this length come whole, for the page to show when asked


def sample_view(config, records: dict[str, dict], tokenizer_for, full_text: bool | None):
    """For `diffeval view`: the sample's question and document, read again from the run's data, the reference, and
    each model's output with its verdict, judge and rationale. A long document comes as its two ends, and whole too
    when `full_text` (None: up to VIEW_FULL_CHARS)."""
    from diffeval.tasks.blocks import Document, Elided, Field, Output, Outputs, Text

    first = next(iter(records.values()))
    document = _documents(first["dataset"], config.options.data_dir, config.options.samples).get(first["id"])
    if document is None:
        raise InputError(f"document {first['id']} is no longer in the run's {first['dataset']} data")
    text, edge = document.context, VIEW_EDGE_CHARS
    whole = len(text) <= VIEW_FULL_CHARS if full_text is None else full_text
    if len(text) > 2 * edge + 200:
        shown = Elided(text[:edge], text[-edge:], f"… {len(text) - 2 * edge} characters …", text if whole else None)
    else:
        shown = text
    blocks = [Text([document.question], style="paragraph", title="Question")] if document.question else []
    blocks += [
        Text([shown], style="document", title=f"Document ({len(text)} characters)"),
        Text([first.get("reference") or ""], style="paragraph", title="Reference"),
    ]
    verdicts = {True: "hallucination-free", False: "hallucinated", None: "verdict unparsed"}
    outputs = [
        Output(model, record.get("output"), record.get("verdict"), verdicts[record.get("verdict")], [
            Field("judge", record.get("judge")), Field("rationale", record.get("judge_rationale") or "—"),
            Field("document tokens cut", record.get("truncated_tokens")),
        ])
        for model, record in records.items()
    ]  # fmt: skip
    return Document([*blocks, Outputs(outputs, title="Outputs")])


def sizing(samples: list[HallucinationSample], tokenizer, config) -> tuple[int, int]:
    """Each document's prompt as fitted to the budget; generation at most the dataset's output length."""
    prompt = generated = 0
    for sample in samples:
        spec = data.SPECS[sample.dataset]
        room = config.options.ctx[0] - spec.max_new_tokens
        prompt += len(fit_prompt(spec, sample.document, tokenizer, room, config.chat_template)[0])
        generated += spec.max_new_tokens
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
}


MIN_PROMPT_TOKENS = 65  # the least prompt a context must leave beside the output: the template and some document


def budget(config) -> ContextBudget:
    """Each sample reserves its dataset's output length (LongBench's), so each length holds the longest of the run's
    datasets beside a prompt."""
    answer = max(data.SPECS[name].max_new_tokens for name in config.options.datasets)
    return ContextBudget(config.options.ctx, answer, MIN_PROMPT_TOKENS)


TASK = Task(
    name="hallucination",
    help="Contextual hallucination on summarization and QA (paper Table 4), judged.",
    options=HallucinationOptions,
    run_options=("chat_template",),
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
        titles={
            "table4": "Table 4 layout: fraction judged hallucination-free",
            "table4_proxy": "Table 4 layout, PROXY (overlap judge): fraction with few unsupported units; not a "
            "hallucination rate",
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
        decimals={"degenerate": 0, "unparsed": 0},  # counts, beside the paper's rows
        plots=plots,
    ),
    viewing=Viewing(
        sample_view=sample_view,
        listing=Listing(answer="output", expected="reference", outcome="verdict"),  # hallucination-free is right
    ),
    scoring=Scoring(record_schema=RECORD_SCHEMA),
)
