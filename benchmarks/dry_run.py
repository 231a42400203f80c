"""The default 64K needle dry run (`diffeval run needle --ctx 64k --dry-run`, the built-in pair: 250 samples per
model): wall time and peak RSS of the command, against the goals (≤ 10 s and ≤ 1 GB), and its token totals beside
those of fitting every prompt exactly (what --dry-run did before it sized runs from the haystack's token counts;
goal: within 1 %).

The command runs in a fresh process (interpreter start-up, imports and tokenizer loading included) into a temporary
folder, so no earlier run folder times it. The exact totals are computed here, one prompt at a time (--skip-exact
leaves them out: they take about a minute per model on a 2-core CPU).

Run: python benchmarks/dry_run.py [--ctx 64k] [--skip-exact]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_SECONDS, GOAL_BYTES = 10.0, 1 << 30


def dry_run(ctx: str, folder: Path) -> tuple[float, int, dict[str, tuple[int, int]], str]:
    """Wall seconds, peak RSS (bytes) and per model (prompt tokens, generated tokens) of the dry run command."""
    command = [sys.executable, "-m", "diffeval", "run", "needle", "--ctx", ctx, "--dry-run", "--out", str(folder)]
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"the dry run failed: {result.stderr}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # the only child so far; Linux gives KiB
    totals = {}
    for line in result.stdout.splitlines():
        cells = [cell.strip().replace(",", "") for cell in line.split("│")[1:-1]]
        if len(cells) == 6 and cells[1].isdigit():
            totals[cells[0]] = (int(cells[3]), int(cells[4]))
    return seconds, peak, totals, result.stdout


def exact_totals(ctx: str) -> dict[str, tuple[int, int, float]]:
    """Per model: prompt tokens, generated tokens at most and seconds, fitting every prompt of the same run."""
    from diffeval.models.backend import EngineSettings, open_tokenizer
    from diffeval.models.tokenizer import PromptTokenizer
    from diffeval.tasks import build_config, needle

    config = build_config("needle", {}, {"ctx": ctx, "dry_run": True})
    samples = needle.make_samples(config.options, config.seed)
    totals = {}
    for spec in config.models:
        start = time.perf_counter()
        tokenizer = PromptTokenizer(open_tokenizer(spec, EngineSettings.from_config(config)), spec.name)
        prompt_tokens = generated = 0
        for sample in samples:
            prompt, limit = needle.fitted_prompt(sample, tokenizer, config)
            prompt_tokens, generated = prompt_tokens + len(prompt.ids), generated + limit
        totals[spec.name] = (prompt_tokens, generated, time.perf_counter() - start)
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ctx", default="64k", help="context length of the needle run [default: 64k]")
    parser.add_argument("--skip-exact", action="store_true", help="do not fit every prompt for the reference totals")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        seconds, peak, totals, output = dry_run(args.ctx, Path(tmp) / "needle")
    print(output.rstrip())
    fast, small = seconds <= GOAL_SECONDS, peak <= GOAL_BYTES
    print(
        f"dry run: {seconds:.1f} s wall (goal <= {GOAL_SECONDS:.0f} s: {'meets' if fast else 'MISSES'}), "
        f"peak RSS {peak / 2**30:.2f} GiB (goal <= 1 GiB: {'meets' if small else 'MISSES'})"
    )
    if args.skip_exact:
        return
    for model, (prompt_tokens, generated, fit_seconds) in exact_totals(args.ctx).items():
        cheap_prompt, cheap_generated = totals[model]
        error = (cheap_prompt - prompt_tokens) / prompt_tokens
        print(
            f"{model}: prompt tokens {cheap_prompt:,} (dry run) vs {prompt_tokens:,} (every prompt fitted, "
            f"{fit_seconds:.0f} s): {error:+.3%} (goal within 1 %: {'meets' if abs(error) <= 0.01 else 'MISSES'}); "
            f"generated at most {cheap_generated:,} vs {generated:,}"
        )


if __name__ == "__main__":
    main()
