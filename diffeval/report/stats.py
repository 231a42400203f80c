"""Confidence intervals for per-cell means: Wilson for yes/no outcomes, Student t otherwise."""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats


def mean_ci(values: pd.Series, confidence: float = 0.95) -> tuple[float, float]:
    data = np.asarray(values, dtype=float)
    n = len(data)
    if n == 0:
        return float("nan"), float("nan")
    if np.isin(data, (0.0, 1.0)).all():
        interval = stats.binomtest(int(data.sum()), n).proportion_ci(confidence, method="wilson")
        return float(interval.low), float(interval.high)
    if n < 2 or data.std() == 0:
        return float(data.mean()), float(data.mean())
    low, high = stats.t.interval(confidence, n - 1, loc=data.mean(), scale=stats.sem(data))
    return float(max(low, 0.0)), float(min(high, 1.0))


def summarize(frame: pd.DataFrame, by: list[str], value: str = "score") -> pd.DataFrame:
    """n, mean and 95 % CI of `value` per group (the mean of `score` is called accuracy)."""
    rows = []
    for keys, group in frame.groupby(by, sort=False):
        group = group.dropna(subset=[value])  # e.g. unparsed judge verdicts, over-budget ICL runs
        if group.empty:
            continue
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
