"""One number format per metric, in every table output: terminal, markdown, LaTeX, HTML and `diffeval view`.

A table's floats show `blocks.DECIMALS` decimals (scores, accuracies, shares, their differences and CI bounds) unless
the task declares other decimals for the column or the table (`Task.decimals`: percentages, points, counts that
paper rows made floats); the paired table's numbers take the decimals of the task's summary value. Integer columns
are counts; p-values have their own format. A value is formatted by its column, never by itself, so 1 shows as
1.000 beside 0.900. Row labels become columns, one per index level, never tuples. CSV files keep the raw numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from diffeval.tasks.base import Task
from diffeval.tasks.blocks import DECIMALS, number, value_text

P_VALUE_COLUMNS = ("p_value",)


def p_value_text(value) -> str:
    """3 decimals down to 0.001; below, two significant digits (2.3e-05), so a tiny p-value never reads 0.000."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:.3f}" if value >= 0.001 else f"{value:.1e}"


@dataclass(frozen=True)
class NumberFormats:
    """A task's decimals: declared per column or table key, the rest `DECIMALS`; the paired table follows `metric`."""

    declared: dict[str, int] = field(default_factory=dict)
    metric: str = "score"

    @classmethod
    def of(cls, task: Task) -> NumberFormats:
        return cls(dict(task.reporting.decimals), task.reporting.summary_value)

    def decimals(self, key: str, column: str) -> int:
        kind = key.partition(":")[0]
        table_default = self.declared.get(self.metric if kind == "paired" else kind, DECIMALS)
        return self.declared.get(column, table_default)


def column_label(column) -> str:
    return " / ".join(str(part) for part in column) if isinstance(column, tuple) else str(column)


def column_texts(key: str, column: str, values: pd.Series, formats: NumberFormats) -> list[str]:
    """A column's cells as text, all in the column's one format."""
    if column in P_VALUE_COLUMNS:
        return [p_value_text(v) for v in values]
    if pd.api.types.is_bool_dtype(values):
        return [value_text(bool(v)) for v in values]
    if pd.api.types.is_integer_dtype(values):
        return [str(int(v)) for v in values]
    decimals = formats.decimals(key, column)
    if pd.api.types.is_float_dtype(values):
        return [number(v, decimals) for v in values]
    return [_cell_text(v, decimals) for v in values]  # mixed: strings beside numbers


def _cell_text(value, decimals: int) -> str:
    if hasattr(value, "item"):  # a numpy scalar
        value = value.item()
    return number(value, decimals) if isinstance(value, float) or value is None else value_text(value, decimals)


def index_texts(table: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """The row labels as columns: one name and one list of texts per index level."""
    names = [str(n) if n is not None else "" for n in table.index.names]
    levels = [table.index.get_level_values(i) for i in range(table.index.nlevels)]
    return names, [[value_text(v.item() if hasattr(v, "item") else v) for v in level] for level in levels]


def display_table(key: str, table: pd.DataFrame, formats: NumberFormats) -> tuple[pd.DataFrame, list[bool]]:
    """The table as text cells, its row labels as leading columns; and which columns hold numbers (right-aligned)."""
    names, labels = index_texts(table)
    columns: dict[str, list[str]] = {}
    numeric = []
    for name, texts in zip(names, labels):
        columns[_unique(name, columns)] = texts
        numeric.append(False)
    for i, column in enumerate(table.columns):
        label = column_label(column)
        values = table.iloc[:, i]
        columns[_unique(label, columns)] = column_texts(key, label, values, formats)
        numeric.append(pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values))
    return pd.DataFrame(columns), numeric


def _unique(name: str, taken: dict) -> str:
    """A header not yet used (an index level and a column may share a name)."""
    while name in taken:
        name += " "
    return name


def markdown_table(key: str, table: pd.DataFrame, formats: NumberFormats) -> str:
    shown, numeric = display_table(key, table, formats)
    return shown.to_markdown(index=False, disable_numparse=True, colalign=["right" if n else "left" for n in numeric])


def html_table(key: str, table: pd.DataFrame, formats: NumberFormats) -> str:
    shown, _ = display_table(key, table, formats)
    return shown.to_html(index=False, na_rep="")


def latex_table(key: str, table: pd.DataFrame, formats: NumberFormats, caption: str, label: str) -> str:
    shown, numeric = display_table(key, table, formats)
    layout = "".join("r" if n else "l" for n in numeric)
    return shown.to_latex(index=False, escape=True, caption=caption, label=label, column_format=layout)
