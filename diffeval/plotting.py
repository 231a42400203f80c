"""matplotlib with the file-only Agg backend (reports render plots without a display), and what every plot shares so
that it stays legible from 1 to 12 columns and from 1 to 4 models (tests/test_plots.py draws them all): panels laid
out by constrained layout, figures as wide as their columns and titles need, one legend beside the panels rather than
over their data, and one way to save."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.font_manager import FontProperties  # noqa: E402
from matplotlib.textpath import text_to_path  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["legend", "panels", "plt", "save", "text_width"]

DPI = 120


def panels(count: int, width: float, height: float, **kwargs) -> tuple[Figure, list[Axes]]:
    """A `width` × `height` inch figure of `count` panels side by side, laid out when drawn so that no label of one
    panel runs into another (matplotlib's constrained layout); `kwargs` go to `plt.subplots` (sharey=True keeps the
    y tick labels to the first panel)."""
    fig, axes = plt.subplots(1, count, figsize=(width, height), layout="constrained", squeeze=False, **kwargs)
    return fig, list(axes[0])


def text_width(text: str, size: float | str = "medium") -> float:
    """The inches the longest line of `text` takes at font size `size` (points, or a name such as "large")."""
    prop = FontProperties(size=size)
    points = (text_to_path.get_text_width_height_descent(line, prop, ismath=False)[0] for line in text.split("\n"))
    return max(points) / 72


def legend(fig: Figure, axes: Sequence[Axes], title: str | None = None) -> None:
    """One legend for the labelled artists of every panel, right of the panels, the figure widened by its width: it
    covers no data however many entries it has."""
    entries: dict[str, Artist] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
        if (drawn := ax.get_legend()) is not None:  # pandas draws one in every panel it plots into
            drawn.remove()
    box = fig.legend(list(entries.values()), list(entries), title=title, loc="outside right upper", fontsize="small")
    fig.set_figwidth(fig.get_figwidth() + box.get_window_extent().width / fig.dpi)


def save(fig: Figure, path: Path) -> Path:
    """Write the figure at its own size (no cropping: its layout already keeps every text inside) and free it."""
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
