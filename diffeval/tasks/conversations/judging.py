"""The judging stage of generated answers: an empty or degenerate output is its own outcome, never judged; every
other output is judged by a primary judge and any further judges (their verdicts kept beside the primary's); and the
judges' agreement, Cohen's κ with a bootstrap interval."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from diffeval.judges import Judge, JudgeItem
from diffeval.records import Record
from diffeval.tasks.base import with_cells
from diffeval.tasks.thinking import UNCLOSED, UNCLOSED_REASON

if TYPE_CHECKING:  # annotations only: heavy libraries load inside the functions that use them (a fast CLI)
    import numpy as np
    import pandas as pd

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


def judge_generations(
    generations: list[dict],
    items: Callable[[list[dict]], list[JudgeItem]],
    open_judge: Callable[[str], Judge],
    judges: list[str],
) -> Iterator[Record]:
    """Judged records of the generations (rows of `Record.to_dict`; `items` makes the judge's items of rows, and
    `open_judge` a judge of a --judge spec). Degenerate outputs are recorded without a judge. Further judges judge
    every output first, one loaded at a time, their verdicts cached; then the primary judges as many per call as it
    takes at once, and each record carries every judge's verdict."""
    # thinking that never closed has no output to judge (tasks/thinking.py); else an empty or degenerate output
    reasons = [UNCLOSED_REASON if row.get("outcome") == UNCLOSED else degenerate(row["output"]) for row in generations]
    judged = [row for row, reason in zip(generations, reasons) if reason is None]
    others: dict[str, dict[tuple[str, str], bool | None]] = {}  # judge id → (model, sample id) → verdict
    for spec in judges[1:]:
        other = open_judge(spec)
        try:
            theirs = other.judge(items(judged))
        finally:
            other.close()
        others[other.id] = {_key(row): v.hallucination_free for row, v in zip(judged, theirs)}
    primary = open_judge(judges[0])
    try:
        for i in range(0, len(generations), primary.batch):
            chunk, chunk_reasons = generations[i : i + primary.batch], reasons[i : i + primary.batch]
            live = [row for row, reason in zip(chunk, chunk_reasons) if reason is None]
            verdicts = dict(zip(map(_key, live), primary.judge(items(live)))) if live else {}
            for row, reason in zip(chunk, chunk_reasons):
                record = Record.from_dict(row)
                if reason == UNCLOSED_REASON:  # no answer: no verdict and no score (degenerate output scores 0)
                    outcome, free, rationale = UNCLOSED, None, reason
                elif reason is not None:
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
    live = records[~records["outcome"].isin(["degenerate", UNCLOSED])]
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
