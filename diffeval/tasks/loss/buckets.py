"""Per-token loss by position bucket: a window's token NLL summed per token-position bucket (token j at sequence
position j) and per byte-position bucket (a token counts in the bucket of its last UTF-8 byte), with the bucket's
bytes and a strip of STRIP_BINS byte bins for the viewer; and, over windows, each bucket's ratio (bits per byte, or
NLL per token) with its 95 % interval from a bootstrap of whole documents."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from diffeval.tasks.base import with_cells
from diffeval.tasks.loss.windows import Window, char_bytes

if TYPE_CHECKING:  # annotations only: heavy libraries load inside the functions that use them (a fast CLI)
    import numpy as np
    import pandas as pd

STRIP_BINS = 64  # byte bins of the viewer's loss strip
LN2 = math.log(2)


def score(nll: np.ndarray, offsets: list, start_tokens: int, text: str, window: Window, buckets: int) -> dict:
    """A window's record fields from its tokens' NLL (nats; nll[j - 1] is sequence position j's, the text's tokens
    coming after `start_tokens`): totals, sums per token- and byte-position bucket, and the viewer's strip."""
    import numpy as np

    text_nll = nll[start_tokens - 1 :]  # every text token is predicted: the start token comes before the first
    positions = np.arange(start_tokens, start_tokens + len(text_nll))
    byte_ends = np.concatenate([[0], np.cumsum(char_bytes(text))])
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
    if len(sums) < 2:  # one document: nothing to resample, so no interval (left empty, not zero-width)
        return point, np.full_like(point, np.nan), np.full_like(point, np.nan)
    draws = resample(statistic, len(clusters), clusters=group["group"].to_numpy(), vectorized=True)
    bounds = np.array([percentile_interval(draws[:, b]) for b in range(draws.shape[1])])
    return point, bounds[:, 0], bounds[:, 1]


def position_table(records, value: str, count: str, scale: float, metric: str, unit: str, reference=None, sign=1):
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


def common_windows(records: pd.DataFrame) -> pd.DataFrame:
    """The records of the windows every model scored. A folder resumed with another model whose tokenizer fits
    other windows also holds the earlier models' records of the earlier windows: those compare with nothing."""
    models = records["model"].nunique()
    return records[records.groupby("sample_id")["model"].transform("nunique") == models]
