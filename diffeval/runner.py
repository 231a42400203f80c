"""The loop: for each model, for each sample not yet done → backend → score → record (flushed per sample).

One engine at a time: each model is loaded, used and closed (its memory freed) before the next one loads. A task
judged after generation (hallucination with a local judge) writes generations first and judges them once every
model is closed. The runner holds the run folder's lock for as long as it writes, so it is the folder's only writer.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from diffeval.config import RunConfig
from diffeval.errors import InputError
from diffeval.estimate import bound_per_sample, dry_run, long_run_notice
from diffeval.lock import FolderLock
from diffeval.machine import machine_record
from diffeval.models.backend import EngineSettings, check_model, make_backend, open_tokenizer
from diffeval.models.checkpoints.preflight import check_context, preflight
from diffeval.results import RunFolder
from diffeval.tasks import TASKS
from diffeval.tasks.base import RunContext, Task


def check_models(config: RunConfig) -> dict[str, dict]:
    """Fail fast, before any work: every model's checkpoint is whole, the engine can run it, and every context fits
    its positions."""
    # what needs no torch first, so that a wrong path, engine or length is answered at once
    preflight(config.models, config.backend, max(config.lengths), config.allow_overlength)
    from diffeval.models.checkpoints.check import check_checkpoint
    from diffeval.models.checkpoints.loading import describe

    infos = {}
    settings = EngineSettings.from_config(config)
    for spec in config.models:
        # the chat template's switches (--template-switch) render every prompt, the checked one included
        checked = check_checkpoint(spec, config.trust_remote_code, config.chat_template, config.switches)
        info = describe(spec, checked, kind=spec.kind)
        check_model(info, settings, config.backend)
        if info.max_positions:  # a hub model's or custom code's positions are known only from its loaded config
            check_context(spec.name, max(config.lengths), info.max_positions, config.allow_overlength)
        infos[spec.name] = info.to_dict()
        if config.thinking_budget is not None:  # the markers the run will use, checked and recorded before any work
            infos[spec.name]["thinking"] = thinking_markers(spec, config).to_dict()
    return infos


def thinking_markers(spec, config: RunConfig):
    """A model's thinking markers (models.thinking.resolve_markers): from --think-markers, its tokenizer or its chat
    template, each checked against what the template writes; a model without any is refused in one line."""
    from diffeval.models.checkpoints.loading import load_tokenizer
    from diffeval.models.thinking import resolve_markers

    tokenizer = load_tokenizer(spec, config.trust_remote_code)
    return resolve_markers(tokenizer, spec.name, config.think_markers, config.switches)


def _prepared_chunks(task: Task, chunks: list, backend, context: RunContext):
    """Yields what `evaluate` takes for each chunk. Where the task prepares chunks (needle prompts), the next chunk's
    is built in a thread while the model works on this one (tokenizers release the GIL), hiding much of that time."""
    prepare = task.running.prepare_batch
    if prepare is None or not chunks:
        yield from chunks
        return
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(prepare, chunks[0], backend, context)
        for i in range(len(chunks)):
            prepared = pending.result()
            if i + 1 < len(chunks):
                pending = pool.submit(prepare, chunks[i + 1], backend, context)
            yield prepared


def make_samples(task: Task, config: RunConfig) -> list:
    """The run's samples: a pure function of the config (and, for `prepare`, of the models' tokenizers)."""
    prepared = None
    if task.running.prepare is not None:
        settings = EngineSettings.from_config(config)
        tokenizers = {spec.name: open_tokenizer(spec, settings, config.backend) for spec in config.models}
        prepared = task.running.prepare(RunContext.of(config), tokenizers)
    return task.running.make_samples(config.options, config.seed, config.limit, prepared)


def samples_under_limit(task: Task, config: RunConfig, limit: int) -> list:
    """The run's samples under --limit `limit`: what the smaller command a long run suggests would run."""
    return make_samples(task, dataclasses.replace(config, limit=limit))


def check(config: RunConfig) -> dict[str, dict]:
    """The check stage of one run, before any work: every model (config, weights, tokenizer, head layout, engine,
    positions), then the task's inputs (data, judges and their checkpoints). Returns the models' infos."""
    infos = check_models(config)
    task = TASKS[config.task]
    if task.running.check_inputs is not None:
        task.running.check_inputs(RunContext.of(config))
    return infos


@dataclasses.dataclass(frozen=True)
class Planned:
    """A run that passed everything that can refuse it before it writes: its models and inputs, its folder, and its
    samples, sized."""

    config: RunConfig
    infos: dict[str, dict]  # what `check(config)` returned
    folder: RunFolder
    samples: list


def plan(config: RunConfig, infos: dict[str, dict] | None = None) -> Planned:
    """The check stage (unless `infos` holds what it returned), the folder's identity and the samples: a refusal from
    any of them leaves every folder as it was. A suite plans all its runs before the first one writes."""
    infos = check(config) if infos is None else infos
    folder = RunFolder(config.out_dir())
    folder.check_identity(config)  # before the lock: a refused run leaves the folder as it was
    samples = make_samples(TASKS[config.task], config)  # sizing refuses what cannot fit before the folder is written
    return Planned(config, infos, folder, samples)


def run(config: RunConfig, console: Console | None = None, infos: dict[str, dict] | None = None) -> RunFolder | None:
    """Evaluate, or with --dry-run print the run's size and return None. `infos`: what `check(config)` returned;
    without it, the check stage runs here."""
    return execute(plan(config, infos), console)


def execute(planned: Planned, console: Console | None = None) -> RunFolder | None:
    """Evaluate a planned run, or with --dry-run print its size and return None."""
    console = console or Console(stderr=True, markup=False)  # user data (paths, names) is printed as it is
    config, infos, folder, samples = planned.config, planned.infos, planned.folder, planned.samples
    task = TASKS[config.task]
    samples_for = functools.partial(samples_under_limit, task, config)
    if config.dry_run:
        Console(markup=False).print(dry_run(config, task, folder, samples, samples_for, console), soft_wrap=True)
        return None
    cluster: AbstractContextManager[Any] = nullcontext()
    if config.ray:  # an unreachable cluster or a missing install is refused before the folder is touched
        from diffeval.scale import ray_session

        cluster = ray_session(config.ray)
    # a refusal that can only come once a model is loaded (a prompt built in its own tokens) undoes what was written
    entries = folder.entries()  # before the lock creates the folder and its lock file
    with cluster, FolderLock(folder.path, config.break_lock), folder.undone_on_refusal(entries):
        machine = machine_record(config.backend, EngineSettings.from_config(config).threads)
        from diffeval.models.checkpoints.loading import library_versions

        folder.prepare(config, {"versions": library_versions(), "models": infos, "machine": machine})
        records = folder.read_records()
        if records.duplicates:
            console.print(f"note: {records.duplicates} duplicate record(s) in {folder.samples_path}; the first is kept")
        done = records.done_keys()
        bounds = bound_per_sample(config, task, samples)
        for line in long_run_notice(config, bounds, done, samples, samples_for, bound=True) if bounds else []:
            console.print(line, highlight=False, soft_wrap=True)
        total = len(samples) * len(config.models)
        finished = sum((spec.name, s.sample_id) in done for spec in config.models for s in samples)
        if finished:
            console.print(f"resuming: {finished:,} of {total:,} samples already done", highlight=False, soft_wrap=True)
        judge = task.running.judge
        if judge is None:
            _evaluate_all(task, config, samples, done, folder, folder.samples_path, console)
        else:
            generated = folder.read_records(folder.generations_path).done_keys()
            _evaluate_all(task, config, samples, done | generated, folder, folder.generations_path, console)
            _judge_all(judge, config, samples, done, folder, console)
    return folder


def chunks_of(task: Task, todo: list, config: RunConfig) -> list[list]:
    """A model's remaining samples in the chunks one backend call takes (the task's own, or --batch-size)."""
    if task.running.batches is not None:
        return task.running.batches(todo, RunContext.of(config))
    size = config.batch_size
    assert size is not None, "build_config sets the engine's default batch size"
    return [todo[i : i + size] for i in range(0, len(todo), size)]


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
        TextColumn("{task.description}", markup=False),  # a model name and a path: no markup
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}", markup=False),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        MeanTimeRemainingColumn(),
        console=console,
        refresh_per_second=2,  # the bar redraws in a thread; rarer redraws leave the model more of the GIL
    )


@contextmanager
def _shown(progress: Progress) -> Iterator[Progress]:
    """The bars while the block runs. A refusal takes them off the screen (and out of a log), so that it stays the
    one line bad input gets; a failure of another kind leaves them, to show how far the run came."""
    with progress:
        try:
            yield progress
        except InputError:
            progress.live.transient = True
            raise


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

    with folder.open_for_append(path) as writer, _shown(progress):
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
                model_chunks = chunks_of(task, todo[spec.name], config)
                for prepared in _prepared_chunks(task, model_chunks, backend, context):
                    for record in task.running.evaluate(prepared, backend, context):
                        row = record.to_dict()
                        writer.append(row)
                        report(spec.name, row)
            finally:
                backend.close()


def _judge_all(
    judge: Callable[..., Iterable], config: RunConfig, samples: list, done: set, folder: RunFolder, console
) -> None:
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
    with folder.open_for_append() as writer, _shown(progress):
        for record in judge(pending, RunContext.of(config)):
            writer.append(record.to_dict())
            progress.update(bar, advance=1)
