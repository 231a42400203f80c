"""The haystack tasks' figures: score by depth and length, as a heatmap per model and as position curves."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from diffeval.longctx.lengths import position_curves
from diffeval.tasks.haystack.tables import with_lengths

if TYPE_CHECKING:  # annotations only: heavy libraries load inside the functions that use them (a fast CLI)
    import pandas as pd


def depth_heatmaps(records: pd.DataFrame, path: Path, title: str) -> Path:
    """A depth × length accuracy heatmap per model, side by side on one colour scale (the paper's Figure 5)."""
    import numpy as np

    from diffeval.plotting import plt

    frame, lengths = with_lengths(records)
    models = list(frame["model"].unique())
    fig, axes = plt.subplots(1, len(models), figsize=(1.2 + 1.1 * len(lengths) * len(models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], models):
        grid = (
            frame[frame["model"] == model]
            .pivot_table(index="depth", columns="length", values="score", aggfunc="mean")
            .reindex(columns=lengths)
        )
        image = ax.imshow(grid.to_numpy(), vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        ax.set_xticks(range(len(lengths)), lengths)
        ax.set_yticks(range(len(grid.index)), [f"{d}%" for d in grid.index])
        for (i, j), value in np.ndenumerate(grid.to_numpy()):
            if not np.isnan(value):
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7)
        ax.set(title=f"{model} ({title})", xlabel="context length")
    axes[0][0].set_ylabel("answer needle depth")
    fig.colorbar(image, ax=axes[0].tolist(), label="accuracy")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def depth_curves(records: pd.DataFrame, path: Path, position: str) -> Path:
    """Score by depth, one line per length, one panel per model."""
    frame, lengths = with_lengths(records)
    return position_curves(frame, list(frame["model"].unique()), lengths, path, position)
