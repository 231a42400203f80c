"""The dry run: a run's size in tokens per model, and the time its samples not yet done would take.

The rate behind a time estimate is given (--tokens-per-s), measured here (--calibrate: one sample per context length),
or read from the timed records of earlier runs of the same checkpoint on this machine. Only tokenizers load unless
--calibrate asks for the models; nothing is written.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from rich.console import Group
from rich.table import Table
from rich.text import Text

from diffeval.config import RunConfig
from diffeval.errors import InputError
from diffeval.machine import machine_record, same_machine
from diffeval.models.backend import EngineSettings, make_backend, open_tokenizer
from diffeval.models.spec import ModelSpec, model_path
from diffeval.models.tokenizer import PromptTokenizer
from diffeval.results import RUN_FILE, RunFolder
from diffeval.tasks.base import RunContext, Task

# A recorded rate times only samples whose prompts are within this factor of its records' size: the rate falls as
# prompts grow (attention is quadratic in the prompt, and each generated token attends to all of it), so a rate
# recorded at 1K says little about 16K
SIZE_TOLERANCE = 1.25
HOW_TO_TIME = "give --calibrate or --tokens-per-s N, or run a few samples first (--limit 2) and dry-run again"


@dataclass(frozen=True)
class Length:
    """A model's samples at one context length, as a dry run sizes them."""

    ctx: int | None  # None for a task whose samples have no length of their own
    first: Any  # the sample --calibrate times
    samples: int
    totals: tuple[int, int]  # prompt tokens and generated tokens at most, of every sample
    remaining: tuple[int, int]  # the same, of the samples not done

    @property
    def prompt_size(self) -> float:
        return self.totals[0] / self.samples


def dry_run(config: RunConfig, task: Task, folder: RunFolder, samples: list) -> Group:
    """Per model: samples, how many are done, prompt tokens in total, generated tokens at most, and the time the
    samples not yet done would take; below the table, where each time estimate comes from. `samples`: the run's
    (`runner.make_samples`). Only tokenizers load, unless --calibrate loads each model to time one sample per
    length."""
    done = folder.read_records().done_keys()
    settings = EngineSettings.from_config(config)
    loads = "each model loaded to time one sample per length" if config.calibrate else "no model loaded"
    table = Table(title=f"{task.name}: dry run into {folder.path} ({loads})")
    for column in ("model", "samples", "done", "prompt tokens", "generated tokens (at most)", "time (estimate)"):
        table.add_column(column, justify="left" if column == "model" else "right")
    notes: dict[str, list[str]] = {}  # note → models it applies to
    for spec in config.models:
        todo = {s.sample_id for s in samples if (spec.name, s.sample_id) not in done}
        sizes: tuple[str, ...] = ("n/a", "n/a")
        estimate = "n/a"
        if task.running.sizing is None:
            note = "no time estimate: this task's prompts are built by lm-eval, so their size is known only as it runs"
        else:
            tokenizer = PromptTokenizer(open_tokenizer(spec, settings, config.backend), spec.name)
            lengths = _lengths(task, samples, todo, tokenizer, config)
            sizes = tuple(f"{sum(length.totals[i] for length in lengths):,}" for i in (0, 1))
            seconds, note = time_estimate(config, task, spec, lengths, settings)
            estimate = "n/a" if seconds is None else _duration(seconds)
        notes.setdefault(note, []).append(spec.name)
        table.add_row(spec.name, f"{len(samples):,}", f"{len(samples) - len(todo):,}", *sizes, estimate)
    every = len(config.models)
    lines = [note if len(names) == every else f"{', '.join(names)}: {note}" for note, names in notes.items()]
    return Group(table, *(Text(line) for line in lines))


def _lengths(task: Task, samples: list, todo: set[str], tokenizer, config: RunConfig) -> list[Length]:
    """The samples sized per context length (each length runs at its own rate)."""
    sizing = task.running.sizing
    assert sizing is not None, "dry_run sizes only tasks with a sizing"
    groups: dict[int | None, list] = {}
    for sample in samples:
        groups.setdefault(getattr(sample, "ctx", None), []).append(sample)
    lengths, context = [], RunContext.of(config)
    for ctx, group in groups.items():
        totals = sizing(group, tokenizer, context)
        left = [s for s in group if s.sample_id in todo]
        remaining = totals if len(left) == len(group) else sizing(left, tokenizer, context) if left else (0, 0)
        lengths.append(Length(ctx, group[0], len(group), totals, remaining))
    return lengths


def time_estimate(
    config: RunConfig, task: Task, spec: ModelSpec, lengths: list[Length], settings: EngineSettings
) -> tuple[float | None, str]:
    """Seconds the samples not done would take (model loading aside) and where the rate comes from; (None, why)
    without a rate. Each length is timed at its own rate: --tokens-per-s; --calibrate's measurement; or the rate
    recorded at about that prompt size on this machine (`recorded_rates`). Ray workers multiply the measured rates."""
    if config.tokens_per_s is not None:
        tokens = sum(sum(length.remaining) for length in lengths)
        return tokens / config.tokens_per_s, f"time estimate from --tokens-per-s {config.tokens_per_s:,g}"
    left = [length for length in lengths if sum(length.remaining)]
    if not left:
        return 0.0, "time estimate: every sample is done"
    workers = (config.workers or 1) if config.ray else 1
    per_worker = f", × {workers} Ray workers" if workers > 1 else ""
    if config.calibrate:
        calibrated = calibrated_rates(config, task, spec, left, settings)
        seconds = sum(sum(length.remaining) / (calibrated[length.ctx] * workers) for length in left)
        measured = "; ".join(f"{_label(length.ctx, left)}{calibrated[length.ctx]:,.0f} tokens/s" for length in left)
        return seconds, f"time estimate from --calibrate: {measured} (one sample per length, timed here{per_worker})"
    machine = machine_record(config.backend, settings.threads)
    rates, why = recorded_rates(config, spec, left, machine)
    if rates is None:
        return None, f"no time estimate: {why}; {HOW_TO_TIME}"
    seconds = sum(sum(length.remaining) / (rates[length.ctx].tokens_per_s * workers) for length in left)
    sources = "; ".join(f"{_label(length.ctx, left)}{rates[length.ctx].source}{per_worker}" for length in left)
    return seconds, f"time estimate from runs on this machine ({_describe(machine)}): {sources}"


def _label(ctx: int | None, lengths: list[Length]) -> str:
    return f"ctx {ctx:,}: " if len(lengths) > 1 and ctx is not None else ""


def _describe(machine: dict[str, Any]) -> str:
    gpus = ", ".join(machine["gpus"]) if machine["gpus"] else "no GPU" if machine["gpus"] == [] else "GPUs unknown"
    threads = _count(machine["threads"], "thread")
    return f"{machine['cpu']}, {machine['cores']} cores, {gpus}, {machine['engine']}, {threads}"


def _count(number: int | None, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def calibrated_rates(
    config: RunConfig, task: Task, spec: ModelSpec, lengths: list[Length], settings: EngineSettings
) -> dict[int | None, float]:
    """Per length, tokens ÷ seconds of its first sample evaluated as the run evaluates it, the model loaded once. Its
    prompt is built before the clock starts, as a run builds the next chunk's while the model works."""
    backend = make_backend(spec, settings, config.backend)
    try:
        rates = {}
        running, context = task.running, RunContext.of(config)
        for length in lengths:
            chunk = [length.first]
            prepared = running.prepare_batch(chunk, backend, context) if running.prepare_batch is not None else chunk
            start = time.perf_counter()
            records = list(running.evaluate(prepared, backend, context))
            seconds = time.perf_counter() - start
            rates[length.ctx] = sum(r.prompt_tokens + r.new_tokens for r in records) / max(seconds, 1e-9)
        return rates
    finally:
        backend.close()


@dataclass(frozen=True)
class Throughput:
    tokens_per_s: float  # prompt + generated tokens per second of one model, as the progress bar counts them
    source: str  # where the rate comes from, as the dry run states it


@dataclass(frozen=True)
class Recorded:
    """A run folder's records of one checkpoint on one engine."""

    folder: Path
    task: str
    on_this_machine: bool  # its machine record matches this one, and no other machine wrote records there
    rows: list[tuple[int, int, float]]  # per record: prompt tokens, prompt + generated tokens, seconds


def recorded_rates(
    config: RunConfig, spec: ModelSpec, lengths: list[Length], machine: dict[str, Any]
) -> tuple[dict[int | None, Throughput] | None, str]:
    """Per length, the rate (tokens ÷ seconds) of the records of this checkpoint on this engine and this machine
    (same CPU model and cores, GPUs, engine and threads) whose prompts are within SIZE_TOLERANCE of the length's
    average prompt, in the run folders beside this run's or one level below (a suite's); only the same task's
    where it has such records. (None, why) when a length has none."""
    root = config.out_dir().parent
    found = [
        recorded
        for run_file in sorted({*root.glob(f"*/{RUN_FILE}"), *root.glob(f"*/*/{RUN_FILE}")})
        if (recorded := _recorded(RunFolder(run_file.parent), config.backend, spec.path, machine)) is not None
    ]
    here = [recorded for recorded in found if recorded.on_this_machine]
    if not found:
        return None, f"no run folder beside {config.out_dir()} records the speed of this checkpoint on {config.backend}"
    if not here:
        return None, (
            f"the {len(found)} run folder(s) beside {config.out_dir()} that time this checkpoint on {config.backend} "
            f"ran on other hardware or threads, or before run.json recorded the machine (this machine: "
            f"{_describe(machine)})"
        )
    rates = {}
    for length in lengths:
        near = [
            (recorded, row)
            for recorded in here
            for row in recorded.rows
            if max(row[0], length.prompt_size) <= SIZE_TOLERANCE * max(min(row[0], length.prompt_size), 1)
        ]
        near = [item for item in near if item[0].task == config.task] or near
        if not near:
            return None, (
                f"runs on this machine time this checkpoint at prompts of {_span(here)} tokens, none within "
                f"{SIZE_TOLERANCE}x of this run's {length.prompt_size:,.0f} (the rate falls as prompts grow)"
            )
        tokens, seconds = sum(row[1] for _, row in near), sum(row[2] for _, row in near)
        folders = ", ".join(str(path) for path in sorted({recorded.folder for recorded, _ in near}))
        size = sum(row[0] for _, row in near) / len(near)
        rates[length.ctx] = Throughput(
            tokens / seconds,
            f"{tokens / seconds:,.0f} tokens/s recorded in {folders} ({len(near):,} records of {size:,.0f} prompt "
            "tokens on average)",
        )
    return rates, ""


def _span(found: list[Recorded]) -> str:
    sizes = [row[0] for recorded in found for row in recorded.rows]
    low, high = min(sizes), max(sizes)
    return f"{low:,}" if low == high else f"{low:,}–{high:,}"


def _recorded(folder: RunFolder, backend: str, checkpoint: str, machine: dict[str, Any]) -> Recorded | None:
    """A run folder's timed records of this checkpoint on this engine; None when it holds none (or is damaged: a dry
    run does not stop at another run's folder)."""
    try:
        run = folder.read_run()
    except InputError:
        return None
    if run is None:  # gone since the glob found its run.json
        return None
    stored = run["config"]
    if stored.get("backend", "hf") != backend:  # folders from before backends existed ran on hf
        return None
    names = {
        m.get("name")
        for m in stored.get("models", [])
        if isinstance(m, dict) and _same_checkpoint(str(m.get("spec")), checkpoint)
    }
    rows = []
    for row in folder.read_records().rows if names else []:
        seconds, prompt, new = row.get("seconds"), row.get("prompt_tokens"), row.get("new_tokens")
        if (
            row["model"] in names
            and _number(seconds)
            and _number(prompt)
            and _number(new)
            and seconds > 0
            and prompt + new > 0
        ):
            rows.append((int(prompt), int(prompt) + int(new), float(seconds)))
    if not rows:
        return None
    alone = same_machine(run.get("machine"), machine) and not run.get("earlier_machines")
    return Recorded(folder.path, stored["task"], alone, rows)


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _same_checkpoint(spec: str, path: str) -> bool:
    """A stored model spec names this checkpoint: the same hub id, or the same folder."""
    stored = model_path(spec)
    if stored == path:
        return True
    first, second = Path(stored).expanduser(), Path(path).expanduser()
    return first.is_dir() and second.is_dir() and first.resolve() == second.resolve()


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes < 90 else f"{minutes // 60:.0f} h {minutes % 60:02.0f} min"
