"""Per-cell 95 % intervals, shared by the reports and the tasks' own plots: Wilson for yes/no outcomes, percentile
bootstrap (fixed seed) otherwise; the one bootstrap resampler every interval and test draws from (`resample`); and
the paired cluster bootstrap of a mean difference (`cluster_bootstrap`), which the reports and nll's tables use."""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


def is_binary(values) -> bool:
    return bool(np.isin(np.asarray(values, dtype=float), (0.0, 1.0)).all())


def wilson_ci(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    interval = stats.binomtest(successes, n).proportion_ci(confidence, method="wilson")
    return float(interval.low), float(interval.high)


def cluster_numbers(labels) -> np.ndarray:
    """Each sample's cluster as a number, clusters numbered in order of first appearance: the numbering of the clusters
    `resample(..., clusters=labels)` draws."""
    return pd.factorize(np.asarray(labels))[0]


def resample(
    statistic,
    n: int,
    *,
    strata=None,
    clusters=None,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    vectorized: bool = False,
) -> np.ndarray:
    """The statistic of each of `resamples` bootstrap resamples of n samples (drawn with replacement, numpy's
    default_rng(seed)), as an array in draw order. `statistic` is given one resample's indices, or with `vectorized`
    all of them at once, one resample per row.

    - plain: n sample indices per resample, all resamples drawn in one call;
    - `strata` (one label per sample): each stratum's samples are drawn within it, as many as it holds, one draw per
      stratum (in order of first appearance) per resample; a resample's indices come stratum by stratum;
    - `clusters` (one label per sample): whole clusters are drawn, as many as there are, all resamples in one call;
      the statistic is given cluster numbers (`cluster_numbers`), and brings each cluster's samples in itself (a mean
      over clusters of different sizes is their sums over their sizes).
    """
    if strata is not None and clusters is not None:
        raise ValueError("resample within strata or by clusters, not both")
    rng = np.random.default_rng(seed)
    if strata is not None:
        codes = pd.factorize(np.asarray(strata))[0]
        members = [np.flatnonzero(codes == code) for code in range(codes.max() + 1 if len(codes) else 0)]
        picks = np.empty((resamples, n), dtype=np.int64)
        for row in picks:  # resample by resample, stratum by stratum: the order the draws are made in
            row[:] = np.concatenate([stratum[rng.integers(0, len(stratum), len(stratum))] for stratum in members])
    else:
        units = n if clusters is None else int(cluster_numbers(clusters).max(initial=-1)) + 1
        picks = rng.integers(0, units, (resamples, units))
    if vectorized:
        return np.asarray(statistic(picks))
    return np.asarray([statistic(row) for row in picks])


def percentile_interval(draws, confidence: float = 0.95) -> tuple[float, float]:
    """The percentile bootstrap interval of a statistic's resampled values, as scipy's `bootstrap` takes it (its
    quantile: `stats.quantile` since scipy 1.15, numpy's percentile before)."""
    alpha = (1 - confidence) / 2
    if hasattr(stats, "quantile"):
        low, high = stats.quantile(np.asarray(draws), np.asarray([alpha, 1 - alpha]))
    else:
        low, high = np.percentile(draws, [alpha * 100, (1 - alpha) * 100])
    return float(low), float(high)


def bootstrap_ci(values, confidence: float = 0.95, seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (BOOTSTRAP_RESAMPLES resamples, seeded)."""
    data = np.asarray(values, dtype=float)
    if len(data) < 2 or np.all(data == data[0]):
        return float(data.mean()), float(data.mean())
    means = resample(lambda picks: data[picks].mean(axis=-1), len(data), seed=seed, vectorized=True)
    return percentile_interval(means, confidence)


def mean_ci(values, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson for yes/no outcomes, bootstrap otherwise."""
    data = np.asarray(values, dtype=float)
    if len(data) == 0:
        return float("nan"), float("nan")
    if is_binary(data):
        return wilson_ci(int(data.sum()), len(data), confidence)
    return bootstrap_ci(data, confidence)


def summarize(frame: pd.DataFrame, by: list[str], value: str = "score") -> pd.DataFrame:
    """n, mean and 95 % CI of `value` per group (the mean of `score` is called accuracy). A cell in which nothing
    could be scored keeps its row, with n = 0."""
    rows = []
    for keys, group in frame.groupby(by, sort=False):
        group = group.dropna(subset=[value])  # e.g. unparsed judge verdicts, over-budget ICL runs
        low, high = mean_ci(group[value])
        rows.append(
            {
                **dict(zip(by, keys if isinstance(keys, tuple) else (keys,))),
                "n": len(group),
                ("accuracy" if value == "score" else value): group[value].mean(),
                "ci_low": low,
                "ci_high": high,
            }
        )
    return pd.DataFrame(rows)


def cluster_bootstrap(differences, clusters, confidence: float = 0.95, seed: int = BOOTSTRAP_SEED) -> dict:
    """Paired cluster bootstrap of the mean of `differences` (one per paired sample, first − second): clusters are
    drawn with replacement, each bringing all of its samples, and a resample's statistic is the mean over the samples
    it holds, so the estimate stays the plain mean of the differences. Percentile CI; two-sided p-value: twice the
    smaller share of resamples on either side of 0 (add-one, never 0)."""
    diff = np.asarray(differences, dtype=float)
    codes = cluster_numbers(clusters)
    sums, sizes = np.bincount(codes, weights=diff), np.bincount(codes)
    if len(sizes) < 2:  # one cluster: nothing to resample, so no interval and no test (left empty, not zero-width)
        return {"clusters": len(sizes), "ci_low": float("nan"), "ci_high": float("nan"), "p_value": float("nan")}
    means = resample(
        lambda picks: sums[picks].sum(axis=1) / sizes[picks].sum(axis=1),
        len(diff),
        clusters=clusters,
        seed=seed,
        vectorized=True,
    )
    low, high = np.percentile(means, [50 * (1 - confidence), 50 * (1 + confidence)])
    tail = min((means <= 0).sum(), (means >= 0).sum())
    p_value = min(1.0, 2 * (tail + 1) / (len(means) + 1))
    return {"clusters": len(sizes), "ci_low": float(low), "ci_high": float(high), "p_value": float(p_value)}
