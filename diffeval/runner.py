"""The loop: for each model, for each sample not yet done → backend → score → record (flushed per sample).

One engine at a time: each model is loaded, used and closed (its memory freed) before the next one loads. A task
judged after generation (hallucination with a local judge) writes generations first and judges them once every
model is closed. The runner holds the run folder's lock for as long as it writes, so it is the folder's only writer.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from diffeval.config import RunConfig
from diffeval.errors import InputError
from diffeval.lock import FolderLock
from diffeval.machine import machine_record, same_machine
from diffeval.models.backend import EngineSettings, check_model, make_backend, open_tokenizer
from diffeval.models.loading import check_checkpoint, describe, library_versions
from diffeval.models.spec import ModelSpec, model_path
from diffeval.models.tokenizer import PromptTokenizer
from diffeval.results import RUN_FILE, RunFolder
from diffeval.tasks import TASKS
from diffeval.tasks.base import RunContext, Task


def check_models(config: RunConfig) -> dict[str, dict]:
    """Fail fast, before any work: every model's checkpoint is whole, the engine can run it, and every context fits
    its positions."""
    infos = {}
    settings = EngineSettings.from_config(config)
    for spec in config.models:
        info = describe(spec, check_checkpoint(spec, config.trust_remote_code, config.chat_template), kind=spec.kind)
        check_model(info, settings, config.backend)
        longest = max(config.lengths)
        if info.max_positions and longest > info.max_positions and not config.allow_overlength:
            raise InputError(
                f"context {longest} exceeds {spec.name}'s max_position_embeddings {info.max_positions}: "
                "use a shorter --ctx, or --allow-overlength to extrapolate"
            )
        infos[spec.name] = info.to_dict()
    return infos


def _prepared_chunks(task: Task, chunks: list, backend, context: RunContext):
    """Yields what `evaluate` takes for each chunk. Where the task prepares chunks (needle prompts), the next chunk's
    is built in a thread while the model works on this one (tokenizers release the GIL), hiding much of that time."""
    if task.running.prepare_batch is None:
        yield from chunks
        return
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(task.running.prepare_batch, chunks[0], backend, context) if chunks else None
        for i in range(len(chunks)):
            prepared = pending.result()
            if i + 1 < len(chunks):
                pending = pool.submit(task.running.prepare_batch, chunks[i + 1], backend, context)
            yield prepared


def make_samples(task: Task, config: RunConfig) -> list:
    """The run's samples: a pure function of the config (and, for `prepare`, of the models' tokenizers)."""
    prepared = None
    if task.running.prepare is not None:
        settings = EngineSettings.from_config(config)
        tokenizers = {spec.name: open_tokenizer(spec, settings, config.backend) for spec in config.models}
        prepared = task.running.prepare(RunContext.of(config), tokenizers)
    return task.running.make_samples(config.options, config.seed, config.limit, prepared)


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


def dry_run(config: RunConfig, task: Task, folder: RunFolder) -> Group:
    """Per model: samples, how many are done, prompt tokens in total, generated tokens at most, and the time the
    samples not yet done would take; below the table, where each time estimate comes from. Only tokenizers load,
    unless --calibrate loads each model to time one sample per length."""
    samples = make_samples(task, config)
    done = folder.read_records().done_keys()
    settings = EngineSettings.from_config(config)
    loads = "each model loaded to time one sample per length" if config.calibrate else "no model loaded"
    table = Table(title=f"{task.name}: dry run into {folder.path} ({loads})")
    for column in ("model", "samples", "done", "prompt tokens", "generated tokens (at most)", "time (estimate)"):
        table.add_column(column, justify="left" if column == "model" else "right")
    notes = {}  # note → models it applies to
    for spec in config.models:
        todo = {s.sample_id for s in samples if (spec.name, s.sample_id) not in done}
        sizes, estimate = ("n/a", "n/a"), "n/a"
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
    groups: dict[int | None, list] = {}
    for sample in samples:
        groups.setdefault(getattr(sample, "ctx", None), []).append(sample)
    lengths, context = [], RunContext.of(config)
    for ctx, group in groups.items():
        sizing = task.running.sizing
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
        rates = calibrated_rates(config, task, spec, left, settings)
        seconds = sum(sum(length.remaining) / (rates[length.ctx] * workers) for length in left)
        measured = "; ".join(f"{_label(length.ctx, left)}{rates[length.ctx]:,.0f} tokens/s" for length in left)
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
        timed = all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in (seconds, prompt, new))
        if row["model"] in names and timed and seconds > 0 and prompt + new > 0:
            rows.append((int(prompt), int(prompt) + int(new), float(seconds)))
    if not rows:
        return None
    alone = same_machine(run.get("machine"), machine) and not run.get("earlier_machines")
    return Recorded(folder.path, stored["task"], alone, rows)


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


def check(config: RunConfig) -> dict[str, dict]:
    """The check stage of one run, before any work: every model (config, weights, tokenizer, head layout, engine,
    positions), then the task's inputs (data, judges and their checkpoints). Returns the models' infos."""
    infos = check_models(config)
    task = TASKS[config.task]
    if task.running.check_inputs is not None:
        task.running.check_inputs(RunContext.of(config))
    return infos


def run(config: RunConfig, console: Console | None = None, infos: dict[str, dict] | None = None) -> RunFolder | None:
    """Evaluate, or with --dry-run print the run's size and return None. `infos`: what `check(config)` returned
    (a suite checks all its runs before the first starts); without it, the check stage runs here."""
    console = console or Console(stderr=True)
    task = TASKS[config.task]
    infos = check(config) if infos is None else infos
    folder = RunFolder(config.out_dir())
    folder.check_identity(config)  # before the lock: a refused run leaves the folder as it was
    if config.dry_run:
        Console().print(dry_run(config, task, folder), soft_wrap=True)
        return None
    cluster = nullcontext()
    if config.ray:  # an unreachable cluster or a missing install is refused before the folder is touched
        from diffeval.scale import ray_session

        cluster = ray_session(config.ray)
    with cluster, FolderLock(folder.path, config.break_lock):
        machine = machine_record(config.backend, EngineSettings.from_config(config).threads)
        folder.prepare(config, {"versions": library_versions(), "models": infos, "machine": machine})
        samples = make_samples(task, config)
        records = folder.read_records()
        if records.duplicates:
            console.print(f"note: {records.duplicates} duplicate record(s) in {folder.samples_path}; the first is kept")
        done = records.done_keys()
        total = len(samples) * len(config.models)
        finished = sum((spec.name, s.sample_id) in done for spec in config.models for s in samples)
        if finished:
            console.print(f"resuming: {finished:,} of {total:,} samples already done", highlight=False, soft_wrap=True)
        if task.running.judge is None:
            _evaluate_all(task, config, samples, done, folder, folder.samples_path, console)
        else:
            generated = folder.read_records(folder.generations_path).done_keys()
            _evaluate_all(task, config, samples, done | generated, folder, folder.generations_path, console)
            _judge_all(task, config, samples, done, folder, console)
    return folder


def chunks_of(task: Task, todo: list, config: RunConfig) -> list[list]:
    """A model's remaining samples in the chunks one backend call takes (the task's own, or --batch-size)."""
    if task.running.batches is not None:
        return task.running.batches(todo, RunContext.of(config))
    return [todo[i : i + config.batch_size] for i in range(0, len(todo), config.batch_size)]


class MeanTimeRemainingColumn(TimeRemainingColumn):
    """The ETA from the first finished sample on: the mean time per sample so far × the samples left. rich's own
    estimate waits for two updates inside its speed window, so slow samples (long contexts) showed `-:--:--`."""

    def render(self, task) -> Text:  # a rich.progress.Task
        if task.total is None or task.finished or not task.completed or not task.elapsed:
            return super().render(task)
        minutes, seconds = divmod(int(task.elapsed / task.completed * (task.total - task.completed)), 60)
        hours, minutes = divmod(minutes, 60)
        return Text(f"{hours:d}:{minutes:02d}:{seconds:02d}", style="progress.remaining")


def _progress(console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        MeanTimeRemainingColumn(),
        console=console,
        refresh_per_second=2,  # the bar redraws in a thread; rarer redraws leave the model more of the GIL
    )


def _evaluate_all(task: Task, config: RunConfig, samples: list, done: set, folder: RunFolder, path, console) -> None:
    """Every model's remaining samples, one model at a time; records appended to `path` as they come. Each model's
    bar starts when its engine has loaded, so its elapsed time, ETA and tokens/s are that model's alone."""
    progress = _progress(console)
    todo = {spec.name: [s for s in samples if (spec.name, s.sample_id) not in done] for spec in config.models}
    bars = {name: progress.add_task(name, total=len(items), rate="", start=False) for name, items in todo.items()}
    tokens, starts = dict.fromkeys(todo, 0), {}

    def loaded(model: str, info: dict) -> None:
        """The model is ready: record its info, and start its bar and its clock."""
        folder.record_model(model, info)
        progress.start_task(bars[model])
        starts[model] = time.perf_counter()

    def report(model: str, record: dict) -> None:
        """Advance the model's bar; tokens/s over all its workers since it loaded."""
        tokens[model] += record["prompt_tokens"] + record["new_tokens"]
        rate = f"{tokens[model] / max(time.perf_counter() - starts[model], 1e-9):,.0f} tok/s"
        progress.update(bars[model], advance=1, rate=rate)

    with folder.open_for_append(path) as writer, progress:
        if config.ray:
            from diffeval.scale import evaluate_on_ray

            chunks = {name: chunks_of(task, items, config) for name, items in todo.items()}
            evaluate_on_ray(task, config, chunks, writer, report, loaded)
            return
        settings, context = EngineSettings.from_config(config), RunContext.of(config)
        for spec in config.models:
            if not todo[spec.name]:
                continue
            backend = make_backend(spec, settings, config.backend)
            try:
                loaded(spec.name, backend.info.to_dict())
                chunks = chunks_of(task, todo[spec.name], config)
                for prepared in _prepared_chunks(task, chunks, backend, context):
                    for record in task.running.evaluate(prepared, backend, context):
                        row = record.to_dict()
                        writer.append(row)
                        report(spec.name, row)
            finally:
                backend.close()


def _judge_all(task: Task, config: RunConfig, samples: list, done: set, folder: RunFolder, console) -> None:
    """The judging stage: every generation of this run's samples without a record yet, judged and recorded."""
    wanted = {s.sample_id for s in samples}
    pending = [
        row
        for row in folder.read_records(folder.generations_path).rows
        if row["sample_id"] in wanted and (row["model"], row["sample_id"]) not in done
    ]
    if not pending:
        return
    progress = _progress(console)
    bar = progress.add_task("judge", total=len(pending), rate="")
    with folder.open_for_append() as writer, progress:
        for record in task.running.judge(pending, RunContext.of(config)):
            writer.append(record.to_dict())
            progress.update(bar, advance=1)
