"""The loop: for each model, for each sample not yet done → backend → score → record (flushed per sample)."""

from __future__ import annotations

import gc
import time
from concurrent.futures import ThreadPoolExecutor

import torch
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from diffeval.config import RunConfig
from diffeval.errors import InputError
from diffeval.models.hf import HFBackend
from diffeval.models.loading import describe, library_versions, load_config, load_model
from diffeval.results import RunFolder, append_record
from diffeval.tasks import TASKS


def check_models(config: RunConfig) -> dict[str, dict]:
    """Fail fast, before any work: every model's config loads and every context fits its positions."""
    infos = {}
    for spec in config.models:
        info = describe(spec, load_config(spec, config.trust_remote_code), kind=spec.kind)
        longest = max(config.options.ctx)
        if info.max_positions and longest > info.max_positions and not config.allow_overlength:
            raise InputError(
                f"context {longest} exceeds {spec.name}'s max_position_embeddings {info.max_positions}: "
                "use a shorter --ctx, or --allow-overlength to extrapolate"
            )
        infos[spec.name] = info.to_dict()
    return infos


def _with_prompts(task, chunks: list, backend, config):
    """Yields (chunk, evaluate's extra arguments). Where the task builds prompts separately, the next chunk's are
    built in a thread while the model works on this one (tokenizers release the GIL), hiding much of that time."""
    if not hasattr(task, "build_prompts"):
        yield from ((chunk, {}) for chunk in chunks)
        return
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(task.build_prompts, chunks[0], backend, config) if chunks else None
        for i, chunk in enumerate(chunks):
            prompts = pending.result()
            if i + 1 < len(chunks):
                pending = pool.submit(task.build_prompts, chunks[i + 1], backend, config)
            yield chunk, {"prompts": prompts}


def run(config: RunConfig, console: Console | None = None) -> RunFolder:
    console = console or Console(stderr=True)
    task = TASKS[config.task]
    infos = check_models(config)
    if hasattr(task, "check_inputs"):  # fail before any work on unreadable data or a bad judge
        task.check_inputs(config)
    folder = RunFolder(config.out_dir())
    folder.prepare(config, {"versions": library_versions(), "models": infos})
    # a task may need the models' tokenizers before it can build samples (ICL's `shots=max`)
    prepared = task.prepare(config) if hasattr(task, "prepare") else None
    extra = {"max_shots": prepared} if prepared is not None else {}
    samples = task.make_samples(config.options, config.seed, config.limit, **extra)
    done = folder.done_keys()
    progress = Progress(
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
    with folder.open_for_append() as handle, progress:
        for spec in config.models:
            todo = [s for s in samples if (spec.name, s.sample_id) not in done]
            bar = progress.add_task(spec.name, total=len(todo), rate="")
            if not todo:
                continue
            backend = HFBackend(
                load_model(spec, config.device, config.dtype, config.attn_impl, config.trust_remote_code)
            )
            folder.record_model(spec.name, backend.info.to_dict())
            tokens, start = 0, time.perf_counter()
            if hasattr(task, "batches"):
                chunks = task.batches(todo, config)
            else:
                chunks = [todo[i : i + config.batch_size] for i in range(0, len(todo), config.batch_size)]
            for chunk, extra in _with_prompts(task, chunks, backend, config):
                for record in task.evaluate(chunk, backend, config, **extra):
                    append_record(handle, record)
                    tokens += record["prompt_tokens"] + record["new_tokens"]
                    rate = f"{tokens / (time.perf_counter() - start):,.0f} tok/s"
                    progress.update(bar, advance=1, rate=rate)
            del backend
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return folder
