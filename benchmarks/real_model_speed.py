"""Speed on a real checkpoint (SmolLM2-135M-Instruct in the tests), measured in one run.

1. diffeval's time per needle sample ÷ a bare `generate` on the same token ids (goal ≤ 1.1), and diffeval's needle
   command line ÷ lm-eval's `niah_single_1` at 4K on the same model: `needle_speed.py`'s two measurements, on this
   checkpoint.
2. Prefill tokens/s at 1K, 4K and 8K on hf and on vLLM: diffeval's backend generating one token from a prompt of
   L − 1 random token ids (a new prompt for every repeat, so vLLM's prefix cache never hits), the best of the repeats.
   hf and vLLM each run in their own process, pinned to the same cores; vLLM's runs in `--vllm-python` (the vLLM
   environment) and is skipped where that has no vllm.
3. The share of the matmul peak that an hf prefill reaches at 4K. The forward's FLOPs are
   2·(non-embedding parameters + LM head)·L + 2·L²·d·layers (the causal half of QKᵀ and AV, d = heads × head_dim):
   the forward that returns every position's logits. The one `generate` runs returns the last position's logits only
   (transformers' `logits_to_keep=1`), so its FLOPs count the LM head once; both are shown, the goal (≥ 0.7) is read
   on the first. The peak is measured in the same run: torch matmuls of the model's own shapes at L rows, weighted as
   one forward uses them (every layer's q, k, v, o, gate, up and down projections, and the LM head).

A GGUF file is dequantized once into diffeval's safetensors cache, and every measurement loads that folder.

Run: python benchmarks/real_model_speed.py --model PATH [--threads 2] [--samples 10] [--vllm-python PYTHON]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

LENGTHS = (1024, 4096, 8192)
CORES = sorted(os.sched_getaffinity(0))


def random_prompts(vocab: int, length: int, count: int, seed: int) -> list[list[int]]:
    import random

    rng = random.Random(seed * 1_000_003 + length)
    return [[rng.randrange(100, vocab) for _ in range(length)] for _ in range(count)]


def prefill_rates(engine: str, folder: str, threads: int, repeats: int) -> dict:
    """In a child process: tokens/s of a one-token generation from prompts of each length, on one engine."""
    os.sched_setaffinity(0, CORES[:threads])
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"{CORES[0]}-{CORES[threads - 1]}"
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    import torch

    from diffeval.models.backend import EngineSettings, make_backend
    from diffeval.models.engines.hf_options import HFOptions
    from diffeval.models.spec import ModelSpec

    torch.set_num_threads(threads)
    options = HFOptions(threads=threads) if engine == "hf" else None
    # prompts of L − 1 tokens, so that the one generated token keeps the longest within the model's 8,192 positions
    settings = EngineSettings(device="cpu", dtype="float32", max_model_len=max(LENGTHS), options=options)
    backend = make_backend(ModelSpec("real", folder), settings, engine)
    vocab = json.loads((Path(folder) / "config.json").read_text())["vocab_size"]
    backend.generate(random_prompts(vocab, 256, 1, seed=99), 1, [])  # warm-up
    rates = {}
    for length in LENGTHS:
        best = float("inf")
        for ids in random_prompts(vocab, length - 1, repeats, seed=1):
            start = time.perf_counter()
            backend.generate([ids], 1, [])
            best = min(best, time.perf_counter() - start)
        rates[str(length)] = (length - 1) / best
    return {"engine": engine, "threads": threads, "tokens_per_s": rates}


def matmul_share(folder: str, threads: int, length: int) -> dict:
    """Model FLOP/s of an hf prefill at `length` tokens ÷ the FLOP/s torch matmuls of the model's shapes reach."""
    import torch

    from diffeval.models.checkpoints.loading import load_model
    from diffeval.models.spec import ModelSpec

    torch.set_num_threads(threads)
    model = load_model(ModelSpec("real", folder), "cpu").model
    config = model.config
    hidden, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    q_width, kv_width = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    embedding = model.get_input_embeddings().weight.numel()
    non_embedding = sum(p.numel() for p in model.parameters()) - embedding
    if not config.tie_word_embeddings:
        non_embedding -= model.get_output_embeddings().weight.numel()  # counted as the LM head
    lm_head = hidden * vocab
    attention = 2 * length * length * q_width * layers
    flops_all_logits = 2 * (non_embedding + lm_head) * length + attention
    flops_last_logits = 2 * non_embedding * length + 2 * lm_head + attention

    ids = torch.randint(100, vocab, (1, length), generator=torch.Generator().manual_seed(0))

    def best_of(repeats: int, **kwargs) -> float:
        best = float("inf")
        with torch.inference_mode():
            for _ in range(repeats):
                start = time.perf_counter()
                model(ids, use_cache=False, **kwargs)
                best = min(best, time.perf_counter() - start)
        return best

    best_of(1, logits_to_keep=1)  # warm-up
    all_logits_s, last_logits_s = best_of(2), best_of(2, logits_to_keep=1)

    # the forward's matmuls: (shape of the weight, how many times one forward multiplies L rows by it)
    shapes = [
        ((hidden, q_width), layers),
        ((hidden, kv_width), 2 * layers),
        ((q_width, hidden), layers),
        ((hidden, config.intermediate_size), 2 * layers),
        ((config.intermediate_size, hidden), layers),
        ((hidden, vocab), 1),
    ]
    peak_flops, peak_seconds = 0.0, 0.0
    with torch.inference_mode():
        for (rows_in, cols), count in shapes:
            x, w = torch.randn(length, rows_in), torch.randn(rows_in, cols)
            torch.matmul(x, w)
            best = float("inf")
            for _ in range(3):
                start = time.perf_counter()
                torch.matmul(x, w)
                best = min(best, time.perf_counter() - start)
            peak_flops += 2 * length * rows_in * cols * count
            peak_seconds += best * count
    peak = peak_flops / peak_seconds
    return {
        "length": length,
        "threads": threads,
        "peak_gflops": peak / 1e9,
        "non_embedding_params": non_embedding,
        "lm_head_params": lm_head,
        "all_logits": {"s": all_logits_s, "gflops": flops_all_logits / all_logits_s / 1e9},
        "last_logits": {"s": last_logits_s, "gflops": flops_last_logits / last_logits_s / 1e9},
    }


def child(python: str, *args: str) -> dict | None:
    """Run one measurement of this script in `python`; None where that environment lacks what it needs."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run([python, __file__, *args], capture_output=True, text=True, env=env)
    if result.returncode == 3:
        return None
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(args[:2])} failed in {python}:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a checkpoint folder or a .gguf file")
    parser.add_argument("--threads", type=int, default=len(CORES), help="torch threads / vLLM OpenMP threads")
    parser.add_argument("--samples", type=int, default=10, help="needle samples (a multiple of 5 depths)")
    parser.add_argument("--ctx", type=int, default=4096, help="the needle and the matmul-share length")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2, help="prefill repeats per length (the best is kept)")
    parser.add_argument("--vllm-python", default=sys.executable, help="the python of an environment with vllm")
    parser.add_argument("--skip-needle", action="store_true", help="only the prefill and matmul measurements")
    parser.add_argument("--child", choices=("matmul", "hf", "vllm"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, folder = args.child, args.model
        if kind == "vllm" and importlib.util.find_spec("vllm") is None:
            raise SystemExit(3)
        result = (
            matmul_share(folder, args.threads, args.ctx)
            if kind == "matmul"
            else prefill_rates(kind, folder, args.threads, args.repeats)
        )
        print(json.dumps(result))
        return

    import needle_speed  # this folder's script: the needle measurements, on this checkpoint

    folder = str(needle_speed.real_model(args.model)["real"])
    print(f"# real-model speed: {args.model}, CPU ({len(CORES)} cores), {args.threads} threads, fp32, "
          f"{time.strftime('%Y-%m-%d')}\n")  # fmt: skip
    common = ["--model", folder, "--threads", str(args.threads), "--ctx", str(args.ctx), "--repeats", str(args.repeats)]
    share = child(sys.executable, "--child", "matmul", *common)
    params = f"non-embedding parameters {share['non_embedding_params']:,}, LM head {share['lm_head_params']:,}"
    print(f"matmul peak of the model's shapes at L = {args.ctx}: {share['peak_gflops']:.1f} GFLOP/s ({params})\n")
    print(f"hf prefill at L = {args.ctx} | s | GFLOP/s | share of the peak (goal >= 0.7)")
    print("--- | --- | --- | ---")
    for key, what in (("all_logits", "forward, every position's logits"), ("last_logits", "as generate: last logits")):
        row = share[key]
        print(f"{what} | {row['s']:.2f} | {row['gflops']:.1f} | {row['gflops'] / share['peak_gflops']:.2f}")

    rates = {engine: child(python, "--child", engine, *common) for engine, python in
             (("hf", sys.executable), ("vllm", args.vllm_python))}  # fmt: skip
    print("\nprefill tokens/s (one generated token) | " + " | ".join(f"{n // 1024}K" for n in LENGTHS))
    print("--- | " + " | ".join("---" for _ in LENGTHS))
    for engine, result in rates.items():
        if result is None:
            print(f"{engine} | not run: no vllm in --vllm-python | |")
            continue
        print(f"{engine} | " + " | ".join(f"{result['tokens_per_s'][str(n)]:.0f}" for n in LENGTHS))

    if args.skip_needle:
        return
    import tempfile

    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        harness, model_time = needle_speed.harness_overhead(
            "real", Path(folder), args.ctx, args.samples, args.max_new_tokens, root / "run", args.threads
        )
        print(f"\nneedle at {args.ctx}, {args.samples} samples | diffeval wall s (incl. loading) | model generate s | "
              "ratio (goal <= 1.1)")  # fmt: skip
        print("--- | --- | --- | ---")
        print(f"real | {harness:.2f} | {model_time:.2f} | {harness / model_time:.3f}")
        if importlib.util.find_spec("lm_eval") is None:
            print("\nlm-eval not installed: skipped the lm-eval comparison (pip install -e .[bench])")
            return
        needle_speed.lm_eval_ratio(folder, args, root)


if __name__ == "__main__":
    main()
