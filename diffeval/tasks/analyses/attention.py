"""Attention-to-answer analysis (paper Table 3), with the DIFF map decomposed into A1, A2 and A1 − λ·A2.

Recipe:
1. samples: the needle task's samples (same generator and seed → same content and recorded token spans).
2. rows: the last prompt token (it predicts the first answer token); with `rows=answer`, the expected answer is
   teacher-forced and every row that predicts an answer token is added.
3. backend: per layer and head, the softmax weight each key segment receives in those rows (never a T×T map).
4. segments: answer (the queried numbers' tokens, or whole queried needles with `span=needle`), needles (every other
   needle token), noise (haystack outside the needles), scaffold (instruction, question, answer prefix, chat template,
   teacher-forced answer tokens) and sink (the first token). The five shares add up to the row sum.
5. maps (shares.py): a baseline's softmax map; a DIFF model's map 1, map 2 and the differential map A1 − λ·A2, whose
   rows sum to 1 − λ. Shares are given raw and divided by the row sum. The headline number (set beside the paper's)
   is the raw share of the headline map, averaged over heads (the H/2 differential heads for DIFF) and layers.
6. layers: those whose kind attends (a hybrid's Mamba layers have no map): the per-layer table is indexed by decoder
   layer, and every table's note names the layers skipped and their kind.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diffeval.config import option
from diffeval.errors import InputError
from diffeval.longctx.lengths import format_ctx, parse_format_ctx
from diffeval.models.backend import Backend
from diffeval.models.layer_kinds import analysed_layers, record_fields
from diffeval.models.tokenizer import encode_in_context
from diffeval.paper import TABLE3, coverage
from diffeval.records import MayBeAbsent, Record
from diffeval.tasks.analyses.shares import (
    HEADLINE_MAP,
    MAPS_SCHEMA,
    SEGMENTS,
    SEGMENTS_TITLE,
    check_capturable,
    mean,
    measure,
    sample_view,
    segments_out,
)
from diffeval.tasks.base import (
    Listing,
    Reporting,
    RunContext,
    Running,
    Scoring,
    Task,
    Viewing,
    skipped_layers_by_model,
    with_cells,
    with_rows,
    with_skipped_layers,
)
from diffeval.tasks.haystack import needle
from diffeval.tasks.haystack.needle_options import NeedleOptions
from diffeval.tasks.haystack.recipe import check_haystack, fitted_prompt, make_samples_for, sizing_for
from diffeval.tasks.haystack.samples import HaystackPrompt, HaystackSample

if TYPE_CHECKING:  # annotations only: heavy libraries load inside the functions that use them (a fast CLI)
    import pandas as pd


@dataclass(frozen=True)
class AttentionOptions(NeedleOptions):
    """Attention-to-answer analysis on the needle task's samples (paper Table 3)."""

    samples: int = option(20, help="samples per depth × length × N/R cell", identity=False)
    rows: str = option(
        "last", help="last: the last prompt token's row | answer: also teacher-forced answer rows [default: last]"
    )
    span: str = option(
        "answer", help="answer: the number's tokens | needle: the whole needle sentence [default: answer]"
    )

    def validate(self) -> None:
        super().validate()
        if self.rows not in ("last", "answer"):
            raise InputError(f"bad --rows {self.rows!r}: use last or answer")
        if self.span not in ("answer", "needle"):
            raise InputError(f"bad --span {self.span!r}: use answer or needle")


def segment_ids(prompt: HaystackPrompt, length: int, queries: int, span: str) -> list[int]:
    """The segment index of every token position of the (possibly answer-extended) prompt."""
    ids = [SEGMENTS.index("scaffold")] * length
    h_start, h_end = prompt.spans["haystack"]
    ids[h_start:h_end] = [SEGMENTS.index("noise")] * (h_end - h_start)
    for start, end in prompt.spans["needles"]:
        ids[start:end] = [SEGMENTS.index("needles")] * (end - start)
    answer_spans = prompt.spans["needles" if span == "needle" else "numbers"][:queries]
    for start, end in answer_spans:
        ids[start:end] = [SEGMENTS.index("answer")] * (end - start)
    ids[0] = SEGMENTS.index("sink")
    return ids


def evaluate(batch: list[HaystackSample], backend: Backend, context: RunContext[AttentionOptions]) -> list[Record]:
    options = context.options
    records = []
    for sample in batch:
        start = time.perf_counter()
        prompt = fitted_prompt(needle.RECIPE, sample, backend, context)  # the needle task's: its spans match its runs
        ids = list(prompt.ids)
        rows = [len(ids) - 1]
        if options.rows == "answer":
            # the answer is tokenized after the prompt, as the model reads it; where its first token merges with the
            # prompt's last, the rows start at the last token both share
            extended = encode_in_context(backend, prompt.text, [" " + ", ".join(sample.expected)])
            ids = extended.prefix + extended.tails[0]
            rows = list(range(len(extended.prefix) - 1, len(ids) - 1))
        segments = segment_ids(prompt, len(ids), len(sample.expected), options.span)
        maps, headline = measure(backend, ids, rows, segments)
        fields = {
            "is_diff": backend.info.is_diff,
            **needle.sample_fields(sample),
            "rows": rows,
            "span": options.span,
            "answer_share": mean(headline["answer"]),
            "noise_share": mean(headline["noise"]),
            "answer_share_normalized": mean(headline["answer"]) / mean(headline["row_sum"]),
            "noise_share_normalized": mean(headline["noise"]) / mean(headline["row_sum"]),
            "shares": maps,
            **record_fields(backend.info, whole_context=True),
        }
        seconds = time.perf_counter() - start
        records.append(Record("attention", backend.info.name, sample.sample_id, len(prompt.ids), 0, seconds, fields))
    return records


def paper_coverage(records: pd.DataFrame, options: AttentionOptions) -> str:
    """Table 3 is the attention on the answer and on noise at 64K, by answer depth."""
    depths = sorted(next(iter(TABLE3.values()))["answer"])
    run = set(records.loc[records["ctx"] == 65536, "depth"])
    has = [f"64K depth {d}%" for d in depths if d in run]
    return coverage(
        "Table 3 (attention to the answer at 64K)", has, [f"64K depth {d}%" for d in depths if d not in run]
    )


def attention_tables(records: pd.DataFrame, options: AttentionOptions, paper: bool = True) -> dict[str, pd.DataFrame]:
    """Table 3 always carries the paper's rows: the issue's headline comparison (see the module docstring). The
    tables read no option."""
    import pandas as pd

    frame = records.assign(length=records["ctx"].map(format_ctx))
    multi_length = frame["length"].nunique() > 1
    out = {}
    for suffix, label in (("", "raw"), ("_normalized", "normalised")):
        columns, column_cells = {}, []
        for segment in ("answer", "noise"):
            pivot = frame.pivot_table(
                index="model",
                columns=["length", "depth"],
                values=f"{segment}_share{suffix}",
                aggfunc="mean",
                sort=False,
            )
            for length, depth in pivot.columns:
                prefix = f"{length} " if multi_length else ""
                columns[f"{prefix}{segment} {depth}%"] = pivot[(length, depth)]
                column_cells.append({"ctx": parse_format_ctx(length), "depth": depth})
        table = pd.DataFrame(columns)
        row_cells = [{"model": m} for m in table.index]
        if not suffix and not multi_length:  # the headline raw shares, beside the paper's Table 3
            table = with_rows(table, _paper_rows(sorted(frame["depth"].unique())))
        out[f"table3_{label}"] = with_cells(table.round(3), row_cells, column_cells)
    out["segments"] = segments_out(frame)
    per_layer = _per_layer_table(frame)
    out["per_layer"] = with_cells(per_layer, [{}] * len(per_layer), [{"model": m} for m in frame["model"].unique()])
    return with_skipped_layers(out, frame)


def _paper_rows(depths: list[int]) -> pd.DataFrame:
    import pandas as pd

    rows = {
        model: {f"{segment} {d}%": values[segment].get(d) for segment in ("answer", "noise") for d in depths}
        for model, values in TABLE3.items()
    }
    return pd.DataFrame.from_dict(rows, orient="index")


def _per_layer_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Raw answer share of the headline map per layer (rows = decoder layers that attend, columns = models)."""
    import pandas as pd

    columns = {}
    skipped = skipped_layers_by_model(frame)
    for model, group in frame.groupby("model", sort=False):
        name = HEADLINE_MAP[bool(group["is_diff"].iloc[0])]
        values = [shares[name]["answer"] for shares in group["shares"]]
        layers = pd.DataFrame(values, columns=analysed_layers(len(values[0]), skipped.get(model, {})))
        columns[f"{model} ({name})"] = layers.mean()
    table = pd.DataFrame(columns)
    table.index.name = "layer"
    return table.round(4)


def plots(records: pd.DataFrame, folder: Path) -> list[Path]:
    """Answer and noise shares by depth, both models side by side; per-layer answer share curves."""
    from diffeval.plotting import legend, panels, save

    by_depth = records.groupby(["depth", "model"], sort=False)[["answer_share", "noise_share"]].mean().unstack()
    depths, models = by_depth.shape[0], records["model"].nunique()
    fig, axes = panels(2, 2 * max(5.5, 0.8 + depths * (0.15 * models + 0.3)), 4)  # a group of bars per depth
    for ax, column, title in zip(axes, ("answer_share", "noise_share"), ("attention to answer", "attention noise")):
        by_depth[column].plot.bar(ax=ax, rot=0)
        ax.set(title=f"{title} (raw share, headline map)", xlabel="needle depth (%)", ylabel="share")
        ax.axhline(0, color="black", linewidth=0.5)
    legend(fig, axes, title="model")
    bars = save(fig, folder / "attention_by_depth.png")
    fig, (ax,) = panels(1, 6, 4)
    _per_layer_table(records).plot(ax=ax, marker="o")
    ax.set(title="attention to answer per layer (raw)", xlabel="layer", ylabel="share")
    legend(fig, [ax])
    curves = save(fig, folder / "attention_per_layer.png")
    return [bars, curves]


RECORD_SCHEMA = {
    "is_diff": bool,
    "ctx": int,
    "depth": int,
    "needles": int,
    "queries": int,
    "answer_share": float,
    "noise_share": float,
    "answer_share_normalized": float,
    "noise_share_normalized": float,
    "shares": MAPS_SCHEMA,
    "rows": MayBeAbsent(list[int]),  # the view's title
    "skipped_layers": MayBeAbsent(dict[str, str]),  # a hybrid's layers without attention: {decoder index: kind}
}


def sizing(samples: list[HaystackSample], tokenizer: Any, context: RunContext[Any]) -> tuple[int, int]:
    """The needle task's prompt tokens, and no generation."""
    return sizing_for(needle.RECIPE)(samples, tokenizer, context)[0], 0


TASK = Task(
    name="attention",
    help="Attention-to-answer analysis on needle samples (paper Table 3), DIFF maps decomposed.",
    options=AttentionOptions,
    run_options=("chat_template", "max_new_tokens"),
    running=Running(
        make_samples=make_samples_for(needle.RECIPE),
        evaluate=evaluate,
        needs=frozenset({"attention_rows"}),
        budget=needle.budget,  # the needle task's prompt, fitted beside the needle's answer limit
        check_inputs=lambda context: check_capturable(context, lambda: check_haystack(context)),
        sizing=sizing,
    ),
    reporting=Reporting(
        tables=attention_tables,
        paper_coverage=paper_coverage,
        titles={
            "table3_raw": "Table 3 layout: attention to answer and noise by depth (raw shares)",
            "table3_normalised": "Table 3 layout: attention to answer and noise by depth (shares / row sum)",
            "segments": SEGMENTS_TITLE,
            "per_layer": "Attention to answer per layer (raw, headline map)",
        },
        note=(
            "attention share = attention weight of the query row(s) on a segment; raw shares are as computed "
            "(DIFF differential-map rows sum to 1 - lambda), 'normalised' ones are divided by the row sum; headline "
            "map: differential map for DIFF models, softmax for baselines; mean over heads and layers"
        ),
        summary_keys=["model", "ctx", "depth", "needles", "queries"],
        pair_keys=["ctx", "depth"],
        metrics={
            "answer_share": "answer_share",
            "noise_share": "noise_share",
            "answer_share_normalized": "answer_share_normalized",
        },
        summary_value="answer_share",
        plots=plots,
    ),
    # shares: no answer, no right or wrong
    viewing=Viewing(sample_view=sample_view, listing=Listing(answer=None, expected=None, outcome=None)),
    scoring=Scoring(record_schema=RECORD_SCHEMA),
)
