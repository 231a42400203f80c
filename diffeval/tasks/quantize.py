"""Low-bit attention logits (paper Figure 8): zero-shot accuracy with attention logits quantized to b bits.

Recipe:
1. samples: one per (bits, lm-eval task).
2. backend: the model runs the `diffeval_quant` attention implementation (dynamic absmax quantization of the
   pre-softmax logits at the chosen granularity; 16 bits = unquantized) and lm-eval's HF wrapper evaluates it
   zero-shot on the task (HellaSwag by default; acc_norm and acc are reported).
3. tables: accuracy by bits per model and task, and an accuracy-vs-bits plot for both models.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from diffeval.models.activations import quantized_logits
from diffeval.models.backend import Backend
from diffeval.models.lmeval import evaluate_tasks
from diffeval.report.plotting import plt

SUMMARY_KEYS = ["model", "lm_task", "bits"]
SUMMARY_VALUE = "acc_norm"
PAIR_KEYS = None  # one aggregate per setting, no per-sample pairs
METRICS = {"acc_norm": "acc_norm", "acc": "acc"}
TABLE_NOTE = (
    "zero-shot lm-eval accuracy with attention logits quantized (dynamic absmax) to b bits; 16 = unquantized; "
    "one value per model, task and bit width (the mean over the task's documents)"
)


@dataclass(frozen=True)
class Setting:
    sample_id: str
    bits: int
    lm_task: str


def make_samples(options, seed: int, limit: int | None = None) -> list[Setting]:
    return [
        Setting(hashlib.sha256(f"quantize|{b}|{t}|{options.granularity}".encode()).hexdigest()[:16], b, t)
        for t in options.lm_tasks
        for b in options.bits
    ]


def evaluate(batch: list[Setting], backend: Backend, config) -> list[dict]:
    options = config.options
    records = []
    for setting in batch:
        start = time.perf_counter()
        with quantized_logits(backend.model, setting.bits, options.granularity):
            [metrics] = evaluate_tasks(
                backend, [setting.lm_task], config.limit, options.ctx[0], options.lm_batch_size, options.include_path
            ).values()
        records.append(
            {
                "task": "quantize",
                "model": backend.info.name,
                "sample_id": setting.sample_id,
                "lm_task": setting.lm_task,
                "bits": setting.bits,
                "granularity": options.granularity,
                "acc": metrics.get("acc"),
                "acc_norm": metrics.get("acc_norm", metrics.get("acc")),
                "metrics": metrics,
                "limit": config.limit,
                "prompt_tokens": 0,
                "new_tokens": 0,
                "seconds": round(time.perf_counter() - start, 4),
            }
        )
    return records


def tables(records: pd.DataFrame, paper: bool = False) -> dict[str, pd.DataFrame]:
    out = {}
    for metric in ("acc_norm", "acc"):
        table = records.pivot_table(
            index=["model", "lm_task"], columns="bits", values=metric, aggfunc="mean", sort=False
        )
        out[f"figure8_{metric}"] = table[sorted(table.columns, reverse=True)].round(4)
    return out


def plots(records: pd.DataFrame, folder: Path) -> list[Path]:
    fig, ax = plt.subplots(figsize=(6, 4))
    for (model, task), group in records.groupby(["model", "lm_task"], sort=False):
        group = group.sort_values("bits")
        ax.plot(group["bits"], group["acc_norm"], marker="o", label=f"{model} · {task}")
    ax.set(xlabel="attention logit bits", ylabel="accuracy (acc_norm)", title="accuracy vs attention-logit bits")
    ax.invert_xaxis()
    ax.legend()
    fig.tight_layout()
    path = folder / "quantize_accuracy_vs_bits.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]
