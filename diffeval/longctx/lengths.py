"""Scores over context lengths: length names, effective length (NoLiMa) with its bootstrap interval, and position
curves. Records carry `model`, `ctx`, `score` and, for position curves, `depth` (where the answer sits, in percent).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: heavy libraries load inside the functions that use them (a fast CLI)
    import numpy as np
    import pandas as pd

EFFECTIVE_FRACTION = 0.85  # NoLiMa: a length is effective while it keeps 85 % of the base score
BASE_FLOOR = 0.5  # below this base score an effective length would measure noise: undefined
BASE_MAX_LENGTH = 1024  # default base lengths: those run at or below this
EFFECTIVE_RESAMPLES = 2000


def format_ctx(ctx: int) -> str:
    """A context length's name: 4K for 4096, the number itself when it is no whole K."""
    return f"{ctx // 1024}K" if ctx % 1024 == 0 else str(ctx)


def parse_format_ctx(text: str) -> int:
    return int(text[:-1]) * 1024 if text.endswith("K") else int(text)


def effective_length(scores: dict[int, np.ndarray], base_lengths: list[int]) -> tuple[int | None, float]:
    """(effective length, base score) from per-length sample scores: the base is the mean over `base_lengths`; the
    effective length is the longest L such that every length ≤ L scores at least EFFECTIVE_FRACTION × base, 0 when
    the shortest length already falls short, None when the base is below BASE_FLOOR."""
    import numpy as np

    base = float(np.mean(np.concatenate([scores[length] for length in base_lengths])))
    if base < BASE_FLOOR:
        return None, base
    effective = 0
    for length in sorted(scores):
        if scores[length].mean() < EFFECTIVE_FRACTION * base:
            break
        effective = length
    return effective, base


def effective_lengths(frame: pd.DataFrame, base_lengths: list[int]) -> pd.DataFrame:
    """Per model (one row each): the base lengths and score, the effective length and its 95 % bootstrap interval
    (samples resampled within each length, EFFECTIVE_RESAMPLES times, seed 0; a length is discrete, so the interval
    is the 2.5th and 97.5th percentile lengths of the resamples). Base lengths: `base_lengths`, or those run up to
    BASE_MAX_LENGTH when empty."""
    import numpy as np
    import pandas as pd

    from diffeval.intervals import resample

    rows = {}
    for model, group in frame.groupby("model", sort=False):
        by_length = {int(ctx): g["score"].to_numpy(dtype=float) for ctx, g in group.groupby("ctx")}
        # the given base lengths, never others in their place: a partial run may not have reached them yet
        if base_lengths:
            base = [b for b in base_lengths if b in by_length]
        else:
            base = [b for b in by_length if b <= BASE_MAX_LENGTH]
        row: dict[str, Any] = {"base lengths": ", ".join(map(format_ctx, base)) or "none run"}
        if not base:
            wanted = ", ".join(map(format_ctx, base_lengths)) or f"up to {format_ctx(BASE_MAX_LENGTH)}"
            rows[model] = {**row, "effective length": f"undefined: no records at the base lengths ({wanted})"}
            continue
        found, base_score = effective_length(by_length, base)
        row.update({"base score": round(base_score, 3), "threshold": round(EFFECTIVE_FRACTION * base_score, 3)})
        if found is None:
            rows[model] = {**row, "effective length": f"undefined: base below {BASE_FLOOR}"}
            continue
        scores = np.concatenate(list(by_length.values()))  # length by length, shortest first: the strata's order
        lengths = np.repeat(list(by_length), [len(values) for values in by_length.values()])

        def resampled_length(picks, scores=scores, lengths=lengths, run=tuple(by_length), base=base):
            drawn, drawn_lengths = scores[picks], lengths[picks]
            return effective_length({length: drawn[drawn_lengths == length] for length in run}, base)[0]

        draws = resample(resampled_length, len(scores), strata=lengths, resamples=EFFECTIVE_RESAMPLES, seed=0)
        defined = [d for d in draws if d is not None]
        low, high = np.percentile(defined, [2.5, 97.5], method="lower") if defined else (None, None)
        rows[model] = {
            **row,
            "effective length": _length_name(found, min(by_length)),
            "interval low": _length_name(low, min(by_length)),
            "interval high": _length_name(high, min(by_length)),
            "resamples with base below floor": len(draws) - len(defined),
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "model"
    return table


def _length_name(length, shortest: int) -> str:
    if length is None:
        return "undefined"
    return f"< {format_ctx(shortest)}" if length == 0 else format_ctx(int(length))


def position_curves(frame: pd.DataFrame, models: list[str], lengths: list[str], path: Path, position: str) -> Path:
    """Score by answer depth (`depth`, labelled `position` on the x axis), one line per length (`length`, a length
    name) with its 95 % CI (Wilson for yes/no scores, bootstrap otherwise), one panel per model; saved at `path`."""
    import numpy as np

    from diffeval.intervals import summarize
    from diffeval.plotting import legend, panels, plt, save, text_width

    summary = summarize(frame, ["model", "length", "depth"], "score")
    panel = max(4.2, max(text_width(model, "large") for model in models) + 0.4)
    fig, axes = panels(len(models), 0.6 + panel * len(models), 3.4, sharey=True)
    colours = plt.get_cmap("viridis")(np.linspace(0, 0.9, len(lengths)))  # short to long, the same in every panel
    for ax, model in zip(axes, models):
        for length, colour in zip(lengths, colours):
            cell = summary[(summary["model"] == model) & (summary["length"] == length)].sort_values("depth")
            if cell.empty:
                continue
            errors = [cell["accuracy"] - cell["ci_low"], cell["ci_high"] - cell["accuracy"]]
            ax.errorbar(cell["depth"], cell["accuracy"], yerr=errors, marker="o", capsize=3, color=colour, label=length)
        ax.set(title=model, xlabel=position, ylim=(-0.05, 1.05))
    axes[0].set_ylabel("accuracy (95 % CI)")
    legend(fig, axes, title="length")
    return save(fig, path)
