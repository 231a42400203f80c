"""NLL's tables, plot and sample view: bits per byte and NLL per token by position, the context gain, the change past
the training length, the paired DIFF − baseline differences, the paper's Figure 4 curve, and a window's loss strip."""

from __future__ import annotations

from typing import TYPE_CHECKING

from diffeval.errors import InputError
from diffeval.longctx.lengths import format_ctx
from diffeval.paper import coverage
from diffeval.tasks.base import RunContext, with_cells
from diffeval.tasks.blocks import Chart, Document, Field, Fields, Mark, Notice, Section, Series, Text
from diffeval.tasks.loss.buckets import LN2, STRIP_BINS, bucket_edges, common_windows, position_table, shared_tokens
from diffeval.tasks.loss.nll_options import NLLOptions
from diffeval.tasks.loss.windows import Window, byte_to_char, window_text
from diffeval.wording import counted

if TYPE_CHECKING:  # annotations only: heavy libraries load inside the functions that use them (a fast CLI)
    from pathlib import Path

    import pandas as pd

DIFFERING_BINS = 5  # stretches the viewer shows where two models differ most
PAPER_NOTE = (
    "Paper Figure 4 (no table): cumulative average NLL of book tokens by position up to 64K, a 3B DIFF model and its "
    "Transformer baseline both extended to 64K; DIFF's curve lies below and keeps falling with position, which the "
    "paper reads as DIFF using the growing context. It gives a plot, not numbers: compare this run's curve "
    "(nll_curve.png) and its context gain, not values."
)


def training_bucket(options: NLLOptions) -> int | None:
    """The last token bucket inside `--trained-at` (None without it)."""
    if options.trained_at is None:
        return None
    return options.trained_at * options.buckets // options.ctx[0] - 1


def tables(records: pd.DataFrame, options: NLLOptions, paper: bool = False) -> dict[str, pd.DataFrame]:
    everyone = common_windows(records)
    dropped = records["sample_id"].nunique() - everyone["sample_id"].nunique()
    records = everyone
    shared = shared_tokens(records)
    out = {
        "nll_bytes": position_table(records, "byte_nll", "bucket_bytes", LN2, "bpb", "bytes"),
        "nll_gain": position_table(records, "byte_nll", "bucket_bytes", LN2, "gain_bpb", "bytes", reference=0),
    }
    if shared:
        out["nll_tokens"] = position_table(records, "token_nll", "token_counts", 1.0, "nll", "tokens")
    trained = training_bucket(options)
    if trained is not None:  # each model in its own tokens: a statement about its own curve, any tokenizers
        rise = position_table(records, "token_nll", "token_counts", 1.0, "rise_nll", "tokens", trained, sign=-1)
        rise.attrs["note"] = (
            f"rise = NLL per token (nats) of each bucket minus that of bucket {trained}, the last inside the "
            f"training length ({options.trained_at:,} tokens), in each model's own tokens; positive: the loss rises "
            "past the training length; paired interval from a bootstrap of whole documents"
        )
        out["nll_past_training"] = rise
    if records["model"].nunique() < 2:
        view = "One model: per-token NLL by token position and bits per byte by byte position."
    elif shared:
        view = (
            "The models share a tokenizer (the same ids in every window): per-token NLL by token position compares "
            "them, as the paper's plot does; bits per byte too."
        )
    else:
        view = (
            "The models' tokenizers differ: only bits per byte by byte position compares them (per-token NLL "
            "counts different tokens); no per-token table."
        )
    scored = records.drop_duplicates("sample_id")["bytes"].sum()
    left_out = f" {dropped} window(s) that not every model scored are left out." if dropped else ""
    documents, windows = records["group"].nunique(), records["sample_id"].nunique()
    alone = " One document: no interval (the bootstrap resamples whole documents)." if documents < 2 else ""
    who = "Every model scored the same" if records["model"].nunique() > 1 else "The model scored"
    out["nll_bytes"].attrs["note"] = (
        f"{view} {who} {scored:,} bytes ({counted(documents, 'document')}, "
        f"{counted(windows, 'window')}).{left_out}{alone}" + (f" {PAPER_NOTE}" if paper else "")
    )
    return out


def pair_tables(records: pd.DataFrame, pairs: list[tuple[str, str]], options: NLLOptions) -> dict[str, pd.DataFrame]:
    """Per pair (DIFF − baseline) and bucket: the mean over windows of the difference in bits per byte (and in NLL
    per token when the tokenizers match), with the paired bootstrap over whole documents."""
    import numpy as np
    import pandas as pd

    from diffeval.intervals import cluster_bootstrap

    records = common_windows(records)
    views = [("bpb", "byte_nll", "bucket_bytes", LN2)]
    if shared_tokens(records):
        views.append(("nll", "token_nll", "token_counts", 1.0))
    rows, cells = [], []
    for diff, base in pairs:
        left = records[records["model"] == diff]
        joined = left.merge(records[records["model"] == base], on="sample_id", suffixes=("", "_base"))
        if joined.empty:
            continue
        for metric, value, count, scale in views:
            counts = np.asarray(joined[count].tolist()), np.asarray(joined[f"{count}_base"].tolist())
            with np.errstate(invalid="ignore", divide="ignore"):  # a bucket without tokens has no value
                first = np.asarray(joined[value].tolist()) / (scale * counts[0])
                second = np.asarray(joined[f"{value}_base"].tolist()) / (scale * counts[1])
            for bucket in range(first.shape[1]):
                kept = (counts[0][:, bucket] > 0) & (counts[1][:, bucket] > 0)
                if not kept.any():
                    continue
                differences = first[kept, bucket] - second[kept, bucket]
                stats = cluster_bootstrap(differences, joined["group"].to_numpy()[kept])
                rows.append(
                    {"diff": diff, "baseline": base, "metric": metric, "bucket": bucket, "n": len(differences),
                     "difference": differences.mean(), **stats}
                )  # fmt: skip
                cells.append({"pair": [diff, base]})
    if not rows:
        return {}
    table = pd.DataFrame(rows).set_index(["diff", "baseline", "metric", "bucket"])
    table = with_cells(table, cells, [{}] * table.shape[1])
    table.attrs["note"] = (
        "difference = DIFF − baseline, mean over the windows both scored of each window's bucket value (lower is "
        "better: a negative difference favours DIFF); CI and p-value from a paired bootstrap of whole documents"
    )
    return {"nll_paired": table}


def plots(records: pd.DataFrame, folder: Path) -> list[Path]:
    """The paper's Figure 4: the cumulative average NLL per token by token position (bits per byte by byte position
    when the tokenizers differ), every model on one plot."""
    import numpy as np

    from diffeval.plotting import legend, panels, save

    records = common_windows(records)
    shared = shared_tokens(records)
    value, count, scale = ("token_nll", "token_counts", 1.0) if shared else ("byte_nll", "bucket_bytes", LN2)
    fig, (ax,) = panels(1, 6.5, 4)
    for model, group in records.groupby("model", sort=False):
        sums = np.asarray(group[value].tolist()).sum(axis=0)
        counts = np.asarray(group[count].tolist()).sum(axis=0)
        cumulative = np.cumsum(sums) / (scale * np.cumsum(counts))
        width = (group["ctx"].iloc[0] if shared else group["bytes"].mean()) / len(sums)
        ax.plot(np.arange(1, len(sums) + 1) * width, cumulative, marker="o", markersize=3, label=model)
    ax.set_xlabel("token position" if shared else "byte position")
    ax.set_ylabel("cumulative average NLL (nats per token)" if shared else "cumulative bits per byte")
    documents, windows = records["group"].nunique(), records["sample_id"].nunique()
    ax.set_title(f"NLL by position ({counted(documents, 'document')}, {counted(windows, 'window')})")
    ax.grid(alpha=0.3)
    legend(fig, [ax], title="model")
    return [save(fig, folder / "nll_curve.png")]


# ---- view --------------------------------------------------------------------------------------------------------
def sample_view(
    context: RunContext[NLLOptions], records: dict[str, dict], tokenizer_for, full_text: bool | None
) -> Document:
    """The window's loss strip (bits per byte in STRIP_BINS stretches, per model) and the stretches where the first
    two models differ most, with their text."""
    first = next(iter(records.values()))
    keys = ("sample_id", "doc", "title", "group", "window", "start", "end", "bytes", "ctx")
    window = Window(*(first[k] for k in keys))
    fields = Fields(
        [
            Field("document", f"{window.title} ({window.doc}), window {window.index}"),
            Field("bytes scored", window.bytes),
            Field("characters", f"{window.start:,}–{window.end:,}"),
        ]
    )
    series = [Series(model, record["strip"], i) for i, (model, record) in enumerate(records.items())]
    categories = [f"{round(b * window.bytes / STRIP_BINS / 1024, 1)}K" for b in range(STRIP_BINS)]
    blocks = [fields, Chart(categories, series, title="bits per byte along the window (each bar a stretch of bytes)")]
    if len(records) < 2:
        return Document([*blocks, Notice("one model: nothing to compare stretches with", level="note")])
    try:
        text = window_text(window, context.options.data, context.options.data_dir, context.options.docs)
    except InputError as exc:  # the documents are not where the run read them
        return Document([*blocks, Notice(f"the window's text is not available here: {exc}")])
    (a, left), (b, right) = list(records.items())[:2]
    gaps = [x - y for x, y in zip(left["strip"], right["strip"])]
    order = sorted(range(STRIP_BINS), key=lambda i: -abs(gaps[i]))[:DIFFERING_BINS]
    starts, edges = byte_to_char(text), bucket_edges(window.bytes, STRIP_BINS)
    pieces = []
    for i in sorted(order):
        lo, hi = starts[edges[i]], starts[edges[i + 1]]
        stretch = text[lo:hi]
        shown = stretch if full_text or len(stretch) <= 400 else stretch[:200] + " … " + stretch[-200:]
        note = f"{a} {left['strip'][i]:.2f}, {b} {right['strip'][i]:.2f} bits per byte ({gaps[i]:+.2f})"
        pieces += [Mark([shown], note=note), "\n\n"]
    title = f"the {DIFFERING_BINS} stretches where {a} and {b} differ most"
    return Document([*blocks, Section([Text(pieces, style="document")], title=title)])


def paper_coverage(records: pd.DataFrame, options: NLLOptions) -> str:
    """Figure 4 is a plot of NLL by position on books up to 64K (no numbers to set beside a table)."""
    longest = int(records["ctx"].max())
    has = [f"positions up to {format_ctx(longest)}"] if longest >= 65536 else []
    lacks = [] if has else [f"positions up to 64K (this run reaches {format_ctx(longest)})"]
    return coverage("Figure 4 (a plot of NLL by position on books)", has, lacks)
