"""The tables every haystack task reports: the answers' diagnostics per model, a depth × length grid per model, and
the effective length (NoLiMa) over several lengths."""

from __future__ import annotations

from typing import TYPE_CHECKING

from diffeval.longctx.lengths import BASE_FLOOR, EFFECTIVE_FRACTION, effective_lengths, format_ctx, parse_format_ctx
from diffeval.tasks import thinking
from diffeval.tasks.base import with_cells

if TYPE_CHECKING:  # annotations only: heavy libraries load inside the functions that use them (a fast CLI)
    import pandas as pd

DEPTH_GRID_TITLE = "Depth x length grid"
EFFECTIVE_LENGTH_TITLE = (
    f"Effective length (NoLiMa): the longest length up to which every length keeps {EFFECTIVE_FRACTION:.0%} of the "
    f"base score (mean over the base lengths); undefined when the base is below {BASE_FLOOR}; 95 % bootstrap "
    "interval over samples"
)


def with_lengths(records: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The records with each context length's name (`length`), and the names in order."""
    frame = records.assign(length=records["ctx"].map(format_ctx))
    return frame, sorted(frame["length"].unique(), key=parse_format_ctx)


def scores_by_setting(frame: pd.DataFrame, lengths: list[str], settings: list[str]) -> pd.DataFrame:
    """Mean score per model (rows) by (length, setting) (columns), in the given orders; cells no record holds are
    left out."""
    import pandas as pd

    table = frame.pivot_table(index="model", columns=["length", "setting"], values="score", aggfunc="mean", sort=False)
    return table.reindex(columns=pd.MultiIndex.from_product([lengths, settings])).dropna(axis=1, how="all")


def answers_table(frame: pd.DataFrame, diagnostics: dict[str, tuple[str, str]]) -> pd.DataFrame:
    """Per model: samples, accuracy, the task's `diagnostics` (column → (record column, aggregation)), and samples
    stopped at the token limit (records from before that field was kept count as not stopped); a thinking run's also
    count the samples whose thinking never closed (no answer, no score) and the mean thinking tokens."""
    import pandas as pd

    frame = frame.assign(hit=frame["hit_token_limit"].fillna(False) if "hit_token_limit" in frame else False)
    table = frame.groupby("model", sort=False).agg(
        samples=("sample_id", "count"), accuracy=("score", "mean"), **diagnostics, at_token_limit=("hit", "sum")
    )
    table["at_token_limit"] = table["at_token_limit"].astype(int)
    for column in table.columns:  # a mean of nullable booleans (unclosed thinking's null `correct`): plain floats
        if isinstance(table[column].dtype, pd.api.extensions.ExtensionDtype):
            table[column] = table[column].to_numpy(dtype=float, na_value=float("nan"))
    cells: list[dict] = [{}] * table.shape[1]
    if thinking.has_thinking(frame):
        table[thinking.UNCLOSED] = thinking.unclosed(frame).groupby(frame["model"]).sum().astype(int)
        table["thinking_tokens"] = frame.groupby("model", sort=False)["thinking_tokens"].mean()
        cells += [{"outcome": thinking.UNCLOSED}, {}]
    return with_cells(table.round(3), [{"model": m} for m in table.index], cells)


def with_unclosed_column(table: pd.DataFrame, frame: pd.DataFrame, rows: int) -> pd.DataFrame:
    """`table` (rows = models, the first `rows` of them the records') with a last column counting each model's samples
    whose thinking never closed (a thinking run's; other rows, the paper's, stay empty); a model none of whose samples
    was scored (its thinking never closed) gets a row of its own. Cells keep their filters."""
    if not thinking.has_thinking(frame):
        return table
    cells = table.attrs.get("cells") or {"rows": [{"model": m} for m in table.index], "columns": [{}] * table.shape[1],
                                         "common": {}}  # fmt: skip
    counts = thinking.unclosed(frame).groupby(frame["model"]).sum().astype(int)
    ours = list(table.index[:rows])
    missing = [model for model in dict.fromkeys(frame["model"]) if model not in ours]
    order = [*ours, *missing, *table.index[rows:]]
    names = table.index.names
    table = table.reindex(order)
    table.index.names = names
    table[thinking.UNCLOSED] = [counts.get(model) if i < rows + len(missing) else None for i, model in enumerate(order)]
    row_cells = [*cells["rows"][:rows], *({"model": m} for m in missing), *cells["rows"][rows:]]
    return with_cells(table, row_cells, [*cells["columns"], {"outcome": thinking.UNCLOSED}], cells["common"])


def depth_grids(frame: pd.DataFrame, lengths: list[str]) -> dict[str, pd.DataFrame]:
    """Per model, the mean score by depth (rows) and length (columns), keyed `depth_grid:MODEL`."""
    out = {}
    for model, group in frame.groupby("model", sort=False):
        grid = group.pivot_table(index="depth", columns="length", values="score", aggfunc="mean")
        grid = grid.reindex(columns=[c for c in lengths if c in grid.columns])
        depths = [int(d) for d in grid.index]
        grid.index = [f"{d}%" for d in depths]
        grid.index.name = "depth"
        out[f"depth_grid:{model}"] = with_cells(
            grid.round(3),
            [{"depth": d} for d in depths],
            [{"ctx": parse_format_ctx(c)} for c in grid.columns],
            {"model": model},
        )
    return out


def effective_length_table(frame: pd.DataFrame, base_lengths: list[int]) -> pd.DataFrame:
    """Per model, the effective length and its interval (longctx.lengths.effective_lengths), each row the model's
    records."""
    table = effective_lengths(frame, base_lengths)
    return with_cells(table, [{"model": m} for m in table.index], [None] * table.shape[1])


def effective_lengths_by_setting(frame: pd.DataFrame, settings: list[str], base_lengths: list[int]) -> pd.DataFrame:
    """Per model and setting, the effective length: settings (variants, templates) differ in difficulty, their base
    scores too."""
    import pandas as pd

    parts, cells = [], []
    for setting in settings:
        table = effective_lengths(frame[frame["setting"] == setting], base_lengths)
        parts.append(table.assign(setting=setting).set_index("setting", append=True))
        cells += [{"model": m, "setting": setting} for m in table.index]
    table = pd.concat(parts)
    return with_cells(table, cells, [None] * table.shape[1])
