"""Memory and time of the nll task's one backend call (`token_nll` on hf) against a plain forward, measured in one run.

At L positions the logits alone are L × vocab floats: 6.4 GB for SmolLM2-135M (49,152 tokens) at 32K in fp32, 12.8 GB
at 64K. `token_nll` runs the decoder once and the LM head and the loss over slices of positions, so it should cost
about what the decoder's forward costs. Goals: its peak memory ≤ 1.5× that of a plain forward of the decoder that
returns no logits, and its wall time ≤ 1.2× it.

Each measurement runs in a fresh child process on the same ids (a book from the shared data, else the book the
package ships), which loads the model (fp32, sdpa), then records its resident memory (the baseline), runs one of:
- `forward`: `model.get_decoder()(ids, use_cache=False)`, the hidden states only;
- `token_nll`: diffeval's hf backend's `token_nll(ids)`;
and reports the wall time and the process's peak resident memory (ru_maxrss); "above the model" subtracts the
baseline. `--full-logits` adds `model(ids).logits` with a log-softmax, the naive way, for scale (it needs the memory).

Run: python benchmarks/nll_memory.py --model PATH [--ctx 32k] [--threads 2]
     python benchmarks/nll_memory.py (the built-in pair at 64K, --allow-overlength's extrapolation: toy-diff and
     toy-base, whose 2,048-token vocabulary makes the logits small)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

SHARED_BOOK = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "books" / "melville-moby-dick.txt"


def book_text() -> str:
    if SHARED_BOOK.is_file():
        return SHARED_BOOK.read_text(encoding="utf-8")
    from diffeval.data import books

    return books.load("books", None)[0].text


def measure(model: str, ctx: int, mode: str, threads: int) -> dict:
    """In a child process: load, then one measurement; the ids are the book's first ctx − 1 tokens after the start."""
    import torch

    from diffeval.models.backend import EngineSettings, make_backend
    from diffeval.models.engines.hf_options import HFOptions
    from diffeval.models.spec import ModelSpec

    torch.set_num_threads(threads)
    settings = EngineSettings(
        device="cpu", dtype="float32", max_model_len=ctx, allow_overlength=True, options=HFOptions(threads=threads)
    )
    backend = make_backend(ModelSpec("m", model), settings, "hf")
    text = book_text()
    ids = backend.document_start()
    ids = (ids + backend.encode(text[: ctx * 12], special_tokens=False).ids)[: ctx - 1]
    if len(ids) < ctx - 1:
        raise SystemExit(f"the book holds only {len(ids)} tokens of this model: use a shorter --ctx")
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    began = time.perf_counter()
    with torch.inference_mode():
        if mode == "forward":
            backend.model.get_decoder()(input_ids=torch.tensor([ids]), use_cache=False)
        elif mode == "token_nll":
            backend.token_nll(ids)
        else:
            logits = backend.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, :-1]
            torch.log_softmax(logits.float(), dim=-1)
    seconds = time.perf_counter() - began
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    vocab = backend.model.config.vocab_size
    return {"mode": mode, "tokens": len(ids), "vocab": vocab, "seconds": seconds, "loaded": loaded, "peak": peak}


def child(model: str, ctx: int, mode: str, threads: int) -> dict:
    command = [sys.executable, __file__, "--child", mode, "--model", model, "--ctx", str(ctx)]
    command += ["--threads", str(threads)]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        raise SystemExit(f"{mode} failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def gib(value: float) -> str:
    return f"{value / 2**30:.2f} GiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", help="a checkpoint (folder, GGUF file or built-in name)")
    parser.add_argument("--ctx", default=None, help="tokens per pass, e.g. 32k [default: 32k, or 64k for the pair]")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--full-logits", action="store_true", help="also time the naive full-logits forward")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    from diffeval.config import parse_ctx

    models = args.model or ["toy-diff", "toy-base"]
    ctx = parse_ctx(args.ctx or ("32k" if args.model else "64k"))[0]
    if args.child:
        print(json.dumps(measure(models[0], ctx, args.child, args.threads)))
        return
    print(f"nll memory, {time.strftime('%Y-%m-%d')}, {args.threads} threads, fp32, ctx {ctx:,}")
    for model in models:
        modes = ["forward", "token_nll"] + (["full_logits"] if args.full_logits else [])
        runs = {mode: child(model, ctx, mode, args.threads) for mode in modes}
        base, ours = runs["forward"], runs["token_nll"]
        logits = base["tokens"] * base["vocab"] * 4
        print(f"\n{model}: {base['tokens']:,} tokens, vocabulary {base['vocab']:,} (all logits: {gib(logits)})")
        for mode, run in runs.items():
            above = run["peak"] - run["loaded"]
            print(f"  {mode:12s} {run['seconds']:8.1f} s   peak {gib(run['peak'])}   above the model {gib(above)}")
        memory, seconds = ours["peak"] / base["peak"], ours["seconds"] / base["seconds"]
        print(f"  token_nll ÷ forward: peak memory {memory:.3f} (goal ≤ 1.5), time {seconds:.3f} (goal ≤ 1.2)")


if __name__ == "__main__":
    main()
