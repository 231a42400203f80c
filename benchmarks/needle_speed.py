"""Needle task speed, measured in one run at 4K, like for like: on two tiny random models, or with --model on one
real checkpoint (a folder or a .gguf file; a GGUF file is dequantized once into diffeval's safetensors cache and both
harnesses load that folder, so neither pays the GGUF loader).

1. Harness overhead: wall time of `diffeval run needle` (prompt fitting, generation, scoring, records) ÷ the time
   the model itself spends in `generate` on the very same token ids with the same token limit (goal ≤ 1.05).
2. diffeval ÷ lm-eval `niah_single_1`: wall time of the two command lines on the same model and sample count, each
   generating at most --max-new-tokens (lm-eval's `max_gen_toks` set to it; its task default is 128), greedy, with
   the same torch threads (OMP_NUM_THREADS and torch.set_num_threads = --threads) (goal ≤ 0.5). Needs
   `pip install -e .[bench]` (lm-eval, accelerate, wonderwords, nltk); skipped otherwise.

Run: python benchmarks/needle_speed.py [--samples 50] [--ctx 4096] [--threads 1] [--max-new-tokens 32]
     python benchmarks/needle_speed.py --model PATH [--samples 10]   (goal of the harness ratio on a real model: 1.1)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console

from diffeval import runner
from diffeval.data.cities import CITIES
from diffeval.data.haystack import NOISE_SENTENCES
from diffeval.models.checkpoints.loading import load_model
from diffeval.models.engines.hf import HFBackend
from diffeval.models.spec import ModelSpec
from diffeval.models.tiny import build_tiny_model, train_tokenizer
from diffeval.tasks import build_config
from diffeval.tasks.haystack import needle
from diffeval.tasks.haystack.recipe import STOP

DEPTHS = [0, 25, 50, 75, 100]


def build_models(root: Path) -> dict[str, Path]:
    texts = [" ".join(NOISE_SENTENCES)] * 20 + [needle.INSTRUCTION, needle.question(["Rome", "Oslo"])]
    texts += [needle.needle_sentence(city, "1234567") for city in CITIES]
    train_tokenizer(texts, 400, root / "tok")
    paths = {}
    for kind in ("diff", "base"):
        build_tiny_model(kind, root / "tok", root / kind, seed=0)
        paths[kind] = root / kind
    return paths


def harness_overhead(
    name: str, path: Path, ctx: int, samples: int, max_new_tokens: int, out: Path, threads: int = 1
) -> tuple[float, float]:
    """(diffeval wall time, model generate time) for the same samples on one model."""
    flags = {
        "models": [f"{name}={path}"],
        "ctx": str(ctx),
        "depths": DEPTHS,
        "samples": samples // len(DEPTHS),
        "out": str(out),
        "device": "cpu",
        "max_new_tokens": max_new_tokens,
        "threads": threads,  # as the bare generate below (the default would subtract the load average)
    }
    config = build_config("needle", {}, flags)
    start = time.perf_counter()
    runner.run(config, Console(quiet=True))
    harness = time.perf_counter() - start

    backend = HFBackend(load_model(ModelSpec(name, str(path)), "cpu"))
    prompts = [
        needle.build_prompt(s, backend, s.ctx - config.max_new_tokens, False).ids
        for s in needle.TASK.running.make_samples(config.options, config.seed)
    ]
    model_time = 0.0
    with torch.inference_mode():
        for ids in prompts:
            input_ids = torch.tensor([ids])
            start = time.perf_counter()
            backend.model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                do_sample=False,
                max_new_tokens=config.max_new_tokens,
                stop_strings=STOP,
                tokenizer=backend.tokenizer,
                pad_token_id=backend.tokenizer.pad_token_id,
            )
            model_time += time.perf_counter() - start
    return harness, model_time


def real_model(path: str) -> dict[str, Path]:
    """The checkpoint both harnesses load: the folder itself, or a GGUF file's dequantized safetensors folder."""
    from diffeval.models.checkpoints import gguf

    found = gguf.find(path, "real")
    return {"real": gguf.dequantized(found, "real") if found else Path(path).expanduser()}


def timed(command: list[str], threads: int) -> float:
    start = time.perf_counter()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{command[0]} failed:\n{result.stderr[-2000:]}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=50, help="samples per model (a multiple of 5 depths)")
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=1, help="torch threads, in this process and both commands")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="the generation limit of both harnesses")
    parser.add_argument("--model", help="a real checkpoint (folder or .gguf) instead of the two tiny random models")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        models = real_model(args.model) if args.model else build_models(root)
        what = f"the checkpoint {args.model}" if args.model else "tiny random models"
        goal = 1.1 if args.model else 1.05
        print(f"# needle speed at ctx {args.ctx}, {args.samples} samples per model, CPU, {args.threads} torch "
              f"thread(s), at most {args.max_new_tokens} new tokens, greedy, {what}, "
              f"{time.strftime('%Y-%m-%d')}\n")  # fmt: skip
        print(f"model | diffeval wall s (incl. loading weights) | model generate s | ratio (goal <= {goal})")
        print("--- | --- | --- | ---")
        for name, path in models.items():
            harness, model_time = harness_overhead(
                name, path, args.ctx, args.samples, args.max_new_tokens, root / f"run-{name}", args.threads
            )
            print(f"{name} | {harness:.2f} | {model_time:.2f} | {harness / model_time:.3f}")

        if importlib.util.find_spec("lm_eval") is None:
            print("\nlm-eval not installed: skipped the lm-eval comparison (pip install -e .[bench])")
            return
        lm_eval_ratio(str(models.get("base", models.get("real"))), args, root)


def lm_eval_ratio(base: str, args, root: Path) -> float:
    """Wall time of diffeval's and lm-eval's needle command lines on one model, same samples and limits; prints both,
    returns diffeval ÷ lm-eval."""
    ours = timed(
        [
            sys.executable,
            "-m",
            "diffeval",
            "run",
            "needle",
            "-m",
            f"base={base}",
            "--ctx",
            str(args.ctx),
            "--depths",
            ",".join(map(str, DEPTHS)),
            "--samples",
            str(args.samples // len(DEPTHS)),
            "--device",
            "cpu",
            "--max-new-tokens",
            str(args.max_new_tokens),
            "--threads",
            str(args.threads),
            "--out",
            str(root / "cli-run"),
        ],
        args.threads,
    )
    lm_eval = timed(
        [
            sys.executable,
            "-m",
            "lm_eval",
            "--model",
            "hf",
            "--model_args",
            f"pretrained={base},dtype=float32",
            "--tasks",
            "niah_single_1",
            "--limit",
            str(args.samples),
            "--metadata",
            json.dumps({"max_seq_lengths": [args.ctx]}),
            "--device",
            "cpu",
            "--batch_size",
            "1",
            "--gen_kwargs",
            f"max_gen_toks={args.max_new_tokens},do_sample=False",
        ],
        args.threads,
    )
    print(f"\ncommand line, {Path(base).name} | wall s")
    print("--- | ---")
    print(f"diffeval run needle | {ours:.1f}")
    print(f"lm_eval niah_single_1 | {lm_eval:.1f}")
    print(f"ratio diffeval / lm-eval (goal <= 0.5) | {ours / lm_eval:.3f}")
    return ours / lm_eval


if __name__ == "__main__":
    main()
