"""A task and an engine from outside diffeval, registered only through entry points (see test_registry.py).

`echo` is a minimal task: each sample asks the model to continue a short numbered text, and scores whether the output
is non-empty. Its sample view is built from diffeval's generic blocks alone: `diffeval view` shows it with no code
that names the task. `TextOnlyBackend` is a deterministic test double of an engine: the real transformers backend with
every capability but `generate` withheld, to show capability checks and the factory without a second real engine.
`SuffixBackend` is an engine with an option of its own (`--output-suffix`, declared in `SuffixOptions`): the module
and its entry point are all it takes for the option to reach the CLI, presets, run.json and the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd

from diffeval.config import context_option, option
from diffeval.errors import InputError
from diffeval.models.backend import Engine, EngineSettings, Generation
from diffeval.models.engines.hf import HFBackend
from diffeval.models.engines.hf_options import HFOptions
from diffeval.models.spec import ModelSpec
from diffeval.records import Record, sample_id
from diffeval.tasks.base import ContextBudget, Listing, Reporting, RunContext, Running, Task, Viewing
from diffeval.tasks.blocks import Bar, Bars, Document, Field, Fields, Mark, Output, Outputs, Text


@dataclass(frozen=True)
class EchoOptions:
    ctx: list[int] = context_option([256], help="context length")
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


NEW_TOKENS = 4  # each sample's answer
LEAST_PROMPT = 16  # the prefix and its number, with room to spare


def budget(context: RunContext[EchoOptions]) -> ContextBudget:
    """Each --ctx length holds the prompt and the answer: a plugin declares its budget as a built-in task does."""
    return ContextBudget(context.lengths, NEW_TOKENS, LEAST_PROMPT)


def evaluate(batch, backend, context: RunContext[EchoOptions]):
    prompts = [backend.encode(s.text).ids for s in batch]
    outputs = backend.generate(prompts, NEW_TOKENS, [])
    return [
        Record(
            "echo",
            backend.info.name,
            s.sample_id,
            len(p),
            out.new_tokens,
            out.seconds,
            {
                "index": s.index,
                "output": out.text,
                "nonempty": bool(out.text.strip()),
                "score": float(bool(out.text.strip())),
            },
        )
        for s, p, out in zip(batch, prompts, outputs)
    ]


def sample_view(context: RunContext[EchoOptions], records, tokenizer_for, full_text):
    """The prompt rebuilt from the run's --prefix, its prefix marked; each model's output with its outcome; each
    model's generated tokens as bars."""
    first = next(iter(records.values()))
    prefix = context.options.prefix
    prompt = Text([Mark([prefix], kind="prefix", note="the run's --prefix"), f" {first['index']}:"], title="Prompt")
    outputs = Outputs(
        [
            Output(model, r["output"], r["nonempty"], "non-empty" if r["nonempty"] else "empty", [
                Field("new tokens", r["new_tokens"]), Field("seconds", r["seconds"]),
            ])
            for model, r in records.items()
        ],
        title="Outputs",
    )  # fmt: skip
    tokens = [Bar(model, r["new_tokens"], colour=i) for i, (model, r) in enumerate(records.items())]
    setting = Fields([Field("prefix", prefix), Field("sample", first["index"])], title="Setting")
    return Document([setting, prompt, outputs, Bars(tokens, decimals=0, title="new tokens per model")])


def tables(records: pd.DataFrame, options: EchoOptions, paper: bool = False) -> dict[str, pd.DataFrame]:
    """The share of non-empty outputs per model, titled with the run's own --prefix (read from `options`)."""
    table = records.pivot_table(index="model", values="score", aggfunc="mean")
    table.columns = [f"{options.prefix}: non-empty"]
    return {"echo": table}


TASK = Task(
    name="echo",
    help="Continue a numbered text (a probe task from a plugin).",
    options=EchoOptions,
    running=Running(make_samples=make_samples, evaluate=evaluate, budget=budget),
    reporting=Reporting(
        tables=tables,
        titles={"echo": "Echo probe: share of non-empty outputs"},
        note="score = 1 when the output is not empty",
        summary_keys=["model"],
        pair_keys=None,
        metrics={"nonempty": "score"},
    ),
    viewing=Viewing(sample_view=sample_view, listing=Listing(answer="output", expected=None, outcome="nonempty")),
)


class TextOnlyBackend(HFBackend):
    name = "textonly"


ENGINE = Engine("textonly", "diffeval_probe_plugin:TextOnlyBackend", frozenset({"generate"}), options=HFOptions)


@dataclass(frozen=True)
class SuffixOptions(HFOptions):  # an engine built on hf keeps hf's options (--threads) and adds its own
    output_suffix: str = option("", help="suffix engine: text appended to every generated output [default: none]")


class SuffixBackend(HFBackend):
    name = "suffix"

    @classmethod
    def load(cls, spec: ModelSpec, settings: EngineSettings) -> SuffixBackend:
        backend = super().load(spec, settings)
        backend.suffix = settings.engine_options(SuffixOptions).output_suffix
        return backend

    def generate(self, prompts: list[list[int]], max_new_tokens: int, stop: list[str]) -> list[Generation]:
        return [replace(out, text=out.text + self.suffix) for out in super().generate(prompts, max_new_tokens, stop)]


SUFFIX_ENGINE = Engine("suffix", "diffeval_probe_plugin:SuffixBackend", frozenset({"generate"}), options=SuffixOptions)
