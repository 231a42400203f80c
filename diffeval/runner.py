"""The loop: for each model, for each sample not yet done → backend → score → record (flushed per sample).

One engine at a time: each model is loaded, used and closed (its memory freed) before the next one loads. A task
judged after generation (hallucination with a local judge) writes generations first and judges them once every
model is closed. The runner holds the run folder's lock for as long as it writes, so it is the folder's only writer.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

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
from diffeval.models.backend import EngineSettings, check_model, make_backend, open_tokenizer
from diffeval.models.loading import check_checkpoint, describe, library_versions
from diffeval.models.spec import ModelSpec, model_path
from diffeval.models.tokenizer import PromptTokenizer
from diffeval.results import RUN_FILE, RunFolder
from diffeval.tasks import TASKS
from diffeval.tasks.base import Task


def check_models(config: RunConfig) -> dict[str, dict]:
    """Fail fast, before any work: every model's checkpoint is whole, the engine can run it, and every context fits
    its positions."""
    infos = {}
    settings = EngineSettings.from_config(config)
    for spec in config.models:
        info = describe(spec, check_checkpoint(spec, config.trust_remote_code), kind=spec.kind)
        check_model(info, settings, config.backend)
        longest = max(config.options.ctx)
        if info.max_positions and longest > info.max_positions and not config.allow_overlength:
            raise InputError(
                f"context {longest} exceeds {spec.name}'s max_position_embeddings {info.max_positions}: "
                "use a shorter --ctx, or --allow-overlength to extrapolate"
            )
        infos[spec.name] = info.to_dict()
    return infos


def _prepared_chunks(task: Task, chunks: list, backend, config):
    """Yields what `evaluate` takes for each chunk. Where the task prepares chunks (needle prompts), the next chunk's
    is built in a thread while the model works on this one (tokenizers release the GIL), hiding much of that time."""
    if task.prepare_batch is None:
        yield from chunks
        return
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(task.prepare_batch, chunks[0], backend, config) if chunks else None
        for i in range(len(chunks)):
            prepared = pending.result()
            if i + 1 < len(chunks):
                pending = pool.submit(task.prepare_batch, chunks[i + 1], backend, config)
            yield prepared


def make_samples(task: Task, config: RunConfig) -> list:
    """The run's samples: a pure function of the config (and, for `prepare`, of the models' tokenizers)."""
    prepared = None
    if task.prepare is not None:
        settings = EngineSettings.from_config(config)
        tokenizers = {spec.name: open_tokenizer(spec, settings, config.backend) for spec in config.models}
        prepared = task.prepare(config, tokenizers)
    return task.make_samples(config.options, config.seed, config.limit, prepared)


def dry_run(config: RunConfig, task: Task, folder: RunFolder) -> Group:
    """Per model: samples, how many are done, prompt tokens in total, generated tokens at most, and the time the
    samples not yet done would take; below the table, where each time estimate comes from. Only tokenizers load."""
    samples = make_samples(task, config)
    done = folder.read_records().done_keys()
    settings = EngineSettings.from_config(config)
    table = Table(title=f"{task.name}: dry run into {folder.path} (no model loaded)")
    for column in ("model", "samples", "done", "prompt tokens", "generated tokens (at most)", "time (estimate)"):
        table.add_column(column, justify="left" if column == "model" else "right")
    notes = {}  # note → models it applies to
    for spec in config.models:
        todo = [s for s in samples if (spec.name, s.sample_id) not in done]
        sizes, estimate = ("n/a", "n/a"), "n/a"
        if task.sizing is None:
            note = "no time estimate: this task's prompts are built by lm-eval, so their size is known only as it runs"
        else:
            tokenizer = PromptTokenizer(open_tokenizer(spec, settings, config.backend), spec.name)
            totals = task.sizing(samples, tokenizer, config)
            remaining = totals if len(todo) == len(samples) else (0, 0)
            if 0 < len(todo) < len(samples):  # a resumed run: only what is left takes time
                remaining = task.sizing(todo, tokenizer, config)
            sizes = tuple(f"{n:,}" for n in totals)
            rate = throughput(config, spec, sum(totals) / max(len(samples), 1))
            if rate is None:
                note = (
                    f"no time estimate: no run folder beside {folder.path} records the speed of this checkpoint on "
                    f"{config.backend}; give --tokens-per-s N, or run a few samples first (--limit 2) and dry-run again"
                )
            else:
                estimate, note = _duration(sum(remaining) / rate.tokens_per_s), f"time estimate from {rate.source}"
        notes.setdefault(note, []).append(spec.name)
        table.add_row(spec.name, f"{len(samples):,}", f"{len(samples) - len(todo):,}", *sizes, estimate)
    every = len(config.models)
    lines = [note if len(names) == every else f"{', '.join(names)}: {note}" for note, names in notes.items()]
    return Group(table, *(Text(line) for line in lines))


@dataclass(frozen=True)
class Throughput:
    tokens_per_s: float  # prompt + generated tokens per second of one model, as the progress bar counts them
    source: str  # where the rate comes from, as the dry run states it


def throughput(config: RunConfig, spec: ModelSpec, tokens_per_sample: float) -> Throughput | None:
    """The rate a dry run's time estimate divides by: --tokens-per-s; else the rate recorded (tokens ÷ seconds of its
    records) in a run folder beside this run's, or one level below (a suite's), of the same checkpoint on the same
    engine: the one whose records are closest in size to this run's samples (the rate falls as contexts grow), of the
    same task when sizes tie; times the Ray workers. None when there is no such folder."""
    if config.tokens_per_s is not None:
        return Throughput(config.tokens_per_s, f"--tokens-per-s {config.tokens_per_s:,g}")
    root = config.out_dir().parent
    found = []
    for run_file in sorted({*root.glob(f"*/{RUN_FILE}"), *root.glob(f"*/*/{RUN_FILE}")}):
        recorded = _recorded_rate(RunFolder(run_file.parent), config.backend, spec.path)
        if recorded is not None:
            tokens, seconds, count, task = recorded
            distance = abs(math.log(max(tokens / count, 1) / max(tokens_per_sample, 1)))
            found.append((distance, task != config.task, tokens / seconds, count, tokens / count, run_file.parent))
    if not found:
        return None
    _, _, rate, count, size, path = min(found, key=lambda item: item[:2])
    workers = (config.workers or 1) if config.ray else 1
    per_worker = f", × {workers} Ray workers" if workers > 1 else ""
    return Throughput(
        rate * workers,
        f"{rate:,.0f} tokens/s recorded in {path} ({count:,} records of {size:,.0f} tokens on average{per_worker})",
    )


def _recorded_rate(folder: RunFolder, backend: str, checkpoint: str) -> tuple[int, float, int, str] | None:
    """(tokens, seconds, records, task) of a run folder's records of this checkpoint on this engine; None when it
    holds none (or is damaged: a dry run does not stop at another run's folder)."""
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
    tokens = seconds = count = 0
    for row in folder.read_records().rows if names else []:
        if row["model"] in names and isinstance(row.get("seconds"), (int, float)) and row["seconds"] > 0:
            tokens += int(row.get("prompt_tokens") or 0) + int(row.get("new_tokens") or 0)
            seconds += row["seconds"]
            count += 1
    return (tokens, seconds, count, stored["task"]) if tokens and seconds else None


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


def run(config: RunConfig, console: Console | None = None) -> RunFolder | None:
    """Evaluate, or with --dry-run print the run's size and return None."""
    console = console or Console(stderr=True)
    task = TASKS[config.task]
    infos = check_models(config)
    if task.check_inputs is not None:  # fail before any work on unreadable data or a bad judge
        task.check_inputs(config)
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
        folder.prepare(config, {"versions": library_versions(), "models": infos})
        samples = make_samples(task, config)
        records = folder.read_records()
        if records.duplicates:
            console.print(f"note: {records.duplicates} duplicate record(s) in {folder.samples_path}; the first is kept")
        done = records.done_keys()
        if task.judge is None:
            _evaluate_all(task, config, samples, done, folder, folder.samples_path, console)
        else:
            generated = folder.read_records(folder.generations_path).done_keys()
            _evaluate_all(task, config, samples, done | generated, folder, folder.generations_path, console)
            _judge_all(task, config, samples, done, folder, console)
    return folder


def chunks_of(task: Task, todo: list, config: RunConfig) -> list[list]:
    """A model's remaining samples in the chunks one backend call takes (the task's own, or --batch-size)."""
    if task.batches is not None:
        return task.batches(todo, config)
    return [todo[i : i + config.batch_size] for i in range(0, len(todo), config.batch_size)]


def _progress(console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
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
        settings = EngineSettings.from_config(config)
        for spec in config.models:
            if not todo[spec.name]:
                continue
            backend = make_backend(spec, settings, config.backend)
            try:
                loaded(spec.name, backend.info.to_dict())
                for prepared in _prepared_chunks(task, chunks_of(task, todo[spec.name], config), backend, config):
                    for record in task.evaluate(prepared, backend, config):
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
        for record in task.judge(pending, config):
            writer.append(record.to_dict())
            progress.update(bar, advance=1)
