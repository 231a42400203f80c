"""The diffeval command line: options → RunConfig → runner. No evaluation logic lives here."""

from __future__ import annotations

import inspect
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from diffeval.config import ModelSpec, build_config, load_yaml
from diffeval.errors import InputError
from diffeval.judges import JudgeError
from diffeval.toy.cli import toy_app

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Evaluate Differential-Transformer models against baselines on long-context tasks.",
)
run_app = typer.Typer(no_args_is_help=True, help="Run an evaluation task.")
models_app = typer.Typer(no_args_is_help=True, help="Inspect model checkpoints.")
app.add_typer(run_app, name="run")
app.add_typer(models_app, name="models")
app.add_typer(toy_app, name="toy")

console = Console()
err_console = Console(stderr=True)

Opt = typer.Option


# Options every task shares; each `diffeval run TASK` command adds its own. All default to None so that a YAML
# preset can supply them and flags override it.
COMMON_OPTIONS = {
    "model": Annotated[list[str] | None, Opt("--model", "-m", help="NAME=PATH_OR_HUB_ID[:diff|:base]; repeatable")],
    "config": Annotated[str | None, Opt(help="YAML preset file or shipped preset name; flags override it")],
    "ctx": Annotated[str | None, Opt(help="context lengths: 4k, 64K, 65536 or a comma list (k = 1024)")],
    "seed": Annotated[int | None, Opt(help="seed of the sample content [default: 0]")],
    "out": Annotated[str | None, Opt(help="run folder [default: results/TASK-<config hash>]")],
    "device": Annotated[str | None, Opt(help="auto | cpu | cuda")],
    "dtype": Annotated[str | None, Opt(help="auto (fp32 on CPU, bf16 on CUDA) | float32 | bfloat16 | float16")],
    "attn_impl": Annotated[str | None, Opt(help="transformers attention implementation [default: sdpa]")],
    "batch_size": Annotated[int | None, Opt(help="samples per backend call [default: 1]")],
    "limit": Annotated[int | None, Opt(help="cap samples per cell (quick runs, CI)")],
    "overwrite": Annotated[bool | None, Opt("--overwrite", help="replace a run folder holding another config")],
    "trust_remote_code": Annotated[bool | None, Opt("--trust-remote-code", help="allow custom model code")],
    "allow_overlength": Annotated[bool | None, Opt("--allow-overlength", help="allow ctx beyond max positions")],
}
NEEDLE_SAMPLE_OPTIONS = {
    "needles": Annotated[str | None, Opt(help="N, needles per sample; a comma list runs several N/R settings")],
    "queries": Annotated[str | None, Opt(help="R, needles queried per sample; one value or one per N")],
    "depths": Annotated[str | None, Opt(help="depths of the first queried needle in percent, e.g. 0,25,50,75,100")],
    "samples": Annotated[int | None, Opt(help="samples per depth × length × N/R cell")],
    "haystack": Annotated[str | None, Opt(help="noise | essays:PATH | hf:DATASET[:SPLIT[:FIELD]]")],
    "chat_template": Annotated[
        bool | None, Opt("--chat-template/--no-chat-template", help="use the model's chat template [default: off]")
    ],
    "max_new_tokens": Annotated[int | None, Opt(help="tokens to generate; also reserved in the budget [default: 32]")],
}
TASK_OPTIONS = {
    "needle": NEEDLE_SAMPLE_OPTIONS,
    "attention": {
        **NEEDLE_SAMPLE_OPTIONS,
        "rows": Annotated[
            str | None,
            Opt(help="last: the last prompt token's row | answer: also teacher-forced answer rows [default: last]"),
        ],
        "span": Annotated[
            str | None, Opt(help="answer: the number's tokens | needle: the whole needle sentence [default: answer]")
        ],
    },
    "icl": {
        "datasets": Annotated[str | None, Opt("--dataset", help="trec, trec-fine, banking77, clinic150; comma list")],
        "shots": Annotated[str | None, Opt(help="demonstrations per prompt, comma list; max fills the context")],
        "orders": Annotated[str | None, Opt(help="random:K, alternating:K, grouped[:K]; comma list")],
        "test_size": Annotated[int | None, Opt(help="test queries per dataset [default: 250]")],
        "draws": Annotated[int | None, Opt(help="independent demonstration draws [default: 1]")],
        "data_dir": Annotated[str | None, Opt(help="read local files in the ../shared/datasets layout, not the hub")],
        "test_indices": Annotated[str | None, Opt(help="JSON list of test rows, or a folder of <name>-indices.txt")],
        "length_norm": Annotated[bool | None, Opt("--length-norm", help="score labels by mean token log-prob")],
    },
}
TASK_OPTIONS["hallucination"] = {
    "datasets": Annotated[str | None, Opt("--dataset", help="xsum, cnndm, multi_news, qasper, hotpotqa, 2wikimqa")],
    "samples": Annotated[int | None, Opt(help="documents per dataset (the first N) [default: 100]")],
    "judge": Annotated[
        str | None,
        Opt(help="required: openai:MODEL | openai-compatible:BASE_URL#MODEL | hf:PATH | overlap (offline proxy)"),
    ],
    "data_dir": Annotated[str | None, Opt(help="read local JSONL files (../shared/datasets/hallucination layout)")],
    "judge_cache": Annotated[str | None, Opt(help="verdict cache folder [default: ~/.cache/diffeval]")],
    "judge_timeout": Annotated[float | None, Opt(help="seconds per judge request [default: 60]")],
    "judge_retries": Annotated[int | None, Opt(help="retries on 429, 5xx and timeouts [default: 5]")],
    "judge_concurrency": Annotated[int | None, Opt(help="judge requests in flight [default: 4]")],
}
_LM_EVAL_OPTIONS = {
    "lm_tasks": Annotated[str | None, Opt("--tasks", help="lm-eval task names, comma-separated")],
    "include_path": Annotated[str | None, Opt(help="folder of extra lm-eval task YAMLs (e.g. local data files)")],
    "lm_batch_size": Annotated[int | None, Opt(help="lm-eval batch size [default: 8]")],
}
TASK_OPTIONS["outliers"] = {
    "tokens": Annotated[str | None, Opt(help="token budget, e.g. 400k (k = 1024) [default: 400k]")],
    "haystack": NEEDLE_SAMPLE_OPTIONS["haystack"],
}
TASK_OPTIONS["quantize"] = {
    "bits": Annotated[str | None, Opt(help="attention-logit bit widths; 16 = unquantized [default: 16,8,6,4]")],
    "granularity": Annotated[str | None, Opt(help="absmax scale per tensor | head | row [default: row]")],
    **_LM_EVAL_OPTIONS,
}
TASK_OPTIONS["zeroshot"] = dict(_LM_EVAL_OPTIONS)
TASK_HELP = {
    "needle": "Multi-needle needle-in-a-haystack (paper Table 2 / Figure 5).",
    "attention": "Attention-to-answer analysis on needle samples (paper Table 3), DIFF maps decomposed.",
    "icl": "Many-shot in-context learning and order robustness (paper Figures 6 and 7).",
    "hallucination": "Contextual hallucination on summarization and QA (paper Table 4), judged.",
    "outliers": "Largest attention logits and hidden states over a token budget (paper Table 5).",
    "quantize": "Zero-shot accuracy with attention logits quantized to b bits, via lm-eval (paper Figure 8).",
    "zeroshot": "Zero-shot lm-eval benchmarks in the paper's Table 1 layout.",
}


def _run_task(task: str, flags: dict) -> None:
    from diffeval import runner
    from diffeval.report.tables import build_report

    config_path = flags.pop("config")
    flags["models"] = flags.pop("model") or None
    run_config = build_config(task, load_yaml(config_path) if config_path else {}, flags)
    folder = runner.run(run_config, err_console)
    [report] = build_report([folder], ["md", "csv"])
    _print_report(report)
    console.print(f"results: {folder.path}  ({', '.join(p.name for p in report.written)})")


def _register_run_command(task: str) -> None:
    """`diffeval run TASK`: the shared options plus the task's own, as one Typer command."""

    def command(**flags) -> None:
        _run_task(task, flags)

    options = {**COMMON_OPTIONS, **TASK_OPTIONS[task]}
    command.__signature__ = inspect.Signature(
        [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)
            for name, annotation in options.items()
        ]
    )
    command.__doc__ = TASK_HELP[task]
    run_app.command(task)(command)


for _task in TASK_OPTIONS:
    _register_run_command(_task)

ModelOption, DeviceOption = COMMON_OPTIONS["model"], COMMON_OPTIONS["device"]
LimitOption, OverwriteOption = COMMON_OPTIONS["limit"], COMMON_OPTIONS["overwrite"]
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
    device: DeviceOption = None,
    limit: LimitOption = None,
    overwrite: OverwriteOption = None,
    fail_under: FailUnder = None,
    paper: Annotated[bool, Opt("--paper", help="add the paper's numbers where the setting matches")] = False,
) -> None:
    """Several tasks from one preset into one folder, then their reports (and gates)."""
    from diffeval import runner
    from diffeval.report.gates import parse_threshold
    from diffeval.report.tables import build_report
    from diffeval.suite import suite_configs

    gates = [parse_threshold(g) for g in fail_under or []]
    flags = {"models": model or None, "device": device, "limit": limit, "overwrite": overwrite}
    folder, configs = suite_configs(preset, out, flags)
    runs = [runner.run(config, err_console) for config in configs]
    reports = build_report(runs, ["md", "csv", "html"], out=folder / "report", paper=paper)
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
) -> None:
    """Paper-layout tables, plots and paired statistics from run folders' samples.jsonl."""
    from pathlib import Path

    from diffeval.report.gates import parse_threshold, run_folders
    from diffeval.report.tables import build_report, parse_formats

    gates = [parse_threshold(g) for g in fail_under or []]
    folders = run_folders(run_dirs)
    reports = build_report(folders, parse_formats(format), Path(out) if out else None, paper)
    for item in reports:
        _print_report(item)
        if item.damaged:
            err_console.print(f"warning: skipped {item.damaged} damaged line(s) in {item.folder.samples_path}")
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

    table = gates.compare(gates.run_folders([old]), gates.run_folders([new]), max_drop, alpha)
    if table.empty:
        raise InputError(f"{old} and {new} share no task, metric and model: compare runs of the same evaluation")
    console.print(table.to_markdown(index=False, floatfmt=".4f"), markup=False, highlight=False, soft_wrap=True)
    regressed = table[table["regressed"]]
    for row in regressed.itertuples():
        err_console.print(
            f"regression: {row.task}.{row.metric}@{row.model} dropped {row.drop:.4f} "
            f"({row.old:.4f} -> {row.new:.4f}, p = {row.p_value:.4g})",
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


@models_app.command("inspect")
def models_inspect(
    spec: Annotated[str, typer.Argument(help="PATH_OR_HUB_ID[:diff|:base]")],
    device: Annotated[str, Opt(help="auto | cpu | cuda")] = "cpu",
    dtype: Annotated[str, Opt(help="auto | float32 | bfloat16 | float16")] = "auto",
    trust_remote_code: Annotated[bool, Opt("--trust-remote-code")] = False,
) -> None:
    """Architecture summary; for DIFF models λ_init and the learned λ of every layer."""
    from diffeval.models.loading import load_model

    model_spec = ModelSpec.parse(spec)
    info = load_model(model_spec, device, dtype, attn_impl="sdpa", trust_remote_code=trust_remote_code).info
    table = Table(title=f"{info.name}: {info.spec}", show_header=False)
    for label, value in (
        ("class", info.architecture),
        ("DIFF", "yes" if info.is_diff else "no (baseline)"),
        ("layers", info.layers),
        ("attention heads", info.heads),
        ("KV heads", info.kv_heads),
        ("head dim", info.head_dim),
        ("max positions", info.max_positions),
        ("RoPE base", info.rope_theta),
        ("parameters", f"{info.parameters:,}"),
    ):
        table.add_row(label, str(value))
    console.print(table)
    if info.lambdas:
        lambdas = Table(title="λ per layer (λ = exp(λq1·λk1) − exp(λq2·λk2) + λ_init)")
        for column in ("layer", "λ_init", "λ (learned)"):
            lambdas.add_column(column, justify="right")
        for row in info.lambdas:
            lambdas.add_row(str(row["layer"]), f"{row['lambda_init']:.4f}", f"{row['lambda']:.4f}")
        console.print(lambdas)


def _print_report(report) -> None:
    from diffeval.report.tables import title

    for key, frame in report.tables.items():
        console.print(f"[bold]{title(key)}[/bold]", soft_wrap=True)
        console.print(frame.to_markdown(floatfmt=".3f"), markup=False, highlight=False, soft_wrap=True)


def main() -> None:
    try:
        app(standalone_mode=False)
    except InputError as exc:
        _fail(str(exc), 2)
    except JudgeError as exc:
        _fail(str(exc), 1)
    except (typer.Abort, KeyboardInterrupt):
        err_console.print("interrupted: finished samples are saved; rerun the same command to resume")
        sys.exit(130)
    except typer.TyperException as exc:  # usage errors: unknown option, missing argument, bad type
        _fail(exc.format_message(), getattr(exc, "exit_code", 2))


def _fail(message: str, code: int) -> None:
    if message:  # `diffeval` alone prints its help, then exits 2 with no message
        err_console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    sys.exit(code)
