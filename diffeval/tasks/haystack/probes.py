"""The noise probes' `Task` (mk-niah, mv-niah, vt, cwe, nolima): RULER's distractor tasks and NoLiMa's needles, each a
recipe whose answer limit is its own (RULER's tokens_to_generate), reported the same way.

Report: score by length and setting, the cells where every model is at the floor (from which no difference is read),
the answers' diagnostics (outputs naming a distractor's value), a depth grid per model, the effective length per
setting, and the paired DIFF − baseline statistics per length and setting.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from diffeval.longctx import scoring
from diffeval.longctx.lengths import parse_format_ctx
from diffeval.records import MayBeAbsent
from diffeval.tasks import thinking
from diffeval.tasks.base import ContextBudget, Reporting, RunContext, Scoring, Task, Viewing, with_cells
from diffeval.tasks.haystack import plots, tables
from diffeval.tasks.haystack.recipe import Recipe, running
from diffeval.tasks.haystack.view import sample_view_for

if TYPE_CHECKING:  # annotations only: heavy libraries load inside the functions that use them (a fast CLI)
    from pathlib import Path

    import pandas as pd

FLOOR = 0.05  # a cell where every model's mean score is at most this is at the floor: no difference is read from it
MIN_PROMPT_TOKENS = 64

RECORD_SCHEMA = {
    "ctx": int,
    "depth": int | None,
    "setting": str,
    "seed": int,
    "index": int,
    "expected": list[str],
    "distractor_values": list[str],
    "output": str,
    "score": float | None,  # null: thinking that never closed (a thinking run's)
    "correct": bool | None,
    "hit_token_limit": bool,
    "spans": MayBeAbsent(dict),
    "prompt_tokens": MayBeAbsent(int),
    **thinking.THINKING_SCHEMA,
}


def rescore(records: pd.DataFrame, rule: str) -> pd.DataFrame:
    """The records scored by `rule` from their stored outputs, with `distractor_named`: the output holds a
    distractor's value (an answer copied from the wrong needle or chain). A sample whose thinking never closed has no
    answer: its score stays null."""
    scored = thinking.scored_or_null(records, lambda output, expected: scoring.score(output, expected, rule))
    closed = ~thinking.unclosed(records)
    named = [
        any(value.lower() in output.lower() for value in values) if keep else None
        for output, values, keep in zip(records["output"], records["distractor_values"], closed)
    ]  # no answer, no diagnostic: a sample whose thinking never closed counts in neither direction
    return records.assign(
        score=[value for value, _ in scored],
        correct=thinking.nullable([c for _, c in scored]),
        distractor_named=thinking.nullable(named),
    )


def tables_for(recipe: Recipe, extra_tables: dict[str, Callable] | None = None) -> Callable[..., dict]:
    def probe_tables(records: pd.DataFrame, options: Any, paper: bool = False) -> dict[str, pd.DataFrame]:
        """Score by length and setting (rows = models), the floor cells, the answers' diagnostics, a depth × length
        grid per model where the probe has depth, and the effective length over several lengths."""
        frame, lengths = tables.with_lengths(records)
        settings = list(dict.fromkeys(frame["setting"]))
        out = {}
        scores = tables.scores_by_setting(frame, lengths, settings)
        column_cells = [{"ctx": parse_format_ctx(length), "setting": s} for length, s in scores.columns]
        floor = [(length, s) for length, s in scores.columns if (scores[(length, s)] <= FLOOR).all()]
        multi_setting = len(settings) > 1
        scores.columns = [f"{length} {s}" if multi_setting else length for length, s in scores.columns]
        scores = with_cells(scores.round(3), [{"model": m} for m in scores.index], column_cells)
        out["scores"] = tables.with_unclosed_column(scores, frame, len(scores.index))
        out["floor"] = floor_table(floor, frame)
        out["answers"] = tables.answers_table(
            frame, {"all_found": ("correct", "mean"), "distractor_named": ("distractor_named", "mean")}
        )
        if recipe.has_depth:
            out.update(tables.depth_grids(frame, lengths))
        if len(lengths) > 1:
            out["effective_length"] = tables.effective_lengths_by_setting(frame, settings, options.base_lengths)
        if thinking.has_thinking(frame):
            out["thinking"] = thinking.thinking_table(frame)
        for key, make in (extra_tables or {}).items():
            out[key] = make(records, options)
        return thinking.with_thinking_note(out, frame)

    return probe_tables


def floor_table(floor: list[tuple[str, str]], frame: pd.DataFrame) -> pd.DataFrame:
    """The (length, setting) cells where every model's mean score is at most FLOOR, each model's mean beside."""
    import pandas as pd

    rows, cells = [], []
    for length, setting in floor:
        cell = frame[(frame["length"] == length) & (frame["setting"] == setting)]
        means = cell.groupby("model", sort=False)["score"].mean()
        rows.append({"length": length, "setting": setting, **{m: round(float(v), 3) for m, v in means.items()}})
        cells.append({"ctx": parse_format_ctx(length), "setting": setting})
    columns = ["length", "setting", *frame["model"].unique()]
    table = pd.DataFrame(rows, columns=columns).set_index(["length", "setting"])
    return with_cells(table, cells, [{"model": m} for m in table.columns])


def plots_for(recipe: Recipe) -> Callable[..., list]:
    def probe_plots(records: pd.DataFrame, folder: Path) -> list[Path]:
        """Score by depth, one line per length, one panel per model (probes with depth)."""
        if not recipe.has_depth:
            return []
        return [plots.depth_curves(records, folder / f"{recipe.name}_position_curves.png", "answer depth (%)")]

    return probe_plots


def probe_task(recipe: Recipe, options: type, help: str, note: str, token_limit: int,
               check_inputs: Callable[[RunContext[Any]], None] | None = None, titles: dict[str, str] | None = None,
               extra_tables: dict[str, Callable] | None = None, extra_schema: dict | None = None) -> Task:  # fmt: skip
    """The `Task` of a probe recipe whose every sample generates at most `token_limit` tokens: the shared running,
    reporting, viewing and scoring; `extra_tables` (key → (records, options) → DataFrame) and `extra_schema` (the
    record fields they read) are the recipe's own."""

    def budget(context: RunContext[Any]) -> ContextBudget:
        return ContextBudget(context.lengths, token_limit, MIN_PROMPT_TOKENS, thinking=thinking.reserve(context))

    return Task(
        name=recipe.name,
        help=help,
        options=options,
        run_options=("chat_template", *thinking.RUN_OPTIONS),
        running=running(recipe, budget, check_inputs),
        reporting=Reporting(
            tables=tables_for(recipe, extra_tables),
            titles={
                "scores": "Score by length (and setting)",
                "floor": f"Cells at the floor: every model's mean score ≤ {FLOOR}; no difference is read from them",
                "answers": "Answers: mean score, all expected found, outputs naming a distractor's value, samples "
                "stopped at the token limit",
                "depth_grid": tables.DEPTH_GRID_TITLE,
                "effective_length": tables.EFFECTIVE_LENGTH_TITLE,
                "thinking": thinking.TITLE,
                **(titles or {}),
            },
            note=note,
            summary_keys=["model", "ctx", "depth", "setting"] if recipe.has_depth else ["model", "ctx", "setting"],
            pair_keys=["ctx", "setting"],
            metrics={"accuracy": "score"},
            decimals={"resamples with base below floor": 0, thinking.UNCLOSED: 0},
            plots=plots_for(recipe),
            floor=FLOOR,
        ),
        viewing=Viewing(sample_view=sample_view_for(recipe)),
        scoring=Scoring(
            record_schema={**RECORD_SCHEMA, **(extra_schema or {})},
            rules=scoring.described(recipe.rules),
            rescore=rescore,
        ),
    )
