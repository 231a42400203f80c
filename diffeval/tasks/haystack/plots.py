"""The haystack tasks' figures: score by depth and length, as a heatmap per model and as position curves."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from diffeval.longctx.lengths import position_curves
from diffeval.tasks.haystack.tables import with_lengths

if TYPE_CHECKING:  # annotations only: heavy libraries load inside the functions that use them (a fast CLI)
    import pandas as pd


def depth_heatmaps(records: pd.DataFrame, path: Path, title: str) -> Path:
    """A depth × length accuracy heatmap per model, side by side on one colour scale (the paper's Figure 5); `title`
    says what each cell averages, on the colour bar."""
    import numpy as np

    from diffeval.plotting import panels, save, text_width

    frame, lengths = with_lengths(records)
    models = list(frame["model"].unique())
    depths = sorted(frame["depth"].unique())
    # a panel is as wide as its cells (a length name or a cell's value) and its title, the model's name
    panel = max(0.55 * len(lengths), max(text_width(model, "large") for model in models)) + 0.3
    height = 1.6 + 0.4 * len(depths)
    fig, axes = panels(len(models), 1.4 + panel * len(models) + 1.0, height, sharey=True)
    for ax, model in zip(axes, models):
        grid = (
            frame[frame["model"] == model]
            .pivot_table(index="depth", columns="length", values="score", aggfunc="mean")
            .reindex(index=depths, columns=lengths)
        )
        image = ax.imshow(grid.to_numpy(), vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        ax.set_xticks(range(len(lengths)), lengths)
        ax.set_yticks(range(len(depths)), [f"{d}%" for d in depths])
        for (i, j), value in np.ndenumerate(grid.to_numpy()):
            if not np.isnan(value):
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7)
        ax.set(title=model, xlabel="context length")
    axes[0].set_ylabel("answer needle depth")
    # the bar's slot and its gap are fractions of the panels' width: 0.3 and 0.15 inch however many panels there are
    across = panel * len(models)
    fig.colorbar(image, ax=axes, label=f"accuracy ({title})", fraction=0.3 / across, pad=0.15 / across)
    return save(fig, path)


def depth_curves(records: pd.DataFrame, path: Path, position: str) -> Path:
    """Score by depth, one line per length, one panel per model."""
    frame, lengths = with_lengths(records)
    return position_curves(frame, list(frame["model"].unique()), lengths, path, position)
