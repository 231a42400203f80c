"""Hallucination's tables, plot and sample view: the paper's Table 4 layout (or its proxy), the judging counts, the
judges' agreement, and a sample's document, reference and each model's judged output."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from diffeval.data import hallucination as data
from diffeval.errors import InputError
from diffeval.paper import TABLE4, coverage
from diffeval.tasks import thinking
from diffeval.tasks.base import RunContext, with_cells, with_rows
from diffeval.tasks.conversations.hallucination_options import HallucinationOptions
from diffeval.tasks.conversations.judging import judge_agreement

if TYPE_CHECKING:  # annotations only: heavy libraries load inside the functions that use them (a fast CLI)
    from pathlib import Path

    import pandas as pd


def plots(records: pd.DataFrame, folder: Path) -> list[Path]:
    from diffeval.plotting import legend, panels, save, text_width

    judged = records.dropna(subset=["score"])
    bars = judged.pivot_table(index="dataset", columns="model", values="score", aggfunc="mean", sort=False)
    proxy = (records["judge_kind"] == "proxy").any()
    # a dataset's group is as wide as its name or its bars, one a model
    group = max(max(text_width(str(name)) for name in bars.index) + 0.2, 0.3 * len(bars.columns) + 0.3)
    fig, (ax,) = panels(1, max(6.0, 1.0 + group * len(bars)), 3.6)
    bars.plot.bar(ax=ax, rot=0)
    ax.set(
        ylim=(0, 1),
        ylabel="proxy score" if proxy else "hallucination-free fraction",
        title="overlap PROXY (not a hallucination rate)" if proxy else "judged hallucination-free",
    )
    legend(fig, [ax], title="model")
    return [save(fig, folder / "hallucination.png")]


def tables(records: pd.DataFrame, options: HallucinationOptions, paper: bool = False) -> dict[str, pd.DataFrame]:
    import pandas as pd

    records = _with_outcomes(records)
    judged = records.dropna(subset=["score"])
    table = judged.pivot_table(index="model", columns="dataset", values="score", aggfunc="mean", sort=False)
    order = [d for d in data.DATASETS if d in table.columns]
    table = table[order]
    thought = thinking.has_thinking(records)  # a thinking run's: its unclosed thinking counted beside
    if thought:  # a model whose thinking never closed on any sample has a row too
        table = table.reindex(list(dict.fromkeys(records["model"])))
        table.index.name = "model"
    outcomes = records.groupby("model", sort=False)["outcome"]
    table["degenerate"] = outcomes.apply(lambda o: int((o == "degenerate").sum()))
    table["unparsed"] = outcomes.apply(lambda o: int((o == "unparsed").sum()))
    if thought:
        table[thinking.UNCLOSED] = outcomes.apply(lambda o: int((o == thinking.UNCLOSED).sum()))
    row_cells = [{"model": m} for m in table.index]
    proxy = (records["judge_kind"] == "proxy").any()
    if paper and not proxy:  # a proxy is not the paper's measurement: no paper rows beside it
        paper_rows = pd.DataFrame.from_dict(TABLE4, orient="index")[order]
        table = with_rows(table, paper_rows)
    columns = [{"dataset": d, "verdict": [True, False]} for d in order]
    columns += [{"outcome": "degenerate"}, {"outcome": "unparsed"}]
    columns += [{"outcome": thinking.UNCLOSED}] if thought else []
    table = with_cells(table.round(3), row_cells, columns)
    out = {"table4_proxy" if proxy else "table4": table}
    counts = records.groupby(["model", "dataset"], sort=False).agg(
        samples=("sample_id", "count"),
        faithful=("outcome", lambda o: int((o == "faithful").sum())),
        hallucinated=("outcome", lambda o: int((o == "hallucinated").sum())),
        degenerate=("outcome", lambda o: int((o == "degenerate").sum())),
        unparsed_verdicts=("outcome", lambda o: int((o == "unparsed").sum())),
        **(
            {
                thinking.UNCLOSED: ("outcome", lambda o: int((o == thinking.UNCLOSED).sum())),
                "thinking_tokens": ("thinking_tokens", "mean"),
            }
            if thought
            else {}
        ),
        truncated=("truncated_tokens", lambda t: int((t > 0).sum())),
    )
    counts["judge"] = records.groupby(["model", "dataset"], sort=False)["judge"].first()
    out["judging"] = with_cells(counts, [{"model": m, "dataset": d} for m, d in counts.index], [{}] * counts.shape[1])
    agreement = judge_agreement(records)
    if agreement is not None:
        out["judges"] = agreement
    return thinking.with_thinking_note(out, records)


def _with_outcomes(records: pd.DataFrame) -> pd.DataFrame:
    """Each record's outcome; records from before outcomes were kept get theirs from the verdict."""
    derived = records["verdict"].map({True: "faithful", False: "hallucinated"}).fillna("unparsed")
    if "outcome" not in records:
        return records.assign(outcome=derived)
    return records.assign(outcome=records["outcome"].fillna(derived))


@lru_cache(maxsize=4)
def _documents(name: str, data_dir: str | None, count: int) -> dict[str, data.Document]:
    """A dataset's documents by id, read once for all the samples a viewer opens."""
    return {d.id: d for d in data.load(name, data_dir, count, up_to=True)}  # what the run read


VIEW_EDGE_CHARS = 1500  # document characters shown on each side of an elided middle
VIEW_FULL_CHARS = 200_000  # documents up to this length come whole, for the page to show when asked


def sample_view(
    context: RunContext[HallucinationOptions], records: dict[str, dict], tokenizer_for, full_text: bool | None
):
    """For `diffeval view`: the sample's question and document, read again from the run's data, the reference, and
    each model's output with its verdict, judge and rationale. A long document comes as its two ends, and whole too
    when `full_text` (None: up to VIEW_FULL_CHARS)."""
    from diffeval.tasks.blocks import Document, Elided, Field, Output, Outputs, Text

    first = next(iter(records.values()))
    options = context.options
    document = _documents(first["dataset"], options.data_dir, options.samples).get(first["id"])
    if document is None:
        raise InputError(f"document {first['id']} is no longer in the run's {first['dataset']} data")
    text, edge = document.context, VIEW_EDGE_CHARS
    whole = len(text) <= VIEW_FULL_CHARS if full_text is None else full_text
    shown: Elided | str
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

    def label(record: dict) -> str:
        return "thinking unclosed" if record.get("outcome") == thinking.UNCLOSED else verdicts[record.get("verdict")]

    def thought(record: dict) -> list:  # a thinking run's: the thinking and its length
        if record.get("thinking_tokens") is None:
            return []
        return [Field("thinking tokens", record.get("thinking_tokens")), Field("thinking", record.get("thinking"))]

    outputs = [
        Output(model, record.get("output"), record.get("verdict"), label(record), [
            Field("judge", record.get("judge")), Field("rationale", record.get("judge_rationale") or "—"),
            Field("document tokens cut", record.get("truncated_tokens")), *thought(record),
        ])
        for model, record in records.items()
    ]  # fmt: skip
    return Document([*blocks, Outputs(outputs, title="Outputs")])


def paper_coverage(records: pd.DataFrame, options: HallucinationOptions) -> str:
    """Table 4 is each dataset's share of outputs a GPT-4o judge finds hallucination-free, at 4K; a proxy judge's
    verdicts are not that measurement."""
    datasets = list(next(iter(TABLE4.values())))
    judged = records[records["judge_kind"] != "proxy"]
    run = set(judged["dataset"])
    has = [d for d in datasets if d in run]
    said = coverage("Table 4 (hallucination-free outputs by dataset, a GPT-4o judge)", has,
                    [d for d in datasets if d not in run])  # fmt: skip
    return said + (" A proxy judge's verdicts are not the paper's measurement." if len(judged) < len(records) else "")
