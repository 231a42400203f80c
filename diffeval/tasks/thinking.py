"""A reasoning model's thinking phase, as the tasks that generate see it (--thinking-budget; docs/reasoning.md).

The engines and `models.thinking` run each sample in two phases: the thinking, up to the budget and stopped at the
model's end marker, then today's answer call after it. Here is what every task does the same way with that: the room
a sample reserves, the generate call, the record's thinking fields, and the tables' count of thinking that never
closed (an outcome of its own: no answer and no score, counted in every table, as hallucination's degenerate outputs
are) and thinking length by cell.

A run without a thinking budget never reaches these: its prompts, records and tables are what they were before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from diffeval.models import thinking as phases
from diffeval.models.backend import Backend, Generation
from diffeval.records import MayBeAbsent

UNCLOSED = phases.UNCLOSED  # the record outcome of thinking that never closed
ANSWERED = "answered"  # a haystack record's outcome when the thinking closed and the answer was read after it
UNCLOSED_REASON = "thinking never closed within --thinking-budget"

# the record fields of a thinking run (absent from the records of a run without one)
THINKING_SCHEMA = {
    "outcome": MayBeAbsent(str),
    "thinking": MayBeAbsent(str),
    "thinking_tokens": MayBeAbsent(int),
    "thinking_closed": MayBeAbsent(bool),
    "thinking_at_budget": MayBeAbsent(bool),
}
# the RunConfig options of every task that generates (config.py: --thinking-budget, --think-markers, --template-switch)
RUN_OPTIONS = ("thinking_budget", "think_markers", "template_switch")
TITLE = "Thinking: mean tokens, and samples whose thinking never closed (no answer, left out of the scores), by length"


def reserve(context: Any) -> int:
    """Tokens a sample reserves for its thinking: the budget and a margin (`models.thinking.reserve`), 0 without one."""
    return phases.reserve(budget(context))


def budget(context: Any) -> int | None:
    """The run's thinking budget; None without one (and for a hand-made context that names none: a test's, the
    viewer's)."""
    return getattr(context, "thinking_budget", None)


@dataclass(frozen=True)
class Ask:
    """One prompt to answer: its ids, its text, and the answer prefix its text ends in (moved after the thinking)."""

    ids: list[int]
    text: str
    answer_prefix: str


def generate(backend: Backend, context: Any, asks: Sequence[Ask], max_new_tokens: int,
             stop: list[str]) -> list[Generation]:  # fmt: skip
    """The model's answers to `asks`: today's generate call without a thinking budget; with one, the thinking phase
    first and the answer read after it (`models.thinking.think_then_answer`), each Generation with its `thought`."""
    thinking_budget = budget(context)
    if thinking_budget is None:
        return backend.generate([a.ids for a in asks], max_new_tokens, stop)
    markers = backend.thinking_markers(context.think_markers)
    name = backend.info.name
    prompts = [
        phases.ThinkingPrompt(
            a.ids, phases.split_at_answer_prefix(backend, a.ids, a.text, a.answer_prefix, name), a.answer_prefix
        )
        for a in asks
    ]
    return phases.think_then_answer(backend, prompts, markers, thinking_budget, max_new_tokens, stop)


def answered(output: Generation) -> bool:
    """Whether an answer was read: always without a thinking phase; with one, where the thinking closed."""
    return output.thought is None or output.thought.closed


def thinking_fields(output: Generation, outcome: bool = True) -> dict[str, Any]:
    """A record's thinking fields (none without a thinking phase). outcome=False: the task writes its own outcome."""
    thought = output.thought
    if thought is None:
        return {}
    fields: dict[str, Any] = {"outcome": ANSWERED if thought.closed else UNCLOSED} if outcome else {}
    return {
        **fields,
        "thinking": thought.text,
        "thinking_tokens": thought.tokens,
        "thinking_closed": thought.closed,
        "thinking_at_budget": thought.at_budget,
    }


def generated_tokens(output: Generation) -> int:
    """Every token the model generated for a sample (the record envelope's new_tokens): its thinking and its answer."""
    return output.new_tokens + (output.thought.tokens if output.thought is not None else 0)


def scored_or_null(records, score: Callable[[str, Any], tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """(score, correct) of each record's stored output by `score(output, expected)`, and (None, None) where its
    thinking never closed: a rescore never turns such a sample's empty answer into a zero."""
    closed = ~unclosed(records)
    return [
        score(output, expected) if keep else (None, None)
        for output, expected, keep in zip(records["output"], records["expected"], closed)
    ]


def nullable(values: list) -> Any:
    """Booleans with nulls as pandas' nullable boolean, so that a mean skips the nulls (unclosed thinking)."""
    import pandas as pd

    return pd.array(values, dtype="boolean") if any(v is None for v in values) else values


# ---- tables -------------------------------------------------------------------------------------------------------


def has_thinking(frame) -> bool:
    """Whether the records come from a thinking run (any row holds a thinking token count)."""
    return "thinking_tokens" in frame and bool(frame["thinking_tokens"].notna().any())


def unclosed(frame):
    """A boolean Series: the rows whose thinking never closed."""
    import pandas as pd

    if "outcome" not in frame:
        return pd.Series(False, index=frame.index)
    return frame["outcome"].eq(UNCLOSED).fillna(False).astype(bool)


def unclosed_counts(frame, by: list[str]):
    """Per group of `by`, the samples whose thinking never closed (0 where none)."""
    return unclosed(frame).groupby([frame[key] for key in by]).sum().astype(int)


def thinking_table(frame, by: str = "ctx", label: str = "length"):
    """Rows are models; per value of `by` (the context length): the mean thinking tokens of the samples that thought
    and the count of those whose thinking never closed. The thinking length by cell: it changes with the length."""
    import pandas as pd

    from diffeval.tasks.base import with_cells

    rows = frame[frame["thinking_tokens"].notna()]
    tokens = rows.groupby(["model", by])["thinking_tokens"].mean().unstack(by)
    counts = unclosed_counts(rows, ["model", by]).unstack(by)
    values = sorted(set(tokens.columns))
    columns: dict[str, Any] = {}
    filters = []
    for value in values:
        columns[f"{value} thinking tokens"] = tokens[value]
        filters.append({by: value})
        columns[f"{value} unclosed"] = counts[value].fillna(0).astype(int)
        filters.append({by: value, "outcome": UNCLOSED})
    table = pd.DataFrame(columns)
    table.index.name = "model"
    return with_cells(table, [{"model": m} for m in table.index], filters)


def unclosed_by_model(frame) -> dict[str, int]:
    """{model: samples whose thinking never closed}, every model of the frame."""
    counts = unclosed(frame).groupby(frame["model"], sort=False).sum()
    return {str(model): int(count) for model, count in counts.items()}


def with_thinking_note(tables: dict, frame) -> dict:
    """Each table's note counts, per model, the samples whose thinking never closed; tables of a run without a
    thinking phase are left as they were."""
    if not has_thinking(frame):
        return tables
    counts = ", ".join(f"{model} {count}" for model, count in unclosed_by_model(frame).items())
    note = f"{UNCLOSED_REASON}: {counts} samples; they have no answer and are left out of the scores"
    for table in tables.values():
        table.attrs["note"] = "; ".join(filter(None, (table.attrs.get("note"), note)))
    return tables
