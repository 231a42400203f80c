"""Zero-shot benchmarks through lm-eval (paper Table 1 layout): a column per task and the average."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

import pandas as pd

from diffeval.models.backend import Backend
from diffeval.models.lmeval import evaluate_tasks, headline_metric
from diffeval.paper import TABLE1

SUMMARY_KEYS = ["model", "lm_task"]
SUMMARY_VALUE = "accuracy"
PAIR_KEYS = None  # one aggregate per setting, no per-sample pairs
METRICS = {"accuracy": "accuracy"}
TABLE_NOTE = "zero-shot lm-eval accuracy (%): acc_norm where the task reports it, else acc; average over the tasks"
PAPER_TASKS = ("arc_challenge", "arc_easy", "boolq", "hellaswag", "openbookqa", "piqa", "winogrande")


@dataclass(frozen=True)
class Benchmark:
    sample_id: str
    lm_task: str


def make_samples(options, seed: int, limit: int | None = None) -> list[Benchmark]:
    return [Benchmark(hashlib.sha256(f"zeroshot|{t}".encode()).hexdigest()[:16], t) for t in options.lm_tasks]


def evaluate(batch: list[Benchmark], backend: Backend, config) -> list[dict]:
    options = config.options
    start = time.perf_counter()
    results = evaluate_tasks(
        backend, [b.lm_task for b in batch], config.limit, options.ctx[0], options.lm_batch_size, options.include_path
    )
    seconds = (time.perf_counter() - start) / len(batch)
    records = []
    for benchmark in batch:
        metric, value = headline_metric(results[benchmark.lm_task])
        records.append(
            {
                "task": "zeroshot",
                "model": backend.info.name,
                "sample_id": benchmark.sample_id,
                "lm_task": benchmark.lm_task,
                "metric": metric,
                "accuracy": value,
                "metrics": results[benchmark.lm_task],
                "limit": config.limit,
                "prompt_tokens": 0,
                "new_tokens": 0,
                "seconds": round(seconds, 4),
            }
        )
    return records


def tables(records: pd.DataFrame, paper: bool = False) -> dict[str, pd.DataFrame]:
    table = records.pivot_table(index="model", columns="lm_task", values="accuracy", aggfunc="mean", sort=False) * 100
    table = table[[t for t in records["lm_task"].unique()]]
    table["average"] = table.mean(axis=1)
    if paper and set(table.columns) - {"average"} == set(PAPER_TASKS):  # the paper's average is over all seven
        table = pd.concat([table, pd.DataFrame.from_dict(TABLE1, orient="index")[list(table.columns)]])
    return {"table1": table.round(1)}
