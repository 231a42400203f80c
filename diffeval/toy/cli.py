"""`diffeval toy ...`: train the toy DIFF / baseline pair and plot their loss curves."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from diffeval.errors import InputError

toy_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,  # as the rest of the CLI: click's layout keeps option names whole at 80 columns
    help="Train the tiny matched DIFF / baseline pair shipped in toy_models.",
)

Opt = typer.Option


@toy_app.command("train")
def train_command(
    kind: Annotated[
        str, Opt(help="diff (DiffLlamaForCausalLM, V1) | diff2 (DiffLlama2ForCausalLM, V2) | base (LlamaForCausalLM)")
    ],
    out: Annotated[str, Opt(help="model folder to write (config, weights, tokenizer)")],
    work: Annotated[str | None, Opt(help="checkpoint and loss-log folder [default: OUT.work]")] = None,
    steps: Annotated[int, Opt(help="optimizer steps")] = 4400,
    seed: Annotated[int, Opt(help="model initialisation seed")] = 0,
    data_seed: Annotated[int, Opt(help="corpus seed")] = 0,
    tokens_per_step: Annotated[int, Opt(help="tokens per batch at every curriculum length")] = 2048,
    lr: Annotated[float, Opt(help="peak AdamW learning rate")] = 1e-3,
    overwrite: Annotated[
        bool, Opt("--overwrite", help="write into a non-empty --out or --work (never over a model another run wrote)")
    ] = False,
) -> None:
    """Train one model (resumes from WORK/checkpoint.pt when present)."""
    if kind not in ("diff", "diff2", "base"):
        raise typer.BadParameter("use diff, diff2 or base", param_hint="--kind")
    for flag, value in (("--steps", steps), ("--tokens-per-step", tokens_per_step)):
        if value < 1:
            raise InputError(f"{flag} {value}: give a positive whole number")
    if not 0 < lr < float("inf"):
        raise InputError(f"--lr {lr}: give a positive learning rate, e.g. 1e-3")
    from diffeval.toy.train import TrainConfig, parameter_matched_ffn, train

    sizes = TrainConfig(kind=kind, out=out, work="")
    whole = math.lcm(*sizes.lengths)
    if tokens_per_step % whole:  # a batch is whole documents of each curriculum length: nothing is cut or padded
        raise InputError(f"--tokens-per-step {tokens_per_step}: give a multiple of {whole} (whole documents at every "
                         f"curriculum length, {', '.join(map(str, sizes.lengths))}), e.g. 2048")  # fmt: skip
    config = TrainConfig(
        kind=kind,
        out=out,
        work=work or f"{out.rstrip('/')}.work",
        steps=steps,
        seed=seed,
        data_seed=data_seed,
        tokens_per_step=tokens_per_step,
        lr=lr,
        ffn=parameter_matched_ffn(kind, sizes.hidden, sizes.heads, sizes.head_dim, sizes.ffn),
    )
    train(config, log=lambda line: typer.echo(line, err=True), overwrite=overwrite)


@toy_app.command("export")
def export_command(
    work: Annotated[str, Opt(help="work folder holding checkpoint.pt")],
    out: Annotated[str, Opt(help="model folder to write")],
) -> None:
    """Save a work folder's latest checkpoint as a loadable model folder."""
    from diffeval.toy.train import export_checkpoint

    if not (Path(work) / "checkpoint.pt").is_file():
        raise InputError(f"--work {work} holds no checkpoint.pt: give the work folder of `diffeval toy train`")
    step = export_checkpoint(work, out)
    typer.echo(f"{out}: step {step}")


@toy_app.command("plot")
def plot_command(
    logs: Annotated[list[str], typer.Argument(help="NAME=LOSS_CSV, e.g. toy-diff=.../training_log.csv")],
    out: Annotated[str, Opt(help="PNG file to write")] = "loss.png",
) -> None:
    """Loss curves of several training logs in one figure."""
    from diffeval.toy.plot import plot_losses

    named: dict[str, str] = {}
    for item in logs:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise InputError(f"bad log {item!r}: give NAME=LOSS_CSV, e.g. toy-diff=work/training_log.csv")
        if not Path(path).is_file():
            what = "is a folder" if Path(path).is_dir() else "does not exist"
            raise InputError(f"loss log {path} {what}: give the training_log.csv of a work folder")
        if name in named:
            raise InputError(f"NAME {name} is given twice ({named[name]} and {path}): give each curve its own NAME")
        named[name] = path
    target = Path(out)
    if target.suffix.lower() != ".png" or target.is_dir():
        raise InputError(f"--out {out} is not a PNG file name: give one ending in .png, e.g. loss.png")
    above = next(parent for parent in target.absolute().parents if parent.exists())
    if not above.is_dir():
        raise InputError(f"--out {out} cannot be written: {above} is a file, not a folder")
    plot_losses(named, out)
    typer.echo(out)
