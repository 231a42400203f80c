"""Loss curves of the toy pair's training logs (train.LOG_FIELDS CSVs)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

PLOTTED = ("step", "length", "loss", "answer_loss")  # the train.LOG_FIELDS a plot reads


def read_log(path: str) -> pd.DataFrame:
    """A training log with the columns the plot reads, or one line saying what it lacks."""
    from diffeval.errors import InputError

    try:
        frame = pd.read_csv(path)
    except (ValueError, OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read loss log {path} ({type(exc).__name__}): give a training_log.csv") from None
    missing = [c for c in PLOTTED if c not in frame.columns]
    if missing or frame.empty:
        lacks = f"has no column {', '.join(missing)}" if missing else "has no rows"
        raise InputError(f"loss log {path} {lacks}: give the training_log.csv a `diffeval toy train` work folder holds")
    for column in PLOTTED:  # a loss is a number (NaN where a batch had no answer token), never below 0
        values = pd.to_numeric(frame[column], errors="coerce")
        wrong = frame[column][(values.isna() & frame[column].notna()) | (values < 0)]
        if len(wrong):
            row = wrong.index[0] + 2  # the file's line: 1-based, after the header
            value = str(wrong.iloc[0])
            raise InputError(f"loss log {path}, line {row}: {column} {value!r} is not a number of 0 or more: give the "
                             "training_log.csv a `diffeval toy train` work folder holds")  # fmt: skip
    return frame


def plot_losses(logs: dict[str, str], out: str | Path) -> Path:
    frames = {name: read_log(path) for name, path in logs.items()}  # every log checked before anything is drawn
    from diffeval.plotting import legend, panels, save

    fig, (dense, answer) = panels(2, 11, 4)
    for name, frame in frames.items():
        smooth = frame[["loss", "answer_loss"]].rolling(25, min_periods=1).mean()
        dense.plot(frame["step"], smooth["loss"], label=name)
        answer.plot(frame["step"], smooth["answer_loss"], label=name)
    for axis, title in ((dense, "weighted dense LM loss"), (answer, "loss on answer digits")):
        axis.set_xlabel("step")
        axis.set_title(title + " (25-step mean)")
        axis.set_yscale("log")
    # dotted lines: where a run's curriculum moved on to a longer context
    for frame in frames.values():
        for step in frame["step"][frame["length"].diff() > 0]:
            dense.axvline(step, color="grey", linestyle=":", linewidth=0.8)
            answer.axvline(step, color="grey", linestyle=":", linewidth=0.8)
    legend(fig, [dense, answer])
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    return save(fig, Path(out))
