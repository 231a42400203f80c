"""The diffeval command line: options → RunConfig → runner. No evaluation logic lives here."""

from __future__ import annotations

import difflib
import inspect
import sys
from dataclasses import Field, fields
from typing import TYPE_CHECKING, Annotated, Any, TypeAlias

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from diffeval.config import DEVICES, DTYPES, RunConfig, declared_engine_options, field_default, load_yaml, value_type
from diffeval.errors import InputError, RunFailure
from diffeval.judges import JudgeError
from diffeval.models.backend import engine_options
from diffeval.models.spec import DEFAULT_PAIR, ModelSpec
from diffeval.tasks import TASKS, build_config
from diffeval.tasks.base import Task
from diffeval.toy.cli import toy_app

# help as click lays it out (no Rich tables): at 80 columns Rich truncates long option names, click wraps the help
app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Evaluate Differential-Transformer models against baselines on long-context tasks.",
)
run_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Run an evaluation task.")
models_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Inspect and convert model checkpoints.")


def _version(show: bool) -> None:
    if show:
        from diffeval import __version__

        console.print(f"diffeval {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, Opt("--version", callback=_version, is_eager=True, help="print diffeval's version and exit")
    ] = False,
) -> None:
    """Evaluate Differential-Transformer models against baselines on long-context tasks."""


app.add_typer(run_app, name="run")
app.add_typer(models_app, name="models")
app.add_typer(toy_app, name="toy")

# user data (paths, dataset and model names, file contents) is printed as it is: never read as rich markup
console = Console(markup=False)
err_console = Console(stderr=True, markup=False)

Opt = typer.Option

# The two options that are not RunConfig fields. Every other option comes from a declared field (config.option):
# RunConfig's own on every task, then the task's options class. All default to None so that a YAML preset can
# supply them and flags override it.
ENTRY_OPTIONS = {
    "model": Annotated[
        list[str] | None,
        Opt(
            "--model",
            "-m",
            metavar="NAME=PATH",
            help=f"NAME=PATH_OR_HUB_ID[:diff|:base]; repeatable [default: {' '.join(DEFAULT_PAIR)}]",
        ),
    ],
    "config": Annotated[
        str | None, Opt(metavar="PRESET", help="YAML preset file or shipped preset name; flags override it")
    ],
}


def _cli_option(f: Field):
    declaration = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
    return Annotated[value_type(f) | None, Opt(declaration, metavar=_metavar(f), help=option_help(f))]


def _metavar(f: Field) -> str | None:
    """--backend's value in --help: the engines' names (every other option shows its own name, `_named_metavars`)."""
    return "|".join(engine_options()) if f.name == "backend" else None


def option_help(f: Field) -> str:
    """The field's help, ending in its default: the one written there (a rule, such as `1 on hf, 256 on vllm`), else
    the declared value. Typer cannot show it itself: every flag defaults to None so that a preset can supply it."""
    text, default = f.metadata["help"], field_default(f)
    if "[default:" in text or default is None or default == []:
        return text
    if isinstance(default, bool):
        shown = "on" if default else "off"
    elif isinstance(default, list):
        shown = ",".join(map(str, default))
    else:
        shown = f"{default:g}" if isinstance(default, float) else str(default)
    return f"{text} [default: {shown}]"


def task_options(task: Task) -> dict:
    """`diffeval run TASK`'s options: the entry options, the task's own, RunConfig's (common or task-listed), then
    every engine's own (models.backend.engine_options: a run refuses those of an engine it does not use)."""
    run_fields = [
        f for f in fields(RunConfig) if "help" in f.metadata and (f.metadata["cli"] or f.name in task.run_options)
    ]
    return {
        **ENTRY_OPTIONS,
        **{f.name: _cli_option(f) for f in fields(task.options) if f.metadata.get("cli", True)},
        **{f.name: _cli_option(f) for f in run_fields},
        **{name: _cli_option(f) for name, f in declared_engine_options(engine_options()).items() if f.metadata["cli"]},
    }


def _run_task(task: str, flags: dict) -> None:
    config_path = flags.pop("config")
    flags["models"] = flags.pop("model") or None
    run_config = build_config(task, load_yaml(config_path) if config_path else {}, flags)
    # the engines load only now, the reports only after a run: a bad option is refused before torch is imported,
    # and a dry run never imports pandas
    from diffeval import runner

    folder = runner.run(run_config, err_console)
    if folder is None:  # --dry-run
        return
    from diffeval.report.tables import build_report

    [report] = build_report([folder], ["md", "csv"])
    _print_report(report)
    console.print(f"results: {folder.path}  ({', '.join(p.name for p in report.written)})")


def _register_run_command(task: Task) -> None:
    """`diffeval run TASK`: the task's options as one Typer command."""

    def command(**flags) -> None:
        _run_task(task.name, flags)

    command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]  # what Typer reads the options from
        [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)
            for name, annotation in task_options(task).items()
        ]
    )
    command.__doc__ = task.help
    run_app.command(task.name)(command)


for _task in TASKS.values():
    _register_run_command(_task)

_RUN_FIELDS = {f.name: f for f in fields(RunConfig)}
if TYPE_CHECKING:  # built at run time from RunConfig's declarations, so a type checker reads them as any value
    ModelOption: TypeAlias = Any
    DeviceOption: TypeAlias = Any
    LimitOption: TypeAlias = Any
    OverwriteOption: TypeAlias = Any
    BreakLockOption: TypeAlias = Any
    BackendOption: TypeAlias = Any
    RayOption: TypeAlias = Any
    WorkersOption: TypeAlias = Any
    DryRunOption: TypeAlias = Any
    TokensPerSOption: TypeAlias = Any
else:
    ModelOption, DeviceOption = ENTRY_OPTIONS["model"], _cli_option(_RUN_FIELDS["device"])
    LimitOption, OverwriteOption = _cli_option(_RUN_FIELDS["limit"]), _cli_option(_RUN_FIELDS["overwrite"])
    BreakLockOption, BackendOption = _cli_option(_RUN_FIELDS["break_lock"]), _cli_option(_RUN_FIELDS["backend"])
    RayOption, WorkersOption = _cli_option(_RUN_FIELDS["ray"]), _cli_option(_RUN_FIELDS["workers"])
    DryRunOption, TokensPerSOption = _cli_option(_RUN_FIELDS["dry_run"]), _cli_option(_RUN_FIELDS["tokens_per_s"])
FailUnder = Annotated[
    list[str] | None, Opt("--fail-under", help="TASK.METRIC@MODEL=VALUE, e.g. needle.accuracy@diff=0.8; repeatable")
]


@run_app.command("suite")
def run_suite(
    preset: Annotated[str, typer.Argument(help="suite YAML file or shipped suite name (ci-smoke, paper-table2, …)")],
    model: ModelOption = None,
    out: Annotated[
        str | None, Opt(help="suite folder; each task runs into a subfolder [default: results/SUITE]")
    ] = None,
    backend: BackendOption = None,
    device: DeviceOption = None,
    limit: LimitOption = None,
    overwrite: OverwriteOption = None,
    break_lock: BreakLockOption = None,
    ray: RayOption = None,
    workers: WorkersOption = None,
    dry_run: DryRunOption = None,
    tokens_per_s: TokensPerSOption = None,
    fail_under: FailUnder = None,
    paper: Annotated[bool, Opt("--paper", help="add the paper's numbers where the setting matches")] = False,
) -> None:
    """Several tasks from one preset into one folder, then their reports (and gates)."""
    from diffeval.suite import suite_configs

    flags = {
        "models": model or None,
        "backend": backend,
        "device": device,
        "limit": limit,
        "overwrite": overwrite,
        "break_lock": break_lock,
        "ray": ray,
        "workers": workers,
        "dry_run": dry_run,
        "tokens_per_s": tokens_per_s,
    }
    folder, configs = suite_configs(preset, out, flags, say=err_console.print)
    # the engines and reports load only now: a bad option or preset is refused before torch or pandas is imported
    from diffeval import runner
    from diffeval.report.gates import parse_threshold
    from diffeval.report.tables import build_report

    gates = [parse_threshold(g) for g in fail_under or []]
    checked = [runner.check(config) for config in configs]  # no task runs until every task's models and inputs pass
    # nor until every task's folder and samples pass: a refused suite writes nothing
    planned = [runner.plan(config, infos) for config, infos in zip(configs, checked)]
    runs = [runner.execute(run, err_console) for run in planned]
    if dry_run:
        return
    finished = [run for run in runs if run is not None]  # every run, but for a dry run's (None)
    reports = build_report(finished, ["md", "csv", "html"], out=folder / "report", paper=paper)
    for report in reports:
        _print_report(report)
    console.print(f"results: {folder}  (report: {folder / 'report' / 'report.html'})")
    _apply_gates(gates, reports)


@app.command("report")
def report(
    run_dirs: Annotated[list[str], typer.Argument(help="run or suite folders (finished or partial)")],
    format: Annotated[str, Opt("--format", help="md, csv, latex, html; comma-separated")] = "md",
    out: Annotated[str | None, Opt(help="write here (one subfolder per run) instead of into each run folder")] = None,
    paper: Annotated[bool, Opt("--paper", help="add the paper's numbers where the setting matches")] = False,
    fail_under: FailUnder = None,
    scoring: Annotated[
        str | None, Opt("--scoring", help="needle: rescore stored outputs by rule default | ruler [default: default]")
    ] = None,
) -> None:
    """Paper-layout tables, plots and paired statistics from run folders' samples.jsonl."""
    from pathlib import Path

    from diffeval.report.gates import dropped_note, parse_threshold, run_folders
    from diffeval.report.tables import build_report, parse_formats

    gates = [parse_threshold(g) for g in fail_under or []]
    folders = run_folders(run_dirs)
    reports = build_report(folders, parse_formats(format), Path(out) if out else None, paper, scoring)
    for item in reports:
        _print_report(item)
        if item.damaged or item.duplicates:
            note = dropped_note(item.folder, item.damaged, item.duplicates, item.first_damage)
            err_console.print(note, soft_wrap=True, markup=False)
    console.print(f"wrote {', '.join(str(p) for r in reports for p in r.written)}", soft_wrap=True)
    _apply_gates(gates, reports)


@app.command("compare")
def compare(
    old: Annotated[str, typer.Argument(help="baseline run or suite folder")],
    new: Annotated[str, typer.Argument(help="candidate run or suite folder")],
    max_drop: Annotated[float, Opt(help="largest tolerated drop of any shared metric")] = 0.02,
    alpha: Annotated[float, Opt(help="significance level of the paired test")] = 0.05,
) -> None:
    """Exit 1 when any metric both folders share drops by more than --max-drop, significantly (paired test)."""
    from diffeval.report import gates

    warn = lambda note: err_console.print(note, soft_wrap=True, markup=False)  # noqa: E731
    table = gates.compare(gates.run_folders([old]), gates.run_folders([new]), max_drop, alpha, warn)
    if table.empty:
        raise InputError(f"{old} and {new} share no task, metric and model: compare runs of the same evaluation")
    from diffeval.report.format import NumberFormats, markdown_table, p_value_text

    # the report's number format: metrics and their drops with the default decimals, p-values in their own format
    decimals = NumberFormats().decimals("compare", "drop")
    shown = markdown_table("compare", table.set_index(["task", "metric", "model"]), NumberFormats())
    console.print(shown, markup=False, highlight=False, soft_wrap=True)
    regressed = table[table["regressed"]]
    for row in regressed.itertuples():
        err_console.print(
            f"regression: {row.task}.{row.metric}@{row.model} dropped {row.drop:.{decimals}f} "
            f"({row.old:.{decimals}f} -> {row.new:.{decimals}f}, p = {p_value_text(row.p_value)})",
            soft_wrap=True,
        )
    if len(regressed):
        sys.exit(1)


def _apply_gates(gates, reports) -> None:
    """Gates on the records the reports were made from (no second read of samples.jsonl)."""
    from diffeval.report.gates import check_thresholds

    failures = check_thresholds(gates, [(r.task, r.frame) for r in reports]) if gates else []
    for failure in failures:
        err_console.print(f"gate failed: {failure}", markup=False, soft_wrap=True)
    if failures:
        sys.exit(1)


@app.command("view")
def view(
    run_dirs: Annotated[list[str], typer.Argument(help="run or suite folders (finished, partial or damaged)")],
    port: Annotated[int, Opt(help="port to serve on; 0 takes a free one")] = 0,
    host: Annotated[str, Opt(help="address to bind; the default serves this machine only")] = "127.0.0.1",
    export: Annotated[str | None, Opt(help="write the viewer as static files into this folder instead")] = None,
) -> None:
    """Browse runs sample by sample in the browser: tables with clickable cells, filters, each sample on every model."""
    from pathlib import Path

    from diffeval.report.gates import run_folders

    folders = [f.path for f in run_folders(run_dirs)]
    if export is not None:
        from diffeval.view.export import export as write_export

        page = write_export(folders, Path(export), err_console)
        console.print(f"wrote {page}: open it in a browser (no server needed)", soft_wrap=True)
        return
    from diffeval.view.server import Runs, make_server

    if not 0 <= port <= 65535:
        raise InputError(f"--port {port}: use 1-65535, or 0 for a free port")
    runs = Runs(folders)
    for note in runs.dropped_notes():
        err_console.print(note, soft_wrap=True, markup=False)
    try:
        server = make_server(runs, host, port)
    except OSError as exc:
        raise InputError(f"cannot serve on {host}:{port} ({exc.strerror}): use another --port, or 0") from None
    shown = f"[{host}]" if ":" in host else host
    console.print(f"diffeval view: http://{shown}:{server.server_address[1]}/  (Ctrl-C stops)", soft_wrap=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        console.print("stopped")
    finally:
        server.server_close()


@models_app.command("inspect")
def models_inspect(
    spec: Annotated[str, typer.Argument(help="PATH_OR_HUB_ID[:diff|:base]")],
    device: Annotated[str, Opt(help="auto | cpu | cuda")] = "cpu",
    dtype: Annotated[str, Opt(help="auto | float32 | bfloat16 | float16")] = "auto",
    trust_remote_code: Annotated[bool, Opt("--trust-remote-code")] = False,
) -> None:
    """Architecture summary, every layer's kind; for DIFF models λ_init and the learned λ of every layer."""
    from diffeval.models.checkpoints.check import check_checkpoint
    from diffeval.models.checkpoints.loading import load_model
    from diffeval.models.lambda_probe import per_token_lambdas
    from diffeval.models.layer_kinds import cache_text, kinds, layer_runs
    from diffeval.models.variants import registry as variants
    from diffeval.models.variants.base import PER_TOKEN

    if device not in DEVICES or dtype not in DTYPES:
        raise InputError(
            f"bad --device {device!r} or --dtype {dtype!r}: use {'|'.join(DEVICES)} and {'|'.join(DTYPES)}"
        )
    model_spec = ModelSpec.parse(spec)
    # the check stage `run` uses: a checkpoint missing a λ tensor would otherwise show λ from random initialisation
    check_checkpoint(model_spec, trust_remote_code)
    loaded = load_model(model_spec, device, dtype, attn_impl="sdpa", trust_remote_code=trust_remote_code)
    info = loaded.info
    variant = variants.by_name(info.diff_variant)
    table = Table(title=f"{info.name}: {info.spec}", show_header=False)
    described = []  # what the registry says of a DIFF model's variant
    if variant:
        described = [("variant", variant.title), ("head pairing", variant.head_layout)]
        described += [("λ", variant.lambda_form), ("norm", variant.norm)]
    # grouped differential attention: each group's signal heads share one noise head
    if info.noise_heads and info.heads:
        signal = (info.heads - info.noise_heads) // info.noise_heads
        described.append(("head groups", f"{info.noise_heads} groups of {signal} signal heads and 1 noise head"))
    for label, value in (
        ("class", info.architecture),
        ("DIFF", f"yes ({info.diff_variant or 'declared'})" if info.is_diff else "no (baseline)"),
        *described,
        ("layers", info.layers),
        ("attention heads", info.heads),
        ("KV heads", info.kv_heads),
        ("head dim", info.head_dim),
        ("max positions", info.max_positions),
        ("RoPE base", info.rope_theta if info.rope_theta is not None else "none"),
        ("parameters", f"{info.parameters:,}"),
        *([("GGUF file", info.gguf["file"]), ("quantization", info.gguf["quantization"])] if info.gguf else []),
    ):
        table.add_row(label, str(value))
    console.print(table)
    pattern = Table(title="layer pattern (identical layers in runs)")
    for column in ("layers", "kind", "vLLM cache"):
        pattern.add_column(column)
    for span, layer in layer_runs(kinds(info)):
        pattern.add_row(span, layer.describe(), cache_text(layer))
    console.print(pattern)
    if info.lambdas:
        lambdas = Table(title="λ per layer (λ = exp(λq1·λk1) − exp(λq2·λk2) + λ_init)")
        for column in ("layer", "λ_init", "λ (learned)"):
            lambdas.add_column(column, justify="right")
        for row in info.lambdas:
            lambdas.add_row(str(row["layer"]), f"{row['lambda_init']:.4f}", f"{row['lambda']:.4f}")
        console.print(lambdas)
    if variant is not None and variant.lambda_form == PER_TOKEN:
        probe = per_token_lambdas(loaded, variant)
        title = f"λ per layer (V2: λ = sigmoid(W_λ·x) per token and head, over a {probe.tokens}-token probe)"
        table = Table(title=title)
        for column in ("layer", "mean", "std", "min", "max"):
            table.add_column(column, justify="right")
        for row in probe.layers:
            table.add_row(str(row["layer"]), *(f"{row[key]:.4f}" for key in ("mean", "std", "min", "max")))
        console.print(table)


@models_app.command("convert")
def models_convert(
    src: Annotated[str, typer.Argument(help="checkpoint folder in the paper's layout")],
    dst: Annotated[str, typer.Argument(help="new folder for the converted checkpoint")],
    source: Annotated[
        str, Opt("--from", help="unilm-v1:diffattn | unilm-v1:flashdiff1 | unilm-v1:flashdiff2 | unilm-v2")
    ],
) -> None:
    """Convert a Llama-style checkpoint with the paper's own DIFF attention modules (microsoft/unilm) into
    transformers' DiffLlama (V1) or diffeval's V2, exactly; says where K/V heads are duplicated and what the eps is."""
    from diffeval.models.checkpoints.convert import convert

    for line in convert(source, src, dst):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    console.print(f"wrote {dst}: load it with --model {dst}", markup=False, highlight=False, soft_wrap=True)


def _print_report(report) -> None:
    from diffeval.report.format import markdown_table
    from diffeval.report.tables import title

    for key, frame in report.tables.items():
        console.print(Text(title(key, report.titles), style="bold"), soft_wrap=True)
        text = markdown_table(key, frame, report.formats)  # the formats of table.md: row labels as columns
        console.print(text, markup=False, highlight=False, soft_wrap=True)
        if frame.attrs.get("note"):  # how the table's statistics were made (e.g. clusters resampled)
            console.print(f"_{frame.attrs['note']}_", markup=False, highlight=False, soft_wrap=True)
    if report.paper:  # --paper: what of the paper the run can be set beside, even when nothing is
        console.print(report.paper, markup=False, highlight=False, soft_wrap=True)


def _named_metavars(command: Any) -> Any:
    """Every option's and argument's value shown by its name in --help, as argparse does (`--out OUT`, `SPEC`):
    typer would show the Python type (`<str>`, `<list[str]>`). Flags take no value; a metavar given is kept."""
    for param in command.params:
        if param.metavar is None and not getattr(param, "is_flag", False):
            param.metavar = param.name.upper()
        if param.param_type_name == "argument":  # typer adds the type after an argument's name: its help says it
            param.display_type = lambda ctx: None
    for sub_command in getattr(command, "commands", {}).values():
        _named_metavars(sub_command)
    return command


def main() -> None:
    try:
        _named_metavars(typer.main.get_command(app)).main(args=_ray_default(sys.argv[1:]), standalone_mode=False)
    except InputError as exc:
        _fail(str(exc), 2)
    except (JudgeError, RunFailure) as exc:
        _fail(str(exc), 1)
    except (typer.Abort, KeyboardInterrupt):
        err_console.print("interrupted: finished samples are saved; rerun the same command to resume")
        sys.exit(130)
    except typer.TyperException as exc:  # usage errors: unknown option, missing argument, bad type
        # an unknown option: click's suggestion is any option that looks alike, even an unrelated one (typer vendors
        # click, so its NoSuchOption class is private: it is known by its option_name)
        unknown = getattr(exc, "option_name", None) if type(exc).__name__ == "NoSuchOption" else None
        ctx = getattr(exc, "ctx", None)
        _fail(_no_such_option(unknown, ctx) if unknown and ctx else exc.format_message(), getattr(exc, "exit_code", 2))


def _ray_default(args: list[str]) -> list[str]:
    """`--ray` alone means a local Ray instance: Typer options take a value, so the CLI supplies `local`."""
    return [
        item
        for i, arg in enumerate(args)
        for item in (
            [arg, "local"] if arg == "--ray" and (i + 1 == len(args) or args[i + 1].startswith("-")) else [arg]
        )
    ]


def _no_such_option(option: str, ctx: Any) -> str:
    """The unknown option, then the command's own options: a task's (`run quantize`), else every option it takes."""
    command = ctx.command
    task = TASKS.get(command.name) if ctx.parent is not None and ctx.parent.info_name == "run" else None
    declared = fields(task.options) if task else ()
    own = {(f.metadata.get("flag") or "--" + f.name.replace("_", "-")).split("/")[0] for f in declared}
    flags = [
        param.opts[0]
        for param in command.params
        if param.param_type_name == "option" and param.opts[0].startswith("--") and (not task or param.opts[0] in own)
    ]
    taken = f"its own options are {', '.join(flags)}" if flags else "it takes no options"
    close = difflib.get_close_matches(option, flags, n=1)
    guess = f"did you mean {close[0]}? " if close else ""
    return f"No such option: {option} ({ctx.command_path}); {guess}{taken}; all of them: {ctx.command_path} --help"


def _fail(message: str, code: int) -> None:
    if message:  # `diffeval` alone prints its help, then exits 2 with no message
        err_console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    sys.exit(code)
