"""Memory of the attention-to-answer analysis, measured in one run on tiny models (CPU).

Each measurement runs in its own process so that peak RSS (ru_maxrss) belongs to it alone:
- `sdpa`: a plain sdpa forward of the decoder over a needle prompt of T tokens (the reference);
- `analysis`: diffeval's attention analysis of the same prompt (rows captured through the attention interface);
- `eager`: transformers' eager `output_attentions=True` on the same prompt, under an address-space cap, which either
  fails or balloons, since it builds a T×T map per head and layer.
Goal: analysis ÷ sdpa ≤ 2.0 at 32K. A last line runs the analysis once at 64K.

Run: python benchmarks/attention_memory.py [--ctx 32768] [--long 65536] [--eager-cap-gb 12]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace


def measure(mode: str, model_dir: str, ctx: int, cap_gb: float) -> dict:
    """Runs in a child process; prints one JSON line."""
    import torch

    from diffeval.models.checkpoints.loading import load_model
    from diffeval.models.engines.hf import HFBackend
    from diffeval.models.spec import ModelSpec
    from diffeval.tasks.analyses import attention
    from diffeval.tasks.analyses.attention import AttentionOptions
    from diffeval.tasks.haystack import needle

    attn_impl = "eager" if mode == "eager" else "sdpa"
    backend = HFBackend(load_model(ModelSpec("diff", model_dir), "cpu", attn_impl=attn_impl))
    sample = needle.make_sample(0, ctx, 50, 1, 1, 0)
    ids = needle.build_prompt(sample, backend, ctx - 32, False).ids
    if mode == "eager":
        resource.setrlimit(resource.RLIMIT_AS, (int(cap_gb * 2**30), resource.RLIM_INFINITY))
    start = time.perf_counter()
    status = "ok"
    try:
        with torch.inference_mode():
            if mode == "analysis":
                config = SimpleNamespace(options=AttentionOptions(), max_new_tokens=32, chat_template=False)
                attention.evaluate([sample], backend, config)
            else:
                backend.model.get_decoder()(
                    input_ids=torch.tensor([ids]), use_cache=False, output_attentions=mode == "eager"
                )
    except (MemoryError, RuntimeError) as exc:
        status = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "mode": mode,
        "ctx": ctx,
        "tokens": len(ids),
        "peak_rss_mb": round(peak_mb),
        "seconds": round(time.perf_counter() - start, 1),
        "status": status,
    }


def run_child(mode: str, model_dir: Path, ctx: int, cap_gb: float) -> dict:
    result = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            mode,
            "--model",
            str(model_dir),
            "--ctx",
            str(ctx),
            "--eager-cap-gb",
            str(cap_gb),
        ],
        capture_output=True,
        text=True,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if not lines:  # killed by the kernel or crashed outside Python
        return {
            "mode": mode,
            "ctx": ctx,
            "tokens": None,
            "peak_rss_mb": None,
            "seconds": None,
            "status": f"failed: exit code {result.returncode}",
        }
    return json.loads(lines[-1])


def build_model(root: Path) -> Path:
    from diffeval.data.cities import CITIES
    from diffeval.data.haystack import NOISE_SENTENCES
    from diffeval.models.tiny import build_tiny_model, train_tokenizer
    from diffeval.tasks.haystack import needle

    texts = [" ".join(NOISE_SENTENCES)] * 20 + [needle.INSTRUCTION, needle.question(["Rome"])]
    texts += [needle.needle_sentence(city, "1234567") for city in CITIES]
    train_tokenizer(texts, 400, root / "tok")
    build_tiny_model("diff", root / "tok", root / "diff", max_positions=131072)
    return root / "diff"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ctx", type=int, default=32768)
    parser.add_argument("--long", type=int, default=65536, help="one analysis at this length (0 to skip)")
    parser.add_argument("--eager-cap-gb", type=float, default=12.0, help="address-space cap for the eager run")
    parser.add_argument("--child")
    parser.add_argument("--model")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.model, args.ctx, args.eager_cap_gb)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp))
        results = [run_child(mode, model, args.ctx, args.eager_cap_gb) for mode in ("sdpa", "analysis", "eager")]
        if args.long:
            results.append(run_child("analysis", model, args.long, args.eager_cap_gb))
    print("mode | ctx | prompt tokens | peak RSS MB | seconds | status")
    print("--- | --- | --- | --- | --- | ---")
    for r in results:
        print(f"{r['mode']} | {r['ctx']} | {r['tokens']} | {r['peak_rss_mb']} | {r['seconds']} | {r['status']}")
    sdpa, analysis = results[0], results[1]
    print(
        f"\nanalysis ÷ sdpa peak RSS at {args.ctx}: {analysis['peak_rss_mb'] / sdpa['peak_rss_mb']:.2f} (goal <= 2.0)"
    )


if __name__ == "__main__":
    main()
