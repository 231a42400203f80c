"""Per-cell 95 % intervals, shared by the reports and the tasks' own plots: Wilson for yes/no outcomes, percentile
bootstrap (fixed seed) otherwise."""

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


def bootstrap_ci(values, confidence: float = 0.95, seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    data = np.asarray(values, dtype=float)
    if len(data) < 2 or np.all(data == data[0]):
        return float(data.mean()), float(data.mean())
    result = stats.bootstrap(
        (data,),
        np.mean,
        confidence_level=confidence,
        n_resamples=BOOTSTRAP_RESAMPLES,
        method="percentile",
        random_state=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


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
