"""The task contract: one object per task family holds everything the runner, the CLI and the reports need.

A task module builds its samples (pure, seeded), asks a backend for what it declares in `needs`, scores, and
returns `Record`s; it owns its tables and plots. A `Task` names its command (name, help line, options, run options)
and four groups of declared fields: what it runs (`Running`), how it reports (`Reporting`), how a sample is shown
(`Viewing`) and how its records are scored (`Scoring`). The runner, reports and viewer call only the fields declared
here: there is no optional attribute looked up by name.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields, replace
from typing import Any, Generic, TypeVar, get_type_hints

from diffeval.config import RunConfig, assemble, context_field, field_default, flag_name
from diffeval.errors import InputError
from diffeval.models.backend import check_backend, default_batch_size, engine_options
from diffeval.models.layer_kinds import skipped_note
from diffeval.models.spec import ModelSpec, parse_models
from diffeval.models.thinking import MARGIN
from diffeval.records import Record, kind_name, matches
from diffeval.tasks.blocks import Document, Listing

OptionsT = TypeVar("OptionsT")


@dataclass(frozen=True)
class RunContext(Generic[OptionsT]):
    """What a task's hooks see of a run: the task's own options and the few run settings a task reads, never the
    whole `RunConfig` (its engine, folder, Ray and dry-run settings are the runner's)."""

    task: str
    options: OptionsT  # the task's options dataclass
    lengths: list[int]  # the run's context lengths: the options' field declared with `config.context_option`
    seed: int  # seed of the sample content
    limit: int | None  # cap on samples per cell (--limit)
    chat_template: bool  # render prompts with each model's chat template
    max_new_tokens: int | None  # the answer budget (--max-new-tokens); None: the task's own default
    models: list[ModelSpec]  # the run's models, for a task that checks their configs before any work
    trust_remote_code: bool  # whether a checkpoint's own code may run (reading a model's config included)
    device: str  # where a task's own models run (a local judge)
    # a reasoning model's thinking phase (--thinking-budget; docs/reasoning.md): its tokens, None without one
    thinking_budget: int | None = None
    think_markers: tuple[str, str] | None = None  # --think-markers START,END; None: the model's own

    @classmethod
    def of(cls, config: RunConfig) -> RunContext:
        return cls(
            task=config.task,
            options=config.options,
            lengths=config.lengths,
            seed=config.seed,
            limit=config.limit,
            chat_template=config.chat_template,
            max_new_tokens=config.max_new_tokens,
            models=list(config.models),
            trust_remote_code=config.trust_remote_code,
            device=config.device,
            thinking_budget=config.thinking_budget,
            think_markers=(config.think_markers[0], config.think_markers[1]) if config.think_markers else None,
        )


@dataclass(frozen=True)
class ContextBudget:
    """What each of a run's context lengths must hold: the tokens a sample reserves for its answer, and the least
    prompt the task can build. A length below their sum is refused before any work."""

    lengths: list[int]  # the run's context lengths (its --ctx)
    answer: int  # tokens each sample reserves for its answer
    least_prompt: int  # the fewest prompt tokens a sample can be fitted into
    # tokens each sample reserves for a reasoning model's thinking: models.thinking.reserve(--thinking-budget), the
    # budget and a margin for the separator and answer prefix written after it; 0 without a thinking budget
    thinking: int = 0

    @property
    def generated(self) -> int:
        """Tokens each sample reserves for what the model generates: its thinking and its answer."""
        return self.thinking + self.answer

    def check(self) -> None:
        least = self.answer + self.least_prompt
        for ctx in self.lengths:
            if ctx < least:
                raise InputError(f"context {ctx} leaves no room for a prompt: use at least {least}")
            if ctx < self.generated + self.least_prompt:
                budget, most = self.thinking - MARGIN, ctx - least - MARGIN
                advice = f"use at most --thinking-budget {most}" if most >= 1 else "leave it out"
                raise InputError(
                    f"--thinking-budget {budget} leaves no room for the answer at context {ctx}: {advice}, "
                    "or a longer --ctx"
                )


@dataclass(frozen=True)
class Running:
    """What a task runs, in the order the runner calls it: check the budget and inputs, prepare, make samples, chunk
    them, prepare each chunk, evaluate it, and judge. Every hook but `make_samples` receives the run's `RunContext`
    (`context` below), never the whole RunConfig."""

    make_samples: Callable[..., list]  # (options, seed, limit, prepared) → samples, each with a unique .sample_id
    evaluate: Callable[..., Iterable[Record]]  # (batch, backend, context) → Records, yielded as each sample finishes
    needs: frozenset[str] = frozenset({"generate"})  # backend capabilities (models/backend.py CAPABILITIES)
    # (options) → the capabilities a run needs besides `needs` where its options decide them (longbench2's --mode
    # generates or scores choices); None: `needs` alone
    needs_of: Callable[[Any], frozenset[str]] | None = None
    # (context) → the `ContextBudget` its options need, checked when the config is built; None: the task fits any
    # length itself (a sample over its budget is recorded as such, or the length is a sequence, not a prompt)
    budget: Callable[[RunContext], ContextBudget] | None = None
    check_inputs: Callable[[RunContext], None] | None = None  # fail before any work on unreadable data
    prepare: Callable[..., Any] | None = None  # (context, {model: Tokenizer}) → handed to make_samples as `prepared`
    batches: Callable[..., list] | None = None  # (todo, context) → chunks; default: --batch-size samples per chunk
    # (chunk, backend, context) → what evaluate receives instead of the chunk; the runner builds the next chunk's
    # in a thread while the model works on this one
    prepare_batch: Callable[..., Any] | None = None
    # (samples, prompt tokenizer, context) → (prompt tokens, generated tokens at most), from the tokenizer alone, for
    # --dry-run, which also divides them by a rate for its time estimate; within 1 % is enough, and it should stay
    # cheap on long runs (needle fits one prompt per length, not every one). None where the task cannot know (lm-eval
    # builds its own prompts)
    sizing: Callable[..., tuple[int, int]] | None = None
    # (generation rows, context) → Records: a second stage, run once every model has generated and its engine is
    # freed, so a local judge has the device to itself. With it, `evaluate`'s records are generations: they wait in
    # generations.jsonl, and only judged records reach samples.jsonl.
    judge: Callable[..., Iterable[Record]] | None = None

    def needs_for(self, options: Any) -> frozenset[str]:
        """The backend capabilities a run with these task options needs: `needs`, and what `needs_of` adds."""
        return self.needs | (self.needs_of(options) if self.needs_of is not None else frozenset())


@dataclass(frozen=True)
class Reporting:
    """How a task reports: its tables and plots, their titles and note, and what summary.csv, the paired statistics
    and the gates read from its records."""

    # (records DataFrame, options, paper: bool) → {key: DataFrame}; options: the run's task options as run.json
    # stored them (`stored_options`), so a report reads the run's own settings (needle's base lengths)
    tables: Callable[..., dict]
    titles: dict[str, str]  # table key (before any ":model" suffix) → title
    note: str  # how the metrics are defined, printed above the tables
    summary_keys: list[str]  # cells of summary.csv
    pair_keys: list[str] | None  # cells of the paired DIFF − baseline statistics; None: no sample-level pairs
    metrics: dict[str, str]  # gate/compare metric name → record column (mean over a model's scored samples)
    summary_value: str = "score"  # the record column summary.csv and the paired statistics describe
    # record columns that identify a cluster of dependent samples (an ICL test query under several orders and
    # draws); the paired statistics and `compare` resample whole clusters. None: every sample is independent.
    cluster_keys: list[str] | None = None
    # decimals of numbers that are not the default `blocks.DECIMALS`, by table column or table key (before any
    # ":model"), in every table output and the viewer: e.g. {"table1": 1} for percentages, {"degenerate": 0} for a
    # count column that paper rows turned into floats. The paired table follows `summary_value`'s entry.
    decimals: dict[str, int] = field(default_factory=dict)
    plots: Callable[..., list] | None = None  # (records, folder) → written PNG paths
    # (records, [(DIFF model, baseline)], options) → {key: DataFrame}: paired tables of the task's own, beside the
    # report's paired table of `summary_value` (nll's per-bucket differences); the pairs are the report's
    pair_tables: Callable[..., dict] | None = None
    # (records, options) → one line for `report --paper`: which of the paper's settings the run has and which it lacks
    # (`paper.coverage`); None: the paper reports no numbers for the task
    paper_coverage: Callable[..., str] | None = None
    # a mean score at or below which a model is at the floor: a paired cell where both models are reads no difference
    # (its difference, interval and p-value are left empty and its `reading` says so). None: no floor
    floor: float | None = None


@dataclass(frozen=True)
class Viewing:
    """How `diffeval view` shows one sample of the task."""

    # (context, {model: record} of one sample, tokenizer_for(model), full_text) → a `blocks.Document`: what `diffeval
    # view` shows of the sample below its records (a needle prompt's text, an ICL order's labels, a hallucination
    # document), from the records and what the run's context rebuilds (samples are pure and seeded). full_text: True
    # whole texts, False elided, None whole when short. None: the viewer shows the records' fields alone.
    sample_view: Callable[..., Document] | None = None
    # the record columns the viewer's sample list and comparison show (answer, expected, outcome)
    listing: Listing = Listing()


@dataclass(frozen=True)
class Scoring:
    """How a task's records are read and scored again."""

    # the record fields this task's readers (tables, rescoring, plots, pairing, gates, views) need, with their JSON
    # kinds (records.py: `str`, `float | None`, `list[str]`, `MayBeAbsent(int)`, ...): `report`, `compare` and `view`
    # count a row that lacks one or holds another type as damaged, and skip it. Besides model and sample_id.
    record_schema: dict[str, Any] = field(default_factory=dict)
    # named scoring rules (name → what it counts; the first is the run's) and (records, rule) → the records rescored
    # from their stored outputs, for `report --scoring`; None: the task has one way to score
    rules: dict[str, str] | None = None
    rescore: Callable[..., Any] | None = None


@dataclass(frozen=True)
class Task:
    name: str
    help: str  # one line for `diffeval run NAME --help`
    options: type  # dataclass of `config.option` fields, with validate(); its fields become CLI options
    running: Running
    reporting: Reporting
    viewing: Viewing = Viewing()
    scoring: Scoring = Scoring()
    run_options: tuple[str, ...] = ()  # RunConfig options this task's command shows besides the common ones

    def stored_options(self, stored: dict[str, Any], source: str = "run.json") -> Any:
        """The task's options as a run.json (`source`) stored them (`config.options`), for the task's readers: an
        option an older folder lacks takes today's default, one this version no longer has is dropped. Each value
        must have its field's type (one line naming the option, else), but is not validated: a report reads a
        finished run, whose data paths and judges need not exist where it is read."""
        kinds = get_type_hints(self.options)
        values = {f.name: stored.get(f.name, field_default(f)) for f in fields(self.options)}
        for name, value in values.items():
            if not matches(value, kinds[name]):
                raise InputError(
                    f"{source} stores option {name} as {json.dumps(value)}, not {kind_name(kinds[name])}: repair it "
                    "(the value the run was started with), or run the task again into a new --out"
                )
        return self.options(**values)


def with_cells(table, rows, columns, common: dict | None = None):
    """Mark which records each cell of a table summarises, for `diffeval view` to list a clicked cell's samples.

    `rows` and `columns` give one filter per row and column (record column → value, or → list of values; the key
    `pair`: [DIFF model, baseline] → the samples both scored, as the paired statistics join them); a cell's filter is
    `common`, its row's and its column's together. None marks a row or column no records make (the paper's
    own numbers), whose cells list nothing; rows past those given (the paper's rows, appended last) are such rows.
    Set last: pandas keeps `attrs` through most operations, not all.
    """
    rows, columns = list(rows), list(columns)
    rows += [None] * (len(table.index) - len(rows))
    if len(rows) != len(table.index) or len(columns) != len(table.columns):
        raise ValueError(f"cell filters for {len(rows)}×{len(columns)}, table is {table.shape}")
    table.attrs["cells"] = {"rows": rows, "columns": columns, "common": common or {}}
    return table


def with_rows(table, rows):
    """`table` with `rows` (the paper's, labelled like the table's rows) appended, keeping the row labels' names:
    a concatenation alone drops them, and the report's header over the model column with them."""
    import pandas as pd

    joined = pd.concat([table, rows])
    joined.index.names = table.index.names
    return joined


def skipped_layers_by_model(records) -> dict[str, dict[str, str]]:
    """{model: {decoder index: kind}} of the layers an attention instrument skipped, from the records that list them
    (`models.layer_kinds.record_fields`: a hybrid's); empty where every model's layers all attend."""
    if "skipped_layers" not in records:
        return {}
    found: dict[str, dict[str, str]] = {}
    for model, skipped in zip(records["model"], records["skipped_layers"]):
        if isinstance(skipped, dict) and skipped:
            found.setdefault(model, skipped)
    return found


def with_skipped_layers(tables: dict, records, subject: str | None = None) -> dict:
    """Each table's note names the layers its models' attention instruments skipped, and why (their kind), after
    `subject` (what was skipped, where a table also holds values of every layer); a table whose models' layers all
    attend is left as it was."""
    note = skipped_note(skipped_layers_by_model(records))
    if note:
        note = f"{subject}: {note}" if subject else note
        for table in tables.values():
            table.attrs["note"] = "; ".join(filter(None, (table.attrs.get("note"), note)))
    return tables


def registry(*tasks: Task) -> dict[str, Task]:
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise ValueError(f"task names repeat: {names}")
    for task in tasks:
        context_field(task.options)  # every task declares its context lengths
    return {t.name: t for t in tasks}


def check_run_options(tasks: dict[str, Task], task: Task, config: RunConfig) -> None:
    """A RunConfig option only some tasks take (declared `cli=False`, listed in their `run_options`) is refused on
    any other task unless it keeps its default: the task would ignore it (a preset or suite can set it)."""
    for f in fields(RunConfig):
        if f.metadata.get("cli", True) or f.name in task.run_options:
            continue
        if getattr(config, f.name) != field_default(f):
            takers = ", ".join(t.name for t in tasks.values() if f.name in t.run_options)
            raise InputError(f"{flag_name(f)} does not apply to {task.name}, only to {takers}: leave it out")


def configure(tasks: dict[str, Task], name: str, yaml_values: dict[str, Any], flags: dict[str, Any]) -> RunConfig:
    """Merge preset values and command-line flags (flags win) into a validated RunConfig for task `name`."""
    if name not in tasks:
        near = difflib.get_close_matches(str(name), list(tasks), n=1, cutoff=0.8)
        hint = f"did you mean {near[0]}? Or use" if near else "use"
        raise InputError(f"unknown task {name!r}: {hint} one of {', '.join(tasks)}")
    task = tasks[name]
    values = {**yaml_values, **{k: v for k, v in flags.items() if v is not None}}
    config = assemble(name, task.options, parse_models(values.pop("models", None)), values, engine_options())
    check_run_options(tasks, task, config)
    if task.running.budget is not None:
        task.running.budget(RunContext.of(config)).check()
    # a thinking phase stops at the model's end-marker ids: an engine that cannot is refused before any work
    thinking = {"thinking"} if config.thinking_budget is not None else set()
    check_backend(name, task.running.needs_for(config.options) | thinking, config.backend)
    if config.batch_size is None:
        config = replace(config, batch_size=default_batch_size(config.backend))
    return config
