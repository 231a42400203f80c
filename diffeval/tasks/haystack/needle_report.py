"""Needle's report and view: the Table 2 layout (models × N/R per length, the paper's rows beside at 4K), the answers'
diagnostics and the rescoring of stored outputs by a named rule, the Figure 5 plots, and the view's prompt with each
needle marked and its number's own tokens inside it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from diffeval.longctx import scoring
from diffeval.longctx.lengths import parse_format_ctx
from diffeval.paper import TABLE2, coverage
from diffeval.tasks import thinking
from diffeval.tasks.base import with_cells, with_rows
from diffeval.tasks.blocks import Mark
from diffeval.tasks.haystack import plots, tables
from diffeval.tasks.haystack.needle_options import NeedleOptions
from diffeval.tasks.haystack.samples import ANSWER, HaystackPrompt, HaystackSample
from diffeval.tasks.haystack.view import PromptText

if TYPE_CHECKING:  # annotations only: heavy libraries load inside the functions that use them (a fast CLI)
    from pathlib import Path

    import pandas as pd


def rescore(records: pd.DataFrame, rule: str) -> pd.DataFrame:
    """The records scored by `rule` from their stored outputs, with the rule-independent answer diagnostics:
    `unqueried_numbers` (the output names a number of a needle that was not asked for) and `precision` (expected
    numbers found ÷ distinct numbers in the output; empty where the output has none). A sample whose thinking never
    closed has no answer: its score stays null."""
    scored = thinking.scored_or_null(records, lambda output, expected: scoring.score(output, expected, rule))
    found = [scoring.numbers_in(output) for output in records["output"]]
    closed = list(~thinking.unclosed(records))  # no answer, no diagnostic: unclosed thinking counts in neither
    unqueried = [
        bool(found_here & (set(numbers) - set(expected))) if keep else None
        for found_here, numbers, expected, keep in zip(found, records["numbers"], records["expected"], closed)
    ]
    precision = [
        len(found_here & set(expected)) / len(found_here) if found_here and keep else float("nan")
        for found_here, expected, keep in zip(found, records["expected"], closed)
    ]
    return records.assign(score=[value for value, _ in scored], correct=thinking.nullable([c for _, c in scored]),
                          unqueried_numbers=thinking.nullable(unqueried), precision=precision)  # fmt: skip


def needle_tables(records: pd.DataFrame, options: NeedleOptions, paper: bool = False) -> dict[str, pd.DataFrame]:
    """Table 2 layout (rows = models, columns = N/R, per length) and a depth × length grid per model; with several
    lengths, the effective length over the run's `options.base_lengths`."""
    import pandas as pd

    frame, lengths = tables.with_lengths(records)
    frame["setting"] = frame["needles"].astype(str) + "/" + frame["queries"].astype(str)
    nr_order = sorted(frame["setting"].unique(), key=lambda s: tuple(int(x) for x in s.split("/")))
    table2 = tables.scores_by_setting(frame, lengths, nr_order)
    column_cells = [_cell(length, nr) for length, nr in table2.columns]
    table2.columns = [f"{length} N/R={nr}" for length, nr in table2.columns]
    row_cells = [{"model": m} for m in table2.index]
    if paper and "4K" in lengths:  # the paper's Table 2 is at 4K
        rows = {
            m: {f"4K N/R={nr}": v for nr, v in cells.items() if f"4K N/R={nr}" in table2.columns}
            for m, cells in TABLE2.items()
        }
        table2 = with_rows(table2, pd.DataFrame.from_dict(rows, orient="index"))
    table2 = with_cells(table2.round(3), row_cells, column_cells)
    out = {"table2": tables.with_unclosed_column(table2, frame, len(row_cells))}
    out["answers"] = tables.answers_table(
        frame, {"unqueried_numbers": ("unqueried_numbers", "mean"), "precision": ("precision", "mean")}
    )
    if len(lengths) > 1:
        out["effective_length"] = tables.effective_length_table(frame, options.base_lengths)
    if thinking.has_thinking(frame):
        out["thinking"] = thinking.thinking_table(frame)
    return thinking.with_thinking_note({**out, **tables.depth_grids(frame, lengths)}, frame)


def _cell(length: str, nr: str) -> dict:
    """The records behind a Table 2 column: its length and N/R, as record values."""
    needles, queries = nr.split("/")
    return {"ctx": parse_format_ctx(length), "needles": int(needles), "queries": int(queries)}


def needle_plots(records: pd.DataFrame, folder: Path) -> list[Path]:
    """Figure 5 style: a depth × length accuracy heatmap per model; score by depth, one line per length."""
    return [
        plots.depth_heatmaps(records, folder / "needle_heatmap.png", "mean over N/R"),
        plots.depth_curves(records, folder / "needle_position_curves.png", "answer needle depth (%)"),
    ]


def pieces(prompt: HaystackPrompt, sample: HaystackSample, whole: bool) -> list:
    """The prompt's text in pieces that tile it: scaffold text, haystack stretches (elided when long), and each
    needle marked (unqueried ones faint) with its number's own tokens marked inside it."""
    text = PromptText(prompt, whole)
    marked = []
    needles = zip(prompt.spans["needles"], prompt.spans["numbers"], sample.extra["cities"], sample.inserts)
    for (start, end), (number_start, number_end), city, insert in sorted(needles, key=lambda needle: needle[0]):
        first, last = prompt.offsets[number_start][0], prompt.offsets[number_end - 1][1]  # the number's own tokens
        queried = insert.role == ANSWER
        note = f"recorded span: tokens {number_start}-{number_end} (expected {insert.values[0]})"
        number = Mark([text.text[first:last]], tone="strong", kind="number", note=note)
        marked.append((start, end, Mark(
            [text.text[text.starts[start] : first], number, text.text[last : text.starts[end]]],
            tone="highlight" if queried else "faint", kind="needle" if queried else "needle other",
            note=f"{'queried' if queried else 'other'} needle: {city}, tokens {start}-{end}",
        )))  # fmt: skip
    return text.tiled(prompt.spans, marked)


def paper_coverage(records: pd.DataFrame, options: NeedleOptions) -> str:
    """Table 2 is accuracy at 4K for N/R 1/1, 2/2, 4/2, 6/2."""
    at_4k = records[records["ctx"] == 4096]
    run = {f"{n}/{q}" for n, q in zip(at_4k["needles"], at_4k["queries"])}
    settings = list(next(iter(TABLE2.values())))
    has = [f"4K N/R={nr}" for nr in settings if nr in run]
    lacks = [f"4K N/R={nr}" for nr in settings if nr not in run]
    return coverage("Table 2 (accuracy at 4K by N/R)", has, lacks)
