"""The dry run: a run's size in tokens per model, and the time its samples not yet done would take; and the first
lines of a run (or dry run) on a CPU that would take hours, with a smaller command.

The rate behind a time estimate is given (--tokens-per-s), measured here (--calibrate: one sample per context length),
read from the timed records of earlier runs of the same checkpoint on this machine, or, when none of these is at hand,
computed from the checkpoint's config and this machine's matmul rate (`speed.py`). Only tokenizers and configs load
unless --calibrate asks for the models; nothing is written but the matmul rate's cache.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from rich.console import Console, Group
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from diffeval import speed
from diffeval.config import RunConfig
from diffeval.errors import InputError
from diffeval.machine import machine_record, same_machine
from diffeval.models.backend import EngineSettings, make_backend, open_tokenizer
from diffeval.models.spec import ModelSpec, model_path
from diffeval.models.tokenizer import PromptTokenizer
from diffeval.results import RUN_FILE, RunFolder
from diffeval.tasks.base import RunContext, Task
from diffeval.wording import counted

# A recorded rate times only samples whose prompts are within this factor of its records' size: the rate falls as
# prompts grow (attention is quadratic in the prompt, and each generated token attends to all of it), so a rate
# recorded at 1K says little about 16K
SIZE_TOLERANCE = 1.25
HOW_TO_MEASURE = "give --calibrate, or run a few samples first (--limit 2) and dry-run again"
HOW_TO_TIME = "give --calibrate or --tokens-per-s N, or run a few samples first (--limit 2) and dry-run again"
LONG_RUN_SECONDS = 3600  # a run on a CPU longer than this says so first, with a --limit that fits in it
CALIBRATE_WARNING_SECONDS = 60  # --calibrate warns before a calibration sample the config estimate puts above this


@dataclass(frozen=True)
class Length:
    """A model's samples at one context length, as a dry run sizes them."""

    ctx: int | None  # None for a task whose samples have no length of their own
    first: Any  # the sample --calibrate times
    samples: int
    totals: tuple[int, int]  # prompt tokens and generated tokens at most, of every sample
    remaining: tuple[int, int]  # the same, of the samples not done
    left: int  # the samples not done

    @property
    def prompt_size(self) -> float:
        return self.totals[0] / self.samples


@dataclass(frozen=True)
class Estimate:
    """A model's time estimate: seconds per context length of the samples not done (None: no estimate), where the
    rate comes from in a few words (the table's source column) and in full (the line below the table)."""

    seconds: dict[int | None, float] | None
    source: str
    note: str

    @property
    def total(self) -> float | None:
        return None if self.seconds is None else sum(self.seconds.values())


def dry_run(
    config: RunConfig,
    task: Task,
    folder: RunFolder,
    samples: list,
    samples_for: Callable[[int], list],
    console: Console,
) -> Group:
    """Per model: samples, how many are done, prompt tokens in total, generated tokens at most, the time the samples
    not yet done would take and its source; below the table, where each time estimate comes from; above it, on a
    CPU, how long the run takes when that is over LONG_RUN_SECONDS, and a smaller command. `samples`: the run's
    (`runner.make_samples`); `samples_for(limit)`: the same under --limit; `console`: where --calibrate shows its
    progress. Only tokenizers and configs load, unless --calibrate loads each model to time one sample per length."""
    done = folder.read_records().done_keys()
    settings = EngineSettings.from_config(config)
    loads = "each model loaded to time one sample per length" if config.calibrate else "no model loaded"
    table = Table(title=f"{task.name}: dry run into {folder.path} ({loads})")
    columns = ("model", "samples", "done", "prompt tokens", "generated tokens (at most)", "time (estimate)", "source")
    for column in columns:
        table.add_column(column, justify="right" if column in columns[1:6] else "left")
    table.columns[-1].min_width = len("--tokens-per-s")  # the longest word a source has: never cut
    notes: dict[str, list[str]] = {}  # note → models it applies to
    per_sample: dict[str, dict[int | None, float]] | None = {}  # model → ctx → seconds of one sample not done
    for spec in config.models:
        todo = {s.sample_id for s in samples if (spec.name, s.sample_id) not in done}
        sizes: tuple[str, ...] = ("n/a", "n/a")
        if task.running.sizing is None:
            found = Estimate(None, "n/a", "no time estimate: this task's prompts are built by lm-eval, so their size "
                             "is known only as it runs")  # fmt: skip
        else:
            tokenizer = PromptTokenizer(open_tokenizer(spec, settings, config.backend), spec.name)
            lengths = _lengths(task, samples, todo, tokenizer, config)
            sizes = tuple(f"{sum(length.totals[i] for length in lengths):,}" for i in (0, 1))
            found = time_estimate(config, task, spec, lengths, settings, console)
        if found.seconds is None or per_sample is None:
            per_sample = None
        else:
            per_sample[spec.name] = {
                length.ctx: found.seconds[length.ctx] / length.left for length in lengths if length.left
            }
        notes.setdefault(found.note, []).append(spec.name)
        total = found.total
        time_cell = "n/a" if total is None else duration(total)
        table.add_row(spec.name, f"{len(samples):,}", f"{len(samples) - len(todo):,}", *sizes, time_cell, found.source)
    every = len(config.models)
    lines = [note if len(names) == every else f"{', '.join(names)}: {note}" for note, names in notes.items()]
    first = []
    if per_sample is not None and config.tokens_per_s is None:  # a rate given by hand may be another machine's
        first = long_run_notice(config, per_sample, done, samples, samples_for, bound=False)
    return Group(*(Text(line) for line in first), table, *(Text(line) for line in lines))


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
        lengths.append(Length(ctx, group[0], len(group), totals, remaining, len(left)))
    return lengths


def time_estimate(
    config: RunConfig,
    task: Task,
    spec: ModelSpec,
    lengths: list[Length],
    settings: EngineSettings,
    console: Console | None = None,
) -> Estimate:
    """Seconds the samples not done would take per length (model loading aside), and where the rate comes from. Each
    length is timed at its own rate, in this order: --tokens-per-s; --calibrate's measurement; the rate recorded at
    about that prompt size on this machine (`recorded_rates`); the config and this machine's matmul rate
    (`speed.py`). Ray workers multiply the rates."""
    if config.tokens_per_s is not None:
        seconds = {length.ctx: sum(length.remaining) / config.tokens_per_s for length in lengths}
        return Estimate(seconds, "--tokens-per-s", f"time estimate from --tokens-per-s {config.tokens_per_s:,g}")
    left = [length for length in lengths if length.left]
    if not left:
        return Estimate({}, "every sample done", "time estimate: every sample is done")
    workers = (config.workers or 1) if config.ray else 1
    per_worker = f", × {workers} Ray workers" if workers > 1 else ""
    if config.calibrate:
        calibrated = calibrated_rates(config, task, spec, left, settings, console or Console(stderr=True, markup=False))
        seconds = {length.ctx: sum(length.remaining) / (calibrated[length.ctx] * workers) for length in left}
        measured = "; ".join(f"{_label(length.ctx, left)}{calibrated[length.ctx]:,.0f} tokens/s" for length in left)
        return Estimate(
            seconds,
            "--calibrate",
            f"time estimate from --calibrate: {measured} (one sample per length, timed here{per_worker})",
        )
    machine = machine_record(config.backend, settings.threads)
    rates, why = recorded_rates(config, spec, left, machine)
    if rates is not None:
        seconds = {length.ctx: sum(length.remaining) / (rates[length.ctx].tokens_per_s * workers) for length in left}
        sources = "; ".join(f"{_label(length.ctx, left)}{rates[length.ctx].source}{per_worker}" for length in left)
        note = f"time estimate from runs on this machine ({_describe(machine)}): {sources}"
        return Estimate(seconds, "runs on this machine", note)
    shape = model_shape(config, spec)
    if shape is None:
        return Estimate(None, "n/a", f"no time estimate: {why}, and {spec.name}'s config does not give a dense "
                        f"decoder's sizes (hidden_size, intermediate_size, …); {HOW_TO_TIME}")  # fmt: skip
    rate = run_matmul_rate(config, settings)
    seconds = {
        length.ctx: length.left * _sample_seconds(shape, length.remaining, length.left, rate) / workers
        for length in left
    }
    return Estimate(
        seconds,
        CONFIG_SOURCE,
        f"time estimate from the config and this machine's matmul rate ({rate.describe()}{per_worker}): "
        f"{speed.CALIBRATION.accuracy()}{_unmeasured(config, rate)}. Earlier runs give no rate: {why}; for a "
        f"measured one, {HOW_TO_MEASURE}",
    )


CONFIG_SOURCE = (
    f"config: within ×{speed.CALIBRATION.within:.1f} of {speed.CALIBRATION.runs} runs ({speed.CALIBRATION.span})"
)


def _sample_seconds(shape: speed.Shape, tokens: tuple[int, int], samples: int, rate: speed.MatmulRate) -> float:
    """One sample of the average size of `samples` whose prompt and generated tokens add up to `tokens`."""
    return speed.sample_seconds(shape, tokens[0] / samples, tokens[1] / samples, rate.flops_per_s)


def _unmeasured(config: RunConfig, rate: speed.MatmulRate) -> str:
    untried = [what for what, used in (("a GPU", rate.device != "cpu"), ("vLLM", config.backend != "hf")) if used]
    return f"; not measured on {' or '.join(untried)}: expect a larger error" if untried else ""


def model_shape(config: RunConfig, spec: ModelSpec) -> speed.Shape | None:
    """The model's cost per token from its config (config.json, or a GGUF file's header), no weights; None when the
    config lacks a dense decoder's sizes."""
    from diffeval.models.checkpoints.loading import load_config

    try:
        return speed.shape_of(load_config(spec, config.trust_remote_code))
    except (AttributeError, TypeError):
        return None


def run_matmul_rate(config: RunConfig, settings: EngineSettings) -> speed.MatmulRate:
    """The matmul rate of the device, dtype and threads the run uses (cached per machine)."""
    from diffeval.models.checkpoints.loading import resolve_device, resolve_dtype

    device = resolve_device(config.device)
    dtype = str(resolve_dtype(config.dtype, device)).removeprefix("torch.")
    return speed.matmul_rate(device, dtype, settings.threads)


def _label(ctx: int | None, lengths: list[Length]) -> str:
    return f"ctx {ctx:,}: " if len(lengths) > 1 and ctx is not None else ""


def _describe(machine: dict[str, Any]) -> str:
    gpus = ", ".join(machine["gpus"]) if machine["gpus"] else "no GPU" if machine["gpus"] == [] else "GPUs unknown"
    threads = counted(machine["threads"], "thread")
    return f"{machine['cpu']}, {machine['cores']} cores, {gpus}, {machine['engine']}, {threads}"


def calibrated_rates(
    config: RunConfig,
    task: Task,
    spec: ModelSpec,
    lengths: list[Length],
    settings: EngineSettings,
    console: Console,
) -> dict[int | None, float]:
    """Per length, tokens ÷ seconds of its first sample evaluated as the run evaluates it, the model loaded once. Its
    prompt is built before the clock starts, as a run builds the next chunk's while the model works. A spinner shows
    each step on `console`; a sample the config estimate puts over CALIBRATE_WARNING_SECONDS is announced first."""
    expected = _expected_calibration(config, spec, lengths, settings)
    slow = {ctx: seconds for ctx, seconds in expected.items() if seconds > CALIBRATE_WARNING_SECONDS}
    if slow:
        each = ", ".join(f"about {duration(seconds)}{_at(ctx)}" for ctx, seconds in slow.items())
        console.print(
            f"warning: --calibrate evaluates one sample of {spec.name} per length: {each} (config estimate); leave "
            "--calibrate out for the config estimate at once",
            highlight=False,
            soft_wrap=True,
        )
    progress = Progress(
        SpinnerColumn(), TextColumn("{task.description}", markup=False), TimeElapsedColumn(), console=console
    )
    with progress:
        step = progress.add_task(f"--calibrate: loading {spec.name}", total=1)
        backend = make_backend(spec, settings, config.backend)
        progress.update(step, completed=1)
        try:
            rates = {}
            running, context = task.running, RunContext.of(config)
            for length in lengths:
                guess = expected.get(length.ctx, 0.0)
                about = f" (about {duration(guess)})" if guess >= 1 else ""
                step = progress.add_task(f"--calibrate: {spec.name}, one sample{_at(length.ctx)}{about}", total=1)
                chunk = [length.first]
                prepared = running.prepare_batch(chunk, backend, context) if running.prepare_batch else chunk
                start = time.perf_counter()
                records = list(running.evaluate(prepared, backend, context))
                seconds = time.perf_counter() - start
                rates[length.ctx] = sum(r.prompt_tokens + r.new_tokens for r in records) / max(seconds, 1e-9)
                progress.update(step, completed=1)
            return rates
        finally:
            backend.close()


def _expected_calibration(
    config: RunConfig, spec: ModelSpec, lengths: list[Length], settings: EngineSettings
) -> dict[int | None, float]:
    """The config estimate of each length's calibration sample (one of the length's average size); {} without one."""
    shape = model_shape(config, spec)
    if shape is None:
        return {}
    rate = run_matmul_rate(config, settings)
    return {length.ctx: _sample_seconds(shape, length.totals, length.samples, rate) for length in lengths}


def _at(ctx: int | None) -> str:
    return "" if ctx is None else f" at ctx {ctx:,}"


def long_run_notice(
    config: RunConfig,
    per_sample: dict[str, dict[int | None, float]],
    done: set,
    samples: list,
    samples_for: Callable[[int], list],
    bound: bool,
) -> list[str]:
    """A run on a CPU that would take over LONG_RUN_SECONDS: how long (per model, from `per_sample`: model → ctx →
    seconds of one sample not done; `bound`: an upper bound, not an estimate) and the command with the largest
    --limit that fits in that time, found among `samples_for(limit)`; [] for a shorter run, or one not on this CPU."""

    def seconds_of(chosen: list) -> dict[str, float]:
        return {
            model: sum(times.get(getattr(s, "ctx", None), 0.0) for s in chosen if (model, s.sample_id) not in done)
            for model, times in per_sample.items()
        }

    by_model = seconds_of(samples)
    total = sum(by_model.values())
    if total <= LONG_RUN_SECONDS or not on_cpu(config):
        return []
    models = ", ".join(f"{model} {duration(seconds)}" for model, seconds in by_model.items())
    how = (
        f"at most, every prompt at its full --ctx: the config estimate, {speed.CALIBRATION.accuracy()}"
        if bound
        else "the table says where each estimate comes from"
    )
    lines = [f"This run takes {'up to ' if bound else ''}about {duration(total)} on this CPU ({models}; {how})."]
    most = (config.limit or len(samples)) - 1
    if most < 1:
        lines.append("It runs one sample per cell already: give fewer --ctx lengths, cells or models to shorten it.")
        return lines
    limit = _largest_limit(lambda n: sum(seconds_of(samples_for(n)).values()), most)
    smaller = duration(sum(seconds_of(samples_for(limit)).values()))
    lines.append(
        f"For a first look, size it down: {command_with_limit(limit)} (about {smaller}; --limit caps the samples per "
        "cell; fewer --ctx lengths or cells shorten it too)."
    )
    if bound:
        lines.append("It starts now: Ctrl-C stops it, and the same command resumes where it stopped.")
    return lines


def _largest_limit(seconds_for: Callable[[int], float], most: int) -> int:
    """The largest limit in 1..most whose run fits in LONG_RUN_SECONDS (1 when none does); the time grows with it."""
    low, high = 1, most
    while low < high:
        middle = (low + high + 1) // 2
        if seconds_for(middle) <= LONG_RUN_SECONDS:
            low = middle
        else:
            high = middle - 1
    return low


def command_with_limit(limit: int) -> str:
    """This process's command line with --limit `limit` in place of any it had; when the process is not diffeval's
    command line (the Python API), the instruction in words."""
    args = sys.argv[1:]
    if not args or args[0] != "run":
        return f"the same run with --limit {limit}"
    kept, skip = [], False
    for arg in args:
        if skip or arg.startswith("--limit="):
            skip = False
            continue
        if arg == "--limit":
            skip = True
            continue
        kept.append(arg)
    return shlex.join(["diffeval", *kept, "--limit", str(limit)])


def on_cpu(config: RunConfig) -> bool:
    """The run's models run on this machine's CPU (with --ray, the workers' devices are not this machine's)."""
    from diffeval.models.checkpoints.loading import resolve_device

    return not config.ray and resolve_device(config.device) == "cpu"


def bound_per_sample(config: RunConfig, task: Task, samples: list) -> dict[str, dict[int | None, float]] | None:
    """Per model and context length, the config estimate of one sample at its largest: a prompt of the whole length
    and the task's whole answer budget generated. Cheap (configs and the cached matmul rate, no tokenizer): what a
    run started on a CPU announces itself with. None off the CPU, when no sample has a length, or when a config lacks
    the sizes."""
    lengths = {s.ctx for s in samples if getattr(s, "ctx", None)}
    if not lengths or not on_cpu(config):
        return None
    answer = task.running.budget(RunContext.of(config)).generated if task.running.budget is not None else 0
    rate = run_matmul_rate(config, EngineSettings.from_config(config))
    bounds = {}
    for spec in config.models:
        shape = model_shape(config, spec)
        if shape is None:
            return None
        bounds[spec.name] = {ctx: speed.sample_seconds(shape, ctx, answer, rate.flops_per_s) for ctx in sorted(lengths)}
    return bounds


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


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes < 90 else f"{minutes // 60:.0f} h {minutes % 60:02.0f} min"
