"""Deterministic CPU training of the toy DIFF / baseline pair on diffeval's synthetic retrieval corpus.

Everything that shapes the weights is a function of the TrainConfig: the tokenizer is trained from the corpus
generator with a fixed seed, batch b of step s is document `s * batch + b` of the current curriculum length,
and single-threaded CPU kernels are deterministic. A checkpoint (model, optimizer, step, stage) is written every
few minutes into the work folder; rerunning the same command resumes from it and reaches the same weights.
"""

from __future__ import annotations

import csv
import json
import math
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import GenerationConfig, PreTrainedTokenizerFast

from diffeval.errors import InputError
from diffeval.models.tiny import KINDS, tiny_config, train_tokenizer
from diffeval.toy.corpus import DocumentMaker, tokenizer_texts
from diffeval.toy.evaluate import needle_accuracy

LOG_FIELDS = ["step", "length", "loss", "answer_loss", "lr", "seconds", "val_accuracy"]
# written into --out when training starts there: the run's settings, so that a rerun of the same run resumes into the
# folder and nothing else (another run, a model trained elsewhere) is ever replaced
RUN_MARKER = "diffeval_toy_run.json"
CHECKPOINT_KEYS = {"config", "model", "optimizer", "step", "stage", "seconds"}  # what save_checkpoint writes


@dataclass
class TrainConfig:
    kind: str  # diff (V1) | diff2 (V2) | base
    out: str  # the shipped model folder (config, weights, tokenizer)
    work: str  # checkpoint and loss log
    steps: int = 4400
    seed: int = 0  # model initialisation
    data_seed: int = 0  # corpus documents
    vocab_size: int = 2048
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    head_dim: int = 32
    ffn: int = 384
    lr: float = 1e-3
    warmup: int = 100
    weight_decay: float = 0.1
    tokens_per_step: int = 2048  # small batches: more optimizer updates per CPU-minute
    lengths: list[int] = field(default_factory=lambda: [128, 256, 512, 1024])
    # a stage ends when held-out retrieval at its length reaches advance_accuracy, or at the latest after
    # its share of the steps, so the final length always gets trained
    stage_max_fraction: list[float] = field(default_factory=lambda: [0.5, 0.65, 0.8, 1.0])
    advance_accuracy: float = 0.9
    answer_weight: float = 3.0
    copy_share: float = 0.25  # share of documents that are pure repeated random spans (see DocumentMaker)
    eval_every: int = 100
    eval_samples: int = 4  # per depth, over depths 0/25/50/75/100
    checkpoint_minutes: float = 3.0


def build_tokenizer(config: TrainConfig, resuming: bool) -> PreTrainedTokenizerFast:
    out = Path(config.out)
    if resuming and (out / "tokenizer.json").is_file():  # a tokenizer left by anything else is not this run's
        return PreTrainedTokenizerFast.from_pretrained(out)
    return train_tokenizer(tokenizer_texts(), config.vocab_size, out)


def claim_folders(config: TrainConfig, overwrite: bool = False) -> bool:
    """Before anything is written: may this run write into --out and --work? True when they are this run's own (the
    same settings started there: a rerun resumes). A non-empty folder needs `overwrite`; a model or checkpoint that
    another run (or anything but `toy train`) wrote is refused even then. On success --out holds the run's marker."""
    out, work = Path(config.out), Path(config.work)
    settings = asdict(config)
    for flag, folder in (("--out", out), ("--work", work)):
        check_folder(flag, folder)
    if out.resolve() == work.resolve() or out.resolve() in work.resolve().parents:
        raise InputError(f"--work {work} is --out {out} or inside it: give --work a folder of its own, e.g. {out}.work")
    if work.resolve() in out.resolve().parents:
        raise InputError(f"--out {out} is inside --work {work}: give --out a folder of its own")
    started = _read_json(out / RUN_MARKER)
    ours = started == settings
    if not ours and _non_empty(out):
        holds_model = (out / "config.json").is_file() or any(out.glob("*.safetensors"))
        if holds_model and started is None:
            raise InputError(
                f"--out {out} holds a model that `diffeval toy train` did not start (no {RUN_MARKER}): it is never "
                "replaced, even with --overwrite; give a new folder"
            )
        if holds_model:
            raise InputError(
                f"--out {out} holds a model trained with other settings ({_differences(started, settings)}): it is "
                f"never replaced, even with --overwrite; give a new folder, or rerun with the settings in "
                f"{out / RUN_MARKER} to resume it"
            )
        if not overwrite:
            raise InputError(f"--out {out} is not empty: give a new or empty folder, or --overwrite to write into it")
    checkpoint = work / "checkpoint.pt"
    if checkpoint.is_file():
        state = read_checkpoint(checkpoint)
        if state["config"] != settings:
            raise InputError(
                f"--work {work} holds a checkpoint of other settings ({_differences(state.get('config'), settings)}): "
                "it is never replaced, even with --overwrite; give a new --work folder, or rerun with its settings"
            )
    elif _non_empty(work) and _read_json(work / "config.json") != settings and not overwrite:
        raise InputError(f"--work {work} is not empty: give a new or empty folder, or --overwrite to write into it")
    out.mkdir(parents=True, exist_ok=True)
    (out / RUN_MARKER).write_text(json.dumps(settings, indent=2))
    return ours


def check_folder(flag: str, folder: Path) -> None:
    """`folder` is a folder, or one that can be made: no file stands where it or a folder above it would be."""
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{flag} {folder} is a file: give a folder")
    above = next(parent for parent in folder.absolute().parents if parent.exists())
    if not above.is_dir():
        raise InputError(f"{flag} {folder} cannot be made: {above} is a file, not a folder; give a new folder")


def read_checkpoint(path: Path) -> dict:
    """A work folder's checkpoint.pt as `save_checkpoint` wrote it, or one line saying it is not one."""
    try:
        state = torch.load(path, weights_only=False, map_location="cpu")
    except Exception as exc:  # a truncated or foreign file: pickle, zip and torch each raise their own
        raise InputError(f"{path} is not a checkpoint `diffeval toy train` wrote ({type(exc).__name__}): delete it to "
                         "start over, or give the work folder of another run") from None  # fmt: skip
    if not isinstance(state, dict) or not CHECKPOINT_KEYS <= state.keys() or not isinstance(state["config"], dict):
        raise InputError(f"{path} is not a checkpoint `diffeval toy train` wrote (it lacks "
                         f"{', '.join(sorted(CHECKPOINT_KEYS))}): delete it to start over, or give the work folder of "
                         "another run")  # fmt: skip
    return state


def _non_empty(folder: Path) -> bool:
    return folder.is_dir() and any(folder.iterdir())


def _read_json(path: Path):
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None


def _differences(found, settings: dict) -> str:
    """The settings that differ, as `name found → this run's` (at most three)."""
    found = found if isinstance(found, dict) else {}
    changed = [k for k in settings if found.get(k) != settings[k]]
    shown = ", ".join(f"{k} {found.get(k)!r} → {settings[k]!r}" for k in changed[:3])
    return shown + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")


def build_model(config: TrainConfig, vocab_size: int):
    torch.manual_seed(config.seed)
    model_config = tiny_config(
        config.kind,
        vocab_size,
        hidden=config.hidden,
        layers=config.layers,
        heads=config.heads,
        kv_heads=config.heads,
        head_dim=config.head_dim,
        ffn=config.ffn,
        max_positions=65536,
    )
    model_config._attn_implementation = "sdpa"
    return KINDS[config.kind][1](model_config)


def parameter_matched_ffn(kind: str, hidden: int, heads: int, head_dim: int, ffn: int) -> int:
    """The FFN width at which a `kind` model has the baseline's parameter count (to within one FFN column).

    V1 adds only the λ vectors (4 × head_dim per layer), so it keeps `ffn`. V2's q_proj makes h more query heads
    (h × head_dim × hidden more weights) and its lambda_proj adds h × hidden; an FFN column costs 3 × hidden
    (gate, up, down), so V2 gives up that many columns.
    """
    if kind != "diff2":
        return ffn
    extra = heads * head_dim * hidden + heads * hidden
    return ffn - round(extra / (3 * hidden))


def learning_rate(config: TrainConfig, step: int) -> float:
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(config.steps - config.warmup, 1)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def weighted_loss(model, ids: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Dense next-token loss weighted per target token; also the mean loss on answer tokens alone."""
    logits = model(input_ids=ids).logits[:, :-1].float()
    targets, target_weights = ids[:, 1:], weights[:, 1:]
    per_token = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    loss = (per_token * target_weights).sum() / target_weights.sum()
    answers = target_weights > 1
    answer_loss = per_token[answers].mean().item() if answers.any() else float("nan")
    return loss, answer_loss


def train(config: TrainConfig, log: Callable[[str], None] = print, overwrite: bool = False) -> Path:
    resuming = claim_folders(config, overwrite)
    torch.set_num_threads(1)  # the pair trains side by side, one core each; one thread is also deterministic
    torch.use_deterministic_algorithms(True)
    random.seed(config.seed)
    out, work = Path(config.out), Path(config.work)
    work.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(config, resuming)
    maker = DocumentMaker(tokenizer, answer_weight=config.answer_weight, copy_share=config.copy_share)
    model = build_model(config, len(tokenizer))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=config.weight_decay)
    checkpoint_path, log_path = work / "checkpoint.pt", work / "loss.csv"
    step, stage, elapsed = 0, 0, 0.0
    if checkpoint_path.is_file():
        state = read_checkpoint(checkpoint_path)  # claim_folders checked its settings are this run's
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, stage, elapsed = state["step"], state["stage"], state["seconds"]
        log(f"resumed at step {step} (length {config.lengths[stage]})")
        _truncate_log(log_path, step)
    else:
        (work / "config.json").write_text(json.dumps(asdict(config), indent=2))
        with log_path.open("w", newline="") as f:
            csv.writer(f).writerow(LOG_FIELDS)
    log(f"{config.kind}: {sum(p.numel() for p in model.parameters()):,} parameters")

    def save_checkpoint() -> None:
        state = {
            "config": asdict(config),
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "step": step,
            "stage": stage,
            "seconds": elapsed,
        }
        torch.save(state, checkpoint_path.with_suffix(".tmp"))
        checkpoint_path.with_suffix(".tmp").replace(checkpoint_path)  # never leave a half-written checkpoint

    started, last_checkpoint = time.monotonic() - elapsed, time.monotonic()
    model.train()
    while step < config.steps:
        length = config.lengths[stage]
        batch = max(config.tokens_per_step // length, 1)
        docs = [maker.make(config.data_seed, step * batch + b, length) for b in range(batch)]
        ids = torch.tensor([d.ids for d in docs])
        weights = torch.tensor([d.weights for d in docs])
        lr = learning_rate(config, step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss, answer_loss = weighted_loss(model, ids, weights)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        elapsed = time.monotonic() - started

        accuracy = None
        last_stage = stage == len(config.lengths) - 1
        if step % config.eval_every == 0 or step == config.steps:
            accuracy = needle_accuracy(model, tokenizer, length, config.eval_samples)
            log(
                f"step {step} length {length} loss {loss.item():.3f} answer {answer_loss:.3f} "
                f"val {accuracy:.2f} ({elapsed / 60:.1f} min)"
            )
            if not last_stage and accuracy >= config.advance_accuracy:
                stage += 1
        if not last_stage and step >= config.stage_max_fraction[stage] * config.steps:
            stage += 1
        with log_path.open("a", newline="") as f:
            row = [
                step,
                length,
                f"{loss.item():.4f}",
                f"{answer_loss:.4f}",
                f"{lr:.6f}",
                f"{elapsed:.1f}",
                "" if accuracy is None else f"{accuracy:.3f}",
            ]
            csv.writer(f).writerow(row)
        if time.monotonic() - last_checkpoint > 60 * config.checkpoint_minutes or step == config.steps:
            save_checkpoint()
            last_checkpoint = time.monotonic()

    export(model, tokenizer, out, log_path)
    log(f"saved {out} after {elapsed / 60:.1f} min")
    return out


def export(model, tokenizer, out: Path, log_path: Path) -> None:
    """The shipped folder: float32 weights, config, generation defaults, tokenizer and the loss log."""
    model.eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    shutil.copyfile(log_path, out / "training_log.csv")


def export_checkpoint(work: str | Path, out: str | Path) -> int:
    """Write a work folder's latest checkpoint as a model folder (e.g. to evaluate or ship an unfinished run)."""
    work, out = Path(work), Path(out)
    state = read_checkpoint(work / "checkpoint.pt")
    check_folder("--out", out)
    if _non_empty(out) and _read_json(out / RUN_MARKER) != state["config"]:
        raise InputError(f"--out {out} is not empty and not this run's model folder: give a new or empty folder")
    try:
        config = TrainConfig(**state["config"])
    except TypeError:  # settings this version does not know
        raise InputError(f"{work / 'checkpoint.pt'} holds settings this diffeval does not know: export it with the "
                         "diffeval that trained it") from None  # fmt: skip
    if not (Path(config.out) / "tokenizer.json").is_file():
        raise InputError(f"the run's --out {config.out} holds no tokenizer.json (its tokenizer is trained there when "
                         "the run starts): export on the machine and folders the run trained in")  # fmt: skip
    tokenizer = PreTrainedTokenizerFast.from_pretrained(config.out)
    model = build_model(config, len(tokenizer))
    model.load_state_dict(state["model"])
    out.mkdir(parents=True, exist_ok=True)
    export(model, tokenizer, out, work / "loss.csv")
    return state["step"]


def _truncate_log(log_path: Path, step: int) -> None:
    """Drop log rows written after the checkpoint being resumed, so a resumed log has no duplicate steps."""
    with log_path.open(newline="") as f:
        rows = list(csv.reader(f))
    kept = [rows[0]] + [r for r in rows[1:] if int(r[0]) <= step]
    with log_path.open("w", newline="") as f:
        csv.writer(f).writerows(kept)
