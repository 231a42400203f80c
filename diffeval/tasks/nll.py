"""NLL by position on long documents (paper Figure 4): how well each model uses a growing context.

Recipe:
1. documents: books from their first chapter (the `--data-dir` folder, else the book the package ships), or a
   dataset's `text` field (`--data hf:DATASET[:SPLIT]`); `--windows K` cuts K disjoint windows from each.
2. windows (`prepare`, with every model's tokenizer): a window is the longest stretch of text from its start, cut at
   whitespace, that fits `--ctx` − 1 tokens with the document-start token in every model's tokens, so every model
   scores the same bytes (the position left over is the one token vLLM must generate after a prompt).
3. backend: `token_nll` over [start token] + the window's tokens, one causal pass: every text token's NLL.
4. scores (pure): per window, NLL summed per token-position bucket (token j at sequence position j) and per
   byte-position bucket (a token counts in the bucket of its last UTF-8 byte), the bucket's bytes, and a strip of
   STRIP_BINS byte bins for the viewer.
5. tables: bits per byte by byte position (comparable across any tokenizers), NLL per token by token position (only
   when every model has the same tokens for every window: the paper's plot), the context gain (the first bucket
   minus each later one) and the paired DIFF − baseline difference per bucket; intervals resample whole documents
   (a book's windows together); the paper's cumulative-average curve as a PNG.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from diffeval.config import context_option, option, parse_ctx
from diffeval.data import books
from diffeval.errors import InputError
from diffeval.models.backend import Backend, Tokenizer
from diffeval.records import Record, sample_id
from diffeval.tasks.base import ContextBudget, Reporting, Running, Scoring, Task, Viewing, with_cells
from diffeval.tasks.blocks import Chart, Document, Field, Fields, Listing, Mark, Notice, Section, Series, Text

if TYPE_CHECKING:  # annotations only: heavy libraries load inside the functions that use them (a fast CLI)
    from pathlib import Path

    import numpy as np
    import pandas as pd

STRIP_BINS = 64  # byte bins of the viewer's loss strip
DIFFERING_BINS = 5  # stretches the viewer shows where two models differ most
LN2 = math.log(2)
PAPER_NOTE = (
    "Paper Figure 4 (no table): cumulative average NLL of book tokens by position up to 64K, a 3B DIFF model and its "
    "Transformer baseline both extended to 64K; DIFF's curve lies below and keeps falling with position, which the "
    "paper reads as DIFF using the growing context. It gives a plot, not numbers: compare this run's curve "
    "(nll_curve.png) and its context gain, not values."
)


@dataclass(frozen=True)
class NLLOptions:
    """NLL by position: each document (or each of its --windows) scored in one pass of --ctx tokens."""

    ctx: list[int] = context_option([4096], help="tokens per pass (one length), e.g. 64k")
    docs: int | None = option(None, type=int, help="documents to score [default: all]")
    windows: int = option(1, help="disjoint windows of --ctx tokens per document")
    data: str = option("books", help="books (the --data-dir folder, else the shipped book) | hf:DATASET[:SPLIT]")
    data_dir: str | None = option(None, help="a books folder: books.jsonl + <id>.txt (../shared/datasets/books)")
    buckets: int = option(16, help="position buckets per window, for the tables and the curve")
    trained_at: int | None = option(
        None,
        help="the models' training length, e.g. 8k: adds the change in loss past it [default: none]",
        parse=lambda v: parse_ctx(v)[0] if v not in (None, "") else None,
        identity=False,
    )

    def validate(self) -> None:
        if len(self.ctx) != 1:
            raise InputError(f"--ctx {self.ctx}: give one length; each document gets one pass at it")
        if self.docs is not None and self.docs < 1:
            raise InputError(f"--docs {self.docs}: give at least 1, or leave it out to score every document")
        if self.windows < 1:
            raise InputError(f"--windows {self.windows}: give at least 1")
        if not 1 <= self.buckets <= self.ctx[0] // 2:
            raise InputError(f"--buckets {self.buckets}: give 1 to {self.ctx[0] // 2} (half of --ctx)")
        if self.trained_at is not None and self.trained_at * self.buckets < self.ctx[0]:
            raise InputError(
                f"--trained-at {self.trained_at:,} is shorter than one bucket ({self.ctx[0] // self.buckets:,} "
                "tokens): give more --buckets or a longer --trained-at"
            )
        if self.trained_at is not None and self.trained_at >= self.ctx[0]:
            raise InputError(
                f"--trained-at {self.trained_at:,} is not shorter than --ctx {self.ctx[0]:,}: nothing lies past it, "
                "leave it out"
            )


@dataclass(frozen=True)
class Window:
    sample_id: str
    doc: str
    title: str
    group: str  # resampled as one unit: a book's windows are not independent
    index: int  # the window's number within its document
    start: int  # character offsets into the document's text
    end: int
    bytes: int
    ctx: int


def budget(config) -> ContextBudget:
    # one position past the sequence: vLLM generates a token after every prompt, and both engines score the same ids
    return ContextBudget(config.options.ctx, answer=1, least_prompt=2)


def check_inputs(config) -> None:
    books.load(config.options.data, config.options.data_dir, config.options.docs)


def prepare(config, tokenizers: dict[str, Tokenizer]) -> list[Window]:
    """Every document's windows, fitted to every model's tokens (see the module's recipe, step 2)."""
    options = config.options
    ctx = options.ctx[0]
    limits = {}
    for model, tokenizer in tokenizers.items():
        start = tokenizer.document_start()
        if not start:
            raise InputError(f"model {model}: its tokenizer has neither a BOS nor an EOS token to start a document")
        limits[model] = ctx - 1 - len(start)
    windows = []
    for doc in books.load(options.data, options.data_dir, options.docs):
        start = 0
        for index in range(options.windows):
            start = _skip_space(doc.text, start)
            ends = {m: _fitted_end(doc, start, tokenizers[m], limits[m], index, ctx) for m in tokenizers}
            end = _shared_end(doc.text, start, min(ends.values()), tokenizers, limits)
            key = f"nll|{options.data}|{doc.id}|{ctx}|{options.buckets}|{index}|{start}|{end}"
            size = len(doc.text[start:end].encode("utf-8"))
            windows.append(Window(sample_id(key), doc.id, doc.title, doc.group, index, start, end, size, ctx))
            start = end
    return windows


def _skip_space(text: str, start: int) -> int:
    while start < len(text) and text[start].isspace():
        start += 1
    return start


def _fitted_end(doc: books.Document, start: int, tokenizer: Tokenizer, limit: int, index: int, ctx: int) -> int:
    """The character end of the first `limit` tokens of the document's text from `start`, in this tokenizer; the
    document is too short if its rest holds fewer."""
    span = limit * 8
    while True:
        piece = doc.text[start : start + span]
        encoding = tokenizer.encode(piece, special_tokens=False)
        if len(encoding.ids) >= limit:
            return start + encoding.offsets[limit - 1][1]
        if start + span >= len(doc.text):
            if index == 0:
                raise InputError(
                    f"--ctx {ctx:,} is longer than document {doc.id}: its text holds {len(encoding.ids):,} tokens "
                    "from its first chapter: use a shorter --ctx"
                )
            raise InputError(
                f"document {doc.id} holds {index} window(s) of --ctx {ctx:,}, not {index + 1}: "
                f"use --windows {index} or a shorter --ctx"
            )
        span *= 2


def _shared_end(text: str, start: int, end: int, tokenizers: dict[str, Tokenizer], limits: dict[str, int]) -> int:
    """`end` moved back to the whitespace before it, and further back while a model's tokens of the window would be
    over its limit (a cut can tokenize differently from the text around it)."""
    while True:
        cut = max(text.rfind(" ", start, end), text.rfind("\n", start, end))
        end = cut if cut > start else end
        window = text[start:end]
        if all(len(t.encode(window, special_tokens=False).ids) <= limits[m] for m, t in tokenizers.items()):
            return end
        end -= 1


def make_samples(options: NLLOptions, seed: int, limit: int | None = None, prepared=None) -> list[Window]:
    """The windows `prepare` fitted (documents are read in their order: the seed changes nothing)."""
    return list(prepared[:limit] if limit else prepared)


def _text(window: Window, options: NLLOptions) -> str:
    (doc,) = [d for d in books.load(options.data, options.data_dir, options.docs) if d.id == window.doc]
    return doc.text[window.start : window.end]


def evaluate(batch: list[Window], backend: Backend, config) -> list[Record]:
    import numpy as np

    options = config.options
    records = []
    for window in batch:
        began = time.perf_counter()
        text = _text(window, options)
        start = backend.document_start()
        encoding = backend.encode(text, special_tokens=False)
        ids = start + encoding.ids
        nll = np.asarray(backend.token_nll(ids), dtype=np.float64)
        fields = score(nll, encoding.offsets, len(start), text, window, options.buckets)
        fields["ids_sha"] = hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()[:16]
        seconds = time.perf_counter() - began
        records.append(Record("nll", backend.info.name, window.sample_id, len(ids), 0, seconds, fields))
    return records


def score(nll: np.ndarray, offsets: list, start_tokens: int, text: str, window: Window, buckets: int) -> dict:
    """A window's record fields from its tokens' NLL (nats; nll[j - 1] is sequence position j's, the text's tokens
    coming after `start_tokens`): totals, sums per token- and byte-position bucket, and the viewer's strip."""
    import numpy as np

    text_nll = nll[start_tokens - 1 :]  # every text token is predicted: the start token comes before the first
    positions = np.arange(start_tokens, start_tokens + len(text_nll))
    byte_ends = np.concatenate([[0], np.cumsum(_char_bytes(text))])
    size = int(byte_ends[-1])
    last_byte = byte_ends[np.asarray([end for _, end in offsets], dtype=np.int64)] - 1
    token_bucket = positions * buckets // window.ctx
    byte_bucket = np.clip(last_byte, 0, size - 1) * buckets // size
    strip_bin = np.clip(last_byte, 0, size - 1) * STRIP_BINS // size
    edges, strip_edges = bucket_edges(size, buckets), bucket_edges(size, STRIP_BINS)
    strip = np.bincount(strip_bin, text_nll, STRIP_BINS) / (LN2 * np.maximum(np.diff(strip_edges), 1))
    total = float(text_nll.sum())
    return {
        "doc": window.doc,
        "title": window.title,
        "group": window.group,
        "window": window.index,
        "start": window.start,
        "end": window.end,
        "ctx": window.ctx,
        "bytes": size,
        "tokens": len(text_nll),
        "nll": total,
        "bpb": total / (LN2 * size),
        "nll_per_token": total / len(text_nll),
        "token_nll": np.bincount(token_bucket, text_nll, buckets).round(6).tolist(),
        "token_counts": np.bincount(token_bucket, minlength=buckets).tolist(),
        "byte_nll": np.bincount(byte_bucket, text_nll, buckets).round(6).tolist(),
        "bucket_bytes": np.diff(edges).tolist(),
        "strip": strip.round(4).tolist(),
    }


def bucket_edges(size: int, buckets: int) -> list[int]:
    """Where each of `buckets` buckets of `size` bytes starts (and, last, the end): byte b lies in bucket
    b · buckets // size, so bucket k starts at the ceiling of k · size / buckets."""
    return [-(-k * size // buckets) for k in range(buckets + 1)]


# ---- tables ------------------------------------------------------------------------------------------------------
def shared_tokens(records: pd.DataFrame) -> bool:
    """Whether every model has the same token ids for every window: per-token NLL compares only then."""
    return bool((records.groupby("sample_id")["ids_sha"].nunique() == 1).all())


def _sums(group: pd.DataFrame, value: str, count: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per document: the bucket sums of `value` and `count`, each (documents, buckets); and each window's document."""
    import numpy as np

    from diffeval.intervals import cluster_numbers

    clusters = cluster_numbers(group["group"])
    values, counts = np.asarray(group[value].tolist(), float), np.asarray(group[count].tolist(), float)
    units = clusters.max() + 1
    sums = np.zeros((units, values.shape[1]))
    totals = np.zeros((units, values.shape[1]))
    np.add.at(sums, clusters, values)
    np.add.at(totals, clusters, counts)
    return sums, totals, clusters


def _ratio_intervals(group: pd.DataFrame, value: str, count: str, scale: float, reference: int | None = None):
    """Per bucket: Σ value ÷ (scale · Σ count) over the windows, and its 95 % interval from a bootstrap of whole
    documents; with a `reference` bucket, the reference's ratio minus each bucket's, in the same resamples (a paired
    interval: the context gain from the first bucket, or the change past the training length)."""
    import numpy as np

    from diffeval.intervals import percentile_interval, resample

    sums, totals, clusters = _sums(group, value, count)

    def statistic(picks):  # picks: (resamples, clusters) → (resamples, buckets)
        ratio = sums[picks].sum(axis=1) / (scale * totals[picks].sum(axis=1))
        return ratio if reference is None else ratio[:, reference : reference + 1] - ratio

    point = statistic(np.arange(len(sums))[None, :])[0]
    if len(sums) < 2:
        return point, point, point
    draws = resample(statistic, len(clusters), clusters=group["group"].to_numpy(), vectorized=True)
    bounds = np.array([percentile_interval(draws[:, b]) for b in range(draws.shape[1])])
    return point, bounds[:, 0], bounds[:, 1]


def _position_table(records, value: str, count: str, scale: float, metric: str, unit: str, reference=None, sign=1):
    """One row per model and bucket (from `reference` on, when given): the bucket's ratio, or `sign` × (the
    reference's minus the bucket's), with its interval, and the documents and windows behind it."""
    import pandas as pd

    rows, cells = [], []
    for model, group in records.groupby("model", sort=False):
        point, low, high = _ratio_intervals(group, value, count, scale, reference)
        if sign < 0:  # (+ 0.0: the reference bucket's 0 shows as 0, not −0)
            point, low, high = 0.0 - point, 0.0 - high, 0.0 - low
        width = (group["ctx"].iloc[0] if unit == "tokens" else group["bytes"].mean()) / len(point)
        for bucket, (p, lo, hi) in enumerate(zip(point, low, high)):
            if reference is not None and bucket < reference:
                continue
            rows.append(
                {
                    "model": model,
                    "bucket": bucket,
                    f"{unit} from": round(bucket * width),
                    f"{unit} to": round((bucket + 1) * width),
                    metric: p,
                    "ci_low": lo,
                    "ci_high": hi,
                    "documents": group["group"].nunique(),
                    "windows": len(group),
                }
            )
            cells.append({"model": model})
    table = pd.DataFrame(rows).set_index(["model", "bucket"])
    return with_cells(table, cells, [{}] * table.shape[1])


def training_bucket(options: NLLOptions) -> int | None:
    """The last token bucket inside `--trained-at` (None without it)."""
    if options.trained_at is None:
        return None
    return options.trained_at * options.buckets // options.ctx[0] - 1


def common_windows(records: pd.DataFrame) -> pd.DataFrame:
    """The records of the windows every model scored. A folder resumed with another model whose tokenizer fits
    other windows also holds the earlier models' records of the earlier windows: those compare with nothing."""
    models = records["model"].nunique()
    return records[records.groupby("sample_id")["model"].transform("nunique") == models]


def tables(records: pd.DataFrame, options: NLLOptions, paper: bool = False) -> dict[str, pd.DataFrame]:
    everyone = common_windows(records)
    dropped = records["sample_id"].nunique() - everyone["sample_id"].nunique()
    records = everyone
    shared = shared_tokens(records)
    out = {
        "nll_bytes": _position_table(records, "byte_nll", "bucket_bytes", LN2, "bpb", "bytes"),
        "nll_gain": _position_table(records, "byte_nll", "bucket_bytes", LN2, "gain_bpb", "bytes", reference=0),
    }
    if shared:
        out["nll_tokens"] = _position_table(records, "token_nll", "token_counts", 1.0, "nll", "tokens")
    trained = training_bucket(options)
    if trained is not None:  # each model in its own tokens: a statement about its own curve, any tokenizers
        rise = _position_table(records, "token_nll", "token_counts", 1.0, "rise_nll", "tokens", trained, sign=-1)
        rise.attrs["note"] = (
            f"rise = NLL per token (nats) of each bucket minus that of bucket {trained}, the last inside the "
            f"training length ({options.trained_at:,} tokens), in each model's own tokens; positive: the loss rises "
            "past the training length; paired interval from a bootstrap of whole documents"
        )
        out["nll_past_training"] = rise
    view = (
        "The models share a tokenizer (the same ids in every window): per-token NLL by token position compares "
        "them, as the paper's plot does; bits per byte too."
        if shared
        else "The models' tokenizers differ: only bits per byte by byte position compares them (per-token NLL "
        "counts different tokens); no per-token table."
    )
    scored = records.drop_duplicates("sample_id")["bytes"].sum()
    left_out = f" {dropped} window(s) that not every model scored are left out." if dropped else ""
    out["nll_bytes"].attrs["note"] = (
        f"{view} Every model scored the same {scored:,} bytes ({records['group'].nunique()} documents, "
        f"{records['sample_id'].nunique()} windows).{left_out}" + (f" {PAPER_NOTE}" if paper else "")
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

    from diffeval.plotting import plt

    records = common_windows(records)
    shared = shared_tokens(records)
    value, count, scale = ("token_nll", "token_counts", 1.0) if shared else ("byte_nll", "bucket_bytes", LN2)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for model, group in records.groupby("model", sort=False):
        sums = np.asarray(group[value].tolist()).sum(axis=0)
        counts = np.asarray(group[count].tolist()).sum(axis=0)
        cumulative = np.cumsum(sums) / (scale * np.cumsum(counts))
        width = (group["ctx"].iloc[0] if shared else group["bytes"].mean()) / len(sums)
        ax.plot(np.arange(1, len(sums) + 1) * width, cumulative, marker="o", markersize=3, label=model)
    ax.set_xlabel("token position" if shared else "byte position")
    ax.set_ylabel("cumulative average NLL (nats per token)" if shared else "cumulative bits per byte")
    ax.set_title(f"NLL by position ({records['group'].nunique()} documents, {records['sample_id'].nunique()} windows)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = folder / "nll_curve.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


# ---- view --------------------------------------------------------------------------------------------------------
def sample_view(config, records: dict[str, dict], tokenizer_for, full_text: bool | None) -> Document:
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
        text = _text(window, config.options)
    except InputError as exc:  # the documents are not where the run read them
        return Document([*blocks, Notice(f"the window's text is not available here: {exc}")])
    (a, left), (b, right) = list(records.items())[:2]
    gaps = [x - y for x, y in zip(left["strip"], right["strip"])]
    order = sorted(range(STRIP_BINS), key=lambda i: -abs(gaps[i]))[:DIFFERING_BINS]
    starts, edges = _byte_to_char(text), bucket_edges(window.bytes, STRIP_BINS)
    pieces = []
    for i in sorted(order):
        lo, hi = starts[edges[i]], starts[edges[i + 1]]
        stretch = text[lo:hi]
        shown = stretch if full_text or len(stretch) <= 400 else stretch[:200] + " … " + stretch[-200:]
        note = f"{a} {left['strip'][i]:.2f}, {b} {right['strip'][i]:.2f} bits per byte ({gaps[i]:+.2f})"
        pieces += [Mark([shown], note=note), "\n\n"]
    title = f"the {DIFFERING_BINS} stretches where {a} and {b} differ most"
    return Document([*blocks, Section([Text(pieces, style="document")], title=title)])


def _char_bytes(text: str) -> np.ndarray:
    """Each character's UTF-8 length."""
    import numpy as np

    return np.fromiter((len(c.encode("utf-8")) for c in text), dtype=np.int64, count=len(text))


def _byte_to_char(text: str) -> np.ndarray:
    """Index by byte offset (0 .. bytes) → the character that byte belongs to (the text's length at the end)."""
    import numpy as np

    return np.append(np.repeat(np.arange(len(text)), _char_bytes(text)), len(text))


RECORD_SCHEMA = {
    "doc": str,
    "title": str,
    "group": str,
    "window": int,
    "start": int,
    "end": int,
    "ctx": int,
    "bytes": int,
    "tokens": int,
    "nll": float,
    "bpb": float,
    "nll_per_token": float,
    "token_nll": list[float],
    "token_counts": list[int],
    "byte_nll": list[float],
    "bucket_bytes": list[int],
    "strip": list[float],
    "ids_sha": str,
}


def sizing(samples: list[Window], tokenizer, config) -> tuple[int, int]:
    """Tokens each window costs this model (start token included), nothing generated."""
    start = len(tokenizer.document_start())
    return sum(start + len(tokenizer.encode(_text(w, config.options), False).ids) for w in samples), 0


TASK = Task(
    name="nll",
    help="NLL by position on long documents: bits per byte and per-token NLL by position (paper Figure 4).",
    options=NLLOptions,
    running=Running(
        make_samples=make_samples,
        evaluate=evaluate,
        needs=frozenset({"token_nll"}),
        budget=budget,
        check_inputs=check_inputs,
        prepare=prepare,
        sizing=sizing,
    ),
    reporting=Reporting(
        tables=tables,
        titles={
            "nll_bytes": "Bits per byte by byte position",
            "nll_tokens": "NLL per token by token position",
            "nll_gain": "Context gain: bits per byte of the first bucket minus each bucket's",
            "nll_paired": "Paired DIFF − baseline difference per position bucket",
            "nll_past_training": "Past the training length: change in NLL per token from its last bucket",
        },
        note=(
            "bits per byte = sum of token NLL / (ln 2 x bytes), a token counted in the bucket of its last UTF-8 byte; "
            "NLL per token in nats; one pass per window; 95 % intervals from a bootstrap of whole documents"
        ),
        summary_keys=["model", "ctx"],
        pair_keys=["ctx"],
        metrics={"bpb": "bpb", "nll_per_token": "nll_per_token"},
        summary_value="bpb",
        cluster_keys=["group"],
        plots=plots,
        pair_tables=pair_tables,
    ),
    viewing=Viewing(sample_view=sample_view, listing=Listing(answer=None, expected=None, outcome=None)),
    scoring=Scoring(record_schema=RECORD_SCHEMA),
)
