"""Low-bit attention logits (paper Figure 8): zero-shot accuracy with attention logits quantized to b bits.

Recipe:
1. samples: one per (bits, lm-eval task).
2. backend: the model runs the `diffeval_quant` attention implementation (dynamic absmax quantization of the
   pre-softmax logits at the chosen granularity; 16 bits = unquantized) and lm-eval's HF wrapper evaluates it
   zero-shot on the task (HellaSwag by default; acc_norm and acc are reported). Only layers that attend have logits:
   a hybrid's Mamba layers run as they are, its records list them, and the tables' note names them and their kind.
3. tables: accuracy by bits per model and task, and an accuracy-vs-bits plot for both models.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from diffeval.config import int_list, option, str_list
from diffeval.errors import InputError
from diffeval.models.backend import Backend
from diffeval.models.layer_kinds import check_captured, record_fields
from diffeval.models.lmeval import LmEvalOptions
from diffeval.records import MayBeAbsent, Record, sample_id
from diffeval.tasks.base import Reporting, RunContext, Running, Scoring, Task, with_cells, with_skipped_layers
from diffeval.tasks.internals.lmeval import check_lm_tasks, lm_eval_results

if TYPE_CHECKING:  # annotations only: heavy libraries load inside the functions that use them (a fast CLI)
    import pandas as pd

GRANULARITIES = ("tensor", "head", "row")  # the absmax scale groups of models.activations.quantize_absmax


@dataclass(frozen=True)
class QuantizeOptions(LmEvalOptions):
    """Attention logits quantized to b bits, evaluated zero-shot with lm-eval (paper Figure 8)."""

    bits: list[int] = option(
        [16, 8, 6, 4], help="attention-logit bit widths; 16 = unquantized [default: 16,8,6,4]", parse=int_list("--bits")
    )
    lm_tasks: list[str] = option(
        ["hellaswag"], help="lm-eval task names, comma-separated", flag="--tasks", parse=str_list("--tasks")
    )
    granularity: str = option("row", help="absmax scale per tensor | head | row [default: row]")

    def validate(self) -> None:
        wrong = [b for b in self.bits if b < 2 or b > 16]
        if wrong:
            raise InputError(f"--bits {wrong[0]}: use widths from 2 to 16 (16 = unquantized), e.g. 16,8,6,4")
        if self.granularity not in GRANULARITIES:
            raise InputError(f"bad --granularity {self.granularity!r}: use one of {', '.join(GRANULARITIES)}")
        super().validate()


@dataclass(frozen=True)
class Setting:
    sample_id: str
    bits: int
    lm_task: str


def make_samples(options, seed: int, limit: int | None = None, prepared=None) -> list[Setting]:
    return [
        Setting(sample_id(f"quantize|{b}|{t}|{options.granularity}"), b, t)
        for t in options.lm_tasks
        for b in options.bits
    ]


def evaluate(batch: list[Setting], backend: Backend, context: RunContext[QuantizeOptions]) -> list[Record]:
    from diffeval.models.activations import quantized_logits

    options = context.options
    loaded = backend.torch_module()  # the quantized logits are an attention implementation of this model
    records = []
    for setting in batch:
        start = time.perf_counter()
        with quantized_logits(loaded.model, setting.bits, options.granularity) as quantized:
            [metrics] = lm_eval_results(loaded, [setting.lm_task], options, context.limit).values()
        check_captured(backend.info, quantized, "quantize")
        fields = {
            "lm_task": setting.lm_task,
            "bits": setting.bits,
            "granularity": options.granularity,
            "acc": metrics.get("acc"),
            "acc_norm": metrics.get("acc_norm", metrics.get("acc")),
            "metrics": metrics,
            "limit": context.limit,
            **record_fields(backend.info),
        }
        seconds = time.perf_counter() - start
        records.append(Record("quantize", backend.info.name, setting.sample_id, 0, 0, seconds, fields))
    return records


def tables(records: pd.DataFrame, options: QuantizeOptions, paper: bool = False) -> dict[str, pd.DataFrame]:
    out = {}
    for metric in ("acc_norm", "acc"):
        table = records.pivot_table(
            index=["model", "lm_task"], columns="bits", values=metric, aggfunc="mean", sort=False
        )
        table = table[sorted(table.columns, reverse=True)].round(4)
        out[f"figure8_{metric}"] = with_cells(
            table, [{"model": m, "lm_task": t} for m, t in table.index], [{"bits": b} for b in table.columns]
        )
    return with_skipped_layers(out, records, "quantized attention logits")


def plots(records: pd.DataFrame, folder: Path) -> list[Path]:
    from diffeval.plotting import legend, panels, save

    fig, (ax,) = panels(1, 6, 4)
    for (model, task), group in records.groupby(["model", "lm_task"], sort=False):
        group = group.sort_values("bits")
        ax.plot(group["bits"], group["acc_norm"], marker="o", label=f"{model} · {task}")
    ax.set(xlabel="attention logit bits", ylabel="accuracy (acc_norm)", title="accuracy vs attention-logit bits")
    ax.invert_xaxis()
    legend(fig, [ax])
    return [save(fig, folder / "quantize_accuracy_vs_bits.png")]


# lm-eval reports acc or acc_norm per task, not always both: a missing one is stored as null
RECORD_SCHEMA = {
    "lm_task": str,
    "bits": int,
    "acc": float | None,
    "acc_norm": float | None,
    "skipped_layers": MayBeAbsent(dict[str, str]),  # a hybrid's layers without attention: {decoder index: kind}
}


TASK = Task(
    name="quantize",
    help="Zero-shot accuracy with attention logits quantized to b bits, via lm-eval (paper Figure 8).",
    options=QuantizeOptions,
    running=Running(
        make_samples=make_samples,
        evaluate=evaluate,
        needs=frozenset({"torch_module"}),
        # no budget: --ctx is lm-eval's max_length, and lm-eval fits its own prompts to it
        check_inputs=check_lm_tasks,
    ),
    reporting=Reporting(
        tables=tables,
        titles={
            "figure8_acc_norm": "Figure 8: zero-shot acc_norm by attention-logit bits (16 = unquantized)",
            "figure8_acc": "Figure 8: zero-shot acc by attention-logit bits (16 = unquantized)",
        },
        note=(
            "zero-shot lm-eval accuracy with attention logits quantized (dynamic absmax) to b bits; 16 = "
            "unquantized; one value per model, task and bit width (the mean over the task's documents)"
        ),
        summary_keys=["model", "lm_task", "bits"],
        pair_keys=None,  # one aggregate per setting, no per-sample pairs
        metrics={"acc_norm": "acc_norm", "acc": "acc"},
        summary_value="acc_norm",
        plots=plots,
    ),
    scoring=Scoring(record_schema=RECORD_SCHEMA),
)
