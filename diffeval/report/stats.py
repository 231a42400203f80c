"""Statistics for reports: paired DIFF − baseline comparisons (per-cell intervals are in diffeval/intervals.py).

- yes/no outcomes: Wilson score interval (per cell); paired: exact McNemar test (binomial test on the discordant pairs).
- other outcomes (fractional scores, attention shares): percentile bootstrap (fixed seed); paired: Wilcoxon
  signed-rank test.
- paired differences always get a bootstrap CI of the mean difference.
- a task whose samples come in clusters of dependent samples (`Task.cluster_keys`: an ICL test query asked under
  several demonstration orders and draws) gets a paired cluster bootstrap instead: whole clusters are resampled,
  for the CI and a two-sided p-value, whatever the outcome; McNemar and Wilcoxon would count every sample of a
  cluster as independent evidence.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from diffeval.intervals import bootstrap_ci, cluster_bootstrap, is_binary

CLUSTER_TEST = "cluster bootstrap"  # the `test` the paired statistics name for a clustered task


def mcnemar_exact(first, second) -> float:
    """Exact McNemar p-value for paired yes/no outcomes (two-sided binomial test on discordant pairs)."""
    a, b = np.asarray(first, dtype=bool), np.asarray(second, dtype=bool)
    only_first, only_second = int((a & ~b).sum()), int((~a & b).sum())
    if only_first + only_second == 0:
        return 1.0
    return float(stats.binomtest(only_first, only_first + only_second, 0.5).pvalue)


def paired_test(first, second) -> tuple[float, str]:
    """p-value that paired outcomes differ: McNemar for yes/no, Wilcoxon signed-rank otherwise."""
    a, b = np.asarray(first, dtype=float), np.asarray(second, dtype=float)
    if is_binary(a) and is_binary(b):
        return mcnemar_exact(a, b), "mcnemar"
    if np.allclose(a, b):
        return 1.0, "wilcoxon"
    return float(stats.wilcoxon(a, b).pvalue), "wilcoxon"


def paired_difference(first, second, confidence: float = 0.95, clusters=None) -> dict:
    """Mean of first − second over the same samples, its bootstrap CI and the paired test's p-value; with `clusters`
    (one label per sample), the paired cluster bootstrap's CI and p-value, and the number of clusters."""
    diff = np.asarray(first, dtype=float) - np.asarray(second, dtype=float)
    if clusters is not None:
        resampled = cluster_bootstrap(diff, clusters, confidence)
        return {
            "n": len(diff),
            "clusters": resampled.pop("clusters"),
            "difference": float(diff.mean()),
            **resampled,
            "test": CLUSTER_TEST,
        }
    if len(diff) < 2:  # one pair: no interval and no test (left empty, not zero-width)
        nan = float("nan")
        return {"n": len(diff), "difference": float(diff.mean()), "ci_low": nan, "ci_high": nan, "p_value": nan,
                "test": ""}  # fmt: skip
    low, high = bootstrap_ci(diff, confidence)
    p_value, test = paired_test(first, second)
    return {
        "n": len(diff),
        "difference": float(diff.mean()),
        "ci_low": low,
        "ci_high": high,
        "p_value": p_value,
        "test": test,
    }


def cluster_labels(frame: pd.DataFrame, keys: list[str] | None) -> pd.Series | None:
    """Each record's cluster (an integer shared by the records equal on every key), or None where there is no key or
    a record lacks one of its columns (a run written before the task declared its clusters): the paired statistics
    then treat every sample as independent."""
    if not keys or not set(keys) <= set(frame.columns) or frame[keys].isna().any().any():
        return None
    return frame.groupby(keys, sort=False).ngroup()
