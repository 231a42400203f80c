"""Zero-shot benchmarks through lm-eval (paper Table 1 layout): a column per task and the average."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from diffeval.config import option, str_list
from diffeval.models.backend import Backend
from diffeval.models.lmeval import LmEvalOptions, headline_metric
from diffeval.paper import TABLE1, coverage
from diffeval.records import Record, sample_id
from diffeval.tasks.base import Reporting, RunContext, Running, Scoring, Task, with_cells, with_rows
from diffeval.tasks.internals.lmeval import check_lm_tasks, lm_eval_results

if TYPE_CHECKING:  # annotations only: heavy libraries load inside the functions that use them (a fast CLI)
    import pandas as pd

PAPER_TASKS = ("arc_challenge", "arc_easy", "boolq", "hellaswag", "openbookqa", "piqa", "winogrande")


@dataclass(frozen=True)
class ZeroshotOptions(LmEvalOptions):
    """Zero-shot lm-eval benchmarks (paper Table 1 layout)."""

    lm_tasks: list[str] = option(
        list(PAPER_TASKS), help="lm-eval task names, comma-separated", flag="--tasks", parse=str_list("--tasks")
    )


@dataclass(frozen=True)
class Benchmark:
    sample_id: str
    lm_task: str


def make_samples(options, seed: int, limit: int | None = None, prepared=None) -> list[Benchmark]:
    return [Benchmark(sample_id(f"zeroshot|{t}"), t) for t in options.lm_tasks]


def evaluate(batch: list[Benchmark], backend: Backend, context: RunContext[ZeroshotOptions]) -> list[Record]:
    start = time.perf_counter()
    # lm-eval's HF wrapper takes the loaded transformers model
    results = lm_eval_results(backend.torch_module(), [b.lm_task for b in batch], context.options, context.limit)
    seconds = (time.perf_counter() - start) / len(batch)
    records = []
    for benchmark in batch:
        metric, value = headline_metric(results[benchmark.lm_task])
        fields = {
            "lm_task": benchmark.lm_task,
            "metric": metric,
            "accuracy": value,
            "metrics": results[benchmark.lm_task],
            "limit": context.limit,
        }
        records.append(Record("zeroshot", backend.info.name, benchmark.sample_id, 0, 0, seconds, fields))
    return records


def paper_coverage(records: pd.DataFrame, options: ZeroshotOptions) -> str:
    """Table 1 gives seven lm-eval tasks and their average (set beside this run only when it has all seven)."""
    run = set(records["lm_task"])
    has, lacks = [t for t in PAPER_TASKS if t in run], [t for t in PAPER_TASKS if t not in run]
    return coverage("Table 1 (zero-shot accuracy)", has, lacks)


def tables(records: pd.DataFrame, options: ZeroshotOptions, paper: bool = False) -> dict[str, pd.DataFrame]:
    import pandas as pd

    table = records.pivot_table(index="model", columns="lm_task", values="accuracy", aggfunc="mean", sort=False) * 100
    table = table[[t for t in records["lm_task"].unique()]]
    column_cells = [{"lm_task": t} for t in table.columns] + [{}]
    table["average"] = table.mean(axis=1)
    row_cells = [{"model": m} for m in table.index]
    if paper and set(table.columns) - {"average"} == set(PAPER_TASKS):  # the paper's average is over all seven
        table = with_rows(table, pd.DataFrame.from_dict(TABLE1, orient="index")[list(table.columns)])
    return {"table1": with_cells(table.round(1), row_cells, column_cells)}


RECORD_SCHEMA = {"lm_task": str, "accuracy": float}


TASK = Task(
    name="zeroshot",
    help="Zero-shot lm-eval benchmarks in the paper's Table 1 layout.",
    options=ZeroshotOptions,
    running=Running(
        make_samples=make_samples,
        evaluate=evaluate,
        needs=frozenset({"torch_module"}),
        # no budget: --ctx is lm-eval's max_length, and lm-eval fits its own prompts to it
        check_inputs=check_lm_tasks,
    ),
    reporting=Reporting(
        tables=tables,
        paper_coverage=paper_coverage,
        titles={"table1": "Table 1 layout: zero-shot accuracy (%)"},
        note="zero-shot lm-eval accuracy (%): acc_norm where the task reports it, else acc; average over the tasks",
        summary_keys=["model", "lm_task"],
        pair_keys=None,  # one aggregate per setting, no per-sample pairs
        metrics={"accuracy": "accuracy"},
        summary_value="accuracy",
        decimals={"table1": 1},  # percentages, as the paper prints them
    ),
    scoring=Scoring(record_schema=RECORD_SCHEMA),
)
