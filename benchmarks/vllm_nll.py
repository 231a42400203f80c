"""The nll task's one backend call (`token_nll`) on vLLM against hf, per window length, measured in one run.

One window of a book's first L − 1 tokens (after the model's document start) at each length (default 2K, 4K, 8K,
16K). Each engine runs in its own child process, loaded once, pinned to the same cores (vLLM's OpenMP threads bound to
them, hf with one torch thread per core), with the settings `diffeval run nll` gives it (fp32, `--max-model-len` the
longest length, `--allow-overlength`, each engine's default batch size and so vLLM's default KV cache on CPU). The two
children take turns, length by length, so both see about the same load from the rest of the machine; the load average
is printed beside each figure (hf / vLLM), and with `--repeats` the fastest of each counts. After loading, each scores
a 64-token window once (first-call costs are left out).

Per length: seconds on hf and on vLLM and their ratio (the goal: vLLM ÷ hf ≤ 1); with `--breakdown`, vLLM's time for
the same window without prompt log-probs (prefill and one token: what the log-probs over the vocabulary add is the
difference); and max and mean |Δ| between the two engines' per-token NLL (nats).

A length at which one engine took over `--give-up-s` seconds ends the run after that length.

Run: python benchmarks/vllm_nll.py --model PATH [--lengths 2k,4k,8k,16k] [--threads 2] [--breakdown] [--repeats 1]
     [--keep DIR] [--vllm-python PYTHON]   (PATH: a checkpoint; the SmolLM2-135M-Instruct GGUF file of the tests, say)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CORES = sorted(os.sched_getaffinity(0))
SHARED_BOOK = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "books" / "melville-moby-dick.txt"


def book_text() -> str:
    if SHARED_BOOK.is_file():
        return SHARED_BOOK.read_text(encoding="utf-8")
    from diffeval.data import books

    return books.load("books", None)[0].text


def serve(engine: str, model: str, longest: int, threads: int, out: str, breakdown: bool) -> None:
    """A child: load the engine, then read a length per stdin line, score that window and answer one JSON line."""
    os.sched_setaffinity(0, CORES[:threads])
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"{CORES[0]}-{CORES[threads - 1]}"
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    import numpy as np
    import torch

    from diffeval.models.backend import EngineSettings, default_batch_size, make_backend
    from diffeval.models.engines.hf_options import HFOptions
    from diffeval.models.spec import ModelSpec

    torch.set_num_threads(threads)
    settings = EngineSettings(
        device="cpu",
        dtype="float32",
        max_model_len=longest,
        allow_overlength=True,
        batch_size=default_batch_size(engine),
        options=HFOptions(threads=threads) if engine == "hf" else None,
    )
    start = time.perf_counter()
    backend = make_backend(ModelSpec("m", model), settings, engine)
    loaded = time.perf_counter() - start
    ids = backend.document_start()
    ids = (ids + backend.encode(book_text()[: longest * 12], special_tokens=False).ids)[: longest - 1]
    if len(ids) < longest - 1:
        raise SystemExit(f"the book holds only {len(ids)} tokens of this model: use shorter --lengths")
    backend.token_nll(ids[:64])
    print(json.dumps({"load_s": loaded}), flush=True)
    for line in sys.stdin:
        length = int(line)
        window = ids[: length - 1]
        began = time.perf_counter()
        nll = backend.token_nll(window)
        result = {"seconds": time.perf_counter() - began, "load": os.getloadavg()[0]}
        np.save(Path(out) / f"{engine}-{length}.npy", nll)
        if breakdown and engine == "vllm":
            from vllm import SamplingParams
            from vllm.inputs import TokensPrompt

            params = SamplingParams(temperature=0.0, max_tokens=1, detokenize=False, skip_reading_prefix_cache=True)
            began = time.perf_counter()
            backend.llm.generate([TokensPrompt(prompt_token_ids=window)], params, use_tqdm=False)
            result["prefill_s"] = time.perf_counter() - began  # the same window, no prompt log-probs
        print(json.dumps(result), flush=True)
    backend.close()


class Child:
    def __init__(self, python: str, engine: str, args, out: str):
        command = [python, __file__, "--child", engine, "--model", args.model, "--lengths", args.lengths]
        command += ["--threads", str(args.threads), "--out", out] + (["--breakdown"] if args.breakdown else [])
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        self.engine = engine
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.ready = self.answer()

    def answer(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"the {self.engine} child ended (exit code {self.process.wait()}): see its stderr above")
        return json.loads(line)

    def score(self, length: int) -> dict:
        self.process.stdin.write(f"{length}\n")
        self.process.stdin.flush()
        return self.answer()

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a checkpoint (folder or GGUF file)")
    parser.add_argument("--lengths", default="2k,4k,8k,16k")
    parser.add_argument("--threads", type=int, default=min(2, len(CORES)))
    parser.add_argument("--breakdown", action="store_true", help="also time vLLM's window without prompt log-probs")
    parser.add_argument("--repeats", type=int, default=1, help="windows per length and engine; the fastest counts")
    parser.add_argument("--give-up-s", type=float, default=600.0, help="stop after a length slower than this")
    parser.add_argument("--keep", help="a folder to keep each engine's per-token NLL in (ENGINE-LENGTH.npy)")
    parser.add_argument("--vllm-python", default=sys.executable, help="the Python of an environment with vLLM")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    from diffeval.config import parse_ctx

    lengths = parse_ctx(args.lengths)
    if args.child:
        serve(args.child, args.model, max(lengths), args.threads, args.out, args.breakdown)
        return
    import numpy as np

    with tempfile.TemporaryDirectory() as scratch:
        out = args.keep or scratch
        Path(out).mkdir(parents=True, exist_ok=True)
        hf = Child(sys.executable, "hf", args, out)
        vllm = Child(args.vllm_python, "vllm", args, out)
        cores = CORES[: args.threads]
        print(f"# vLLM nll vs hf, {time.strftime('%Y-%m-%d')}, {args.threads} threads on cores {cores}, fp32, "
              f"best of {args.repeats}, {args.model}")  # fmt: skip
        print(f"# load: hf {hf.ready['load_s']:.1f} s, vllm {vllm.ready['load_s']:.1f} s")
        print("tokens | hf s | vllm s | vllm ÷ hf | vllm without prompt log-probs s | max |Δ| | mean |Δ| | load avg")
        for length in lengths:
            runs = [(hf.score(length), vllm.score(length)) for _ in range(args.repeats)]  # turn by turn
            theirs = min((r[0] for r in runs), key=lambda r: r["seconds"])
            ours = min((r[1] for r in runs), key=lambda r: r["seconds"])
            a, b = np.load(Path(out) / f"hf-{length}.npy"), np.load(Path(out) / f"vllm-{length}.npy")
            gap = np.abs(a.astype(np.float64) - b)
            prefill = f"{ours['prefill_s']:.1f}" if "prefill_s" in ours else "-"
            print(f"{length - 1:,} | {theirs['seconds']:.1f} | {ours['seconds']:.1f} | "
                  f"{ours['seconds'] / theirs['seconds']:.2f} | {prefill} | {np.nanmax(gap):.1e} | "
                  f"{np.nanmean(gap):.1e} (NaN: {int(np.isnan(b).sum())}) | "
                  f"{theirs['load']:.1f} / {ours['load']:.1f}", flush=True)  # fmt: skip
            if max(theirs["seconds"], ours["seconds"]) > args.give_up_s:
                print(f"# stopped: over {args.give_up_s:.0f} s at this length")
                break
        hf.close()
        vllm.close()


if __name__ == "__main__":
    main()
