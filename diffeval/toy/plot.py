"""Loss curves of the toy pair's training logs (train.LOG_FIELDS CSVs)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def plot_losses(logs: dict[str, str], out: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # headless: training machines have no display
    import matplotlib.pyplot as plt

    fig, (dense, answer) = plt.subplots(1, 2, figsize=(11, 4))
    for name, path in logs.items():
        frame = pd.read_csv(path)
        smooth = frame[["loss", "answer_loss"]].rolling(25, min_periods=1).mean()
        dense.plot(frame["step"], smooth["loss"], label=name)
        answer.plot(frame["step"], smooth["answer_loss"], label=name)
    for axis, title in ((dense, "weighted dense LM loss"), (answer, "loss on answer digits")):
        axis.set_xlabel("step")
        axis.set_title(title + " (25-step mean)")
        axis.set_yscale("log")
        axis.legend()
    # dotted lines: where a run's curriculum moved on to a longer context
    for path in logs.values():
        frame = pd.read_csv(path)
        for step in frame["step"][frame["length"].diff() > 0]:
            dense.axvline(step, color="grey", linestyle=":", linewidth=0.8)
            answer.axvline(step, color="grey", linestyle=":", linewidth=0.8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return Path(out)
