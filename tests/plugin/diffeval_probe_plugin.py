"""A task and an engine from outside diffeval, registered only through entry points (see test_registry.py).

`echo` is a minimal task: each sample asks the model to continue a short numbered text, and scores whether the output
is non-empty. `TextOnlyBackend` is a deterministic test double of an engine: the real transformers backend with every
capability but `generate` withheld, to show capability checks and the factory without a second real engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from diffeval.config import option, parse_ctx
from diffeval.errors import InputError
from diffeval.models.backend import Engine
from diffeval.models.hf import HFBackend
from diffeval.records import Record, sample_id
from diffeval.tasks.base import Task


@dataclass(frozen=True)
class EchoOptions:
    ctx: list[int] = option([256], help="context length", parse=parse_ctx)
    count: int = option(3, help="samples", identity=False)
    prefix: str = option("Number", help="the text each sample starts with")

    def validate(self) -> None:
        if self.count < 1:
            raise InputError("--count must be at least 1")


@dataclass(frozen=True)
class EchoSample:
    sample_id: str
    index: int
    text: str


def make_samples(options, seed, limit, prepared):
    count = min(options.count, limit) if limit else options.count
    return [EchoSample(sample_id(f"echo|{seed}|{i}"), i, f"{options.prefix} {i}:") for i in range(count)]


def evaluate(batch, backend, config):
    prompts = [backend.encode(s.text).ids for s in batch]
    outputs = backend.generate(prompts, 4, [])
    return [
        Record(
            "echo",
            backend.info.name,
            s.sample_id,
            len(p),
            out.new_tokens,
            out.seconds,
            {"index": s.index, "output": out.text, "score": float(bool(out.text.strip()))},
        )
        for s, p, out in zip(batch, prompts, outputs)
    ]


def tables(records: pd.DataFrame, paper: bool = False) -> dict[str, pd.DataFrame]:
    return {"echo": records.pivot_table(index="model", values="score", aggfunc="mean")}


TASK = Task(
    name="echo",
    help="Continue a numbered text (a probe task from a plugin).",
    options=EchoOptions,
    make_samples=make_samples,
    evaluate=evaluate,
    tables=tables,
    titles={"echo": "Echo probe: share of non-empty outputs"},
    note="score = 1 when the output is not empty",
    summary_keys=["model"],
    pair_keys=None,
    metrics={"nonempty": "score"},
)


class TextOnlyBackend(HFBackend):
    name = "textonly"
    capabilities = frozenset({"generate"})


ENGINE = Engine("textonly", "diffeval_probe_plugin:TextOnlyBackend", frozenset({"generate"}))
