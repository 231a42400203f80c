"""The default 64K needle dry run (`diffeval run needle --ctx 64k --dry-run`, the built-in pair: 250 samples per
model): wall time and peak RSS of the command, against the goals (≤ 10 s and ≤ 1 GB), and its token totals beside
those of fitting every prompt exactly (what --dry-run did before it sized runs from the haystack's token counts;
goal: within 1 %).

The command runs in a fresh process (interpreter start-up, imports and tokenizer loading included) into a temporary
folder, so no earlier run folder times it. The exact totals are computed here, one prompt at a time (--skip-exact
leaves them out: they take about a minute per model on a 2-core CPU).

With --estimates it checks the time estimate instead: at 4K and 16K on the built-in pair, a dry run with --calibrate
(one sample per model and length timed), then the run itself (a few samples), and a second dry run timed from the
records the run left; each estimate beside the run's model time (the seconds of its records: the estimate leaves out
model loading). Goal: within 1.5x.

Run: python benchmarks/dry_run.py [--ctx 64k] [--skip-exact]
     python benchmarks/dry_run.py --estimates
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_SECONDS, GOAL_BYTES = 10.0, 1 << 30
GOAL_ESTIMATE_RATIO = 1.5
# samples per model: enough model time at 4K that the table's whole seconds do not decide the ratio
ESTIMATE_SAMPLES = {"4k": 8, "16k": 2}


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
        if len(cells) == 7 and cells[1].isdigit():
            totals[cells[0]] = (int(cells[3]), int(cells[4]))
    return seconds, peak, totals, result.stdout


def exact_totals(ctx: str) -> dict[str, tuple[int, int, float]]:
    """Per model: prompt tokens, generated tokens at most and seconds, fitting every prompt of the same run."""
    from diffeval.models.backend import EngineSettings, open_tokenizer
    from diffeval.models.tokenizer import PromptTokenizer
    from diffeval.tasks import build_config
    from diffeval.tasks.haystack import needle, recipe

    config = build_config("needle", {}, {"ctx": ctx, "dry_run": True})
    samples = needle.TASK.running.make_samples(config.options, config.seed)
    totals = {}
    for spec in config.models:
        start = time.perf_counter()
        tokenizer = PromptTokenizer(open_tokenizer(spec, EngineSettings.from_config(config)), spec.name)
        prompt_tokens = generated = 0
        for sample in samples:
            prompt = recipe.fitted_prompt(needle.RECIPE, sample, tokenizer, config)
            limit = needle.token_limit(sample, tokenizer, config)
            prompt_tokens, generated = prompt_tokens + len(prompt.ids), generated + limit
        totals[spec.name] = (prompt_tokens, generated, time.perf_counter() - start)
    return totals


def _diffeval(*args: str) -> str:
    command = [sys.executable, "-m", "diffeval", *args]
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed: {result.stderr}")
    return result.stdout


def _estimates(stdout: str) -> dict[str, float | None]:
    """Seconds per model in a dry run's table (None where it gives no estimate)."""
    found = {}
    for line in stdout.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if len(cells) == 7 and cells[1].replace(",", "").isdigit():
            found[cells[0]] = _seconds(cells[5])
    return found


def _seconds(text: str) -> float | None:
    if text == "n/a":
        return None
    parts = text.split()
    units = {"s": 1, "min": 60, "h": 3600}
    return sum(float(parts[i]) * units[parts[i + 1]] for i in range(0, len(parts), 2))


def check_estimates(samples_per_length: dict[str, int]) -> None:
    """Estimate against the run's model time at 4K and 16K, by --calibrate and by the records of the run itself."""
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    for ctx, samples in samples_per_length.items():
        with tempfile.TemporaryDirectory() as tmp:
            run = ["run", "needle", "--ctx", ctx, "--depths", "50", "--samples", str(samples)]
            start = time.perf_counter()
            calibrated = _estimates(_diffeval(*run, "--out", f"{tmp}/run", "--dry-run", "--calibrate"))
            calibrate_wall = time.perf_counter() - start
            start = time.perf_counter()
            _diffeval(*run, "--out", f"{tmp}/run")
            run_wall = time.perf_counter() - start
            recorded = _estimates(_diffeval(*run, "--out", f"{tmp}/next", "--dry-run"))
            rows = [json.loads(line) for line in Path(f"{tmp}/run/samples.jsonl").read_text().splitlines()]
            threads = json.loads(Path(f"{tmp}/run/run.json").read_text())["machine"]["threads"]
        print(
            f"{ctx}: {samples} samples per model, {threads} thread(s); --calibrate dry run {calibrate_wall:.1f} s "
            f"wall, run {run_wall:.1f} s wall (loading included); load average now {os.getloadavg()[0]:.2f}"
        )
        for model, estimate in calibrated.items():
            actual = sum(row["seconds"] for row in rows if row["model"] == model)
            for source, value in (("--calibrate", estimate), ("recorded", recorded.get(model))):
                if value is None:
                    print(f"  {model}: {source}: no estimate; model time {actual:.1f} s")
                    continue
                # the table rounds to whole seconds: the ratio is that of the rounded figure
                ratio = max(value, actual) / max(min(value, actual), 1e-9)
                verdict = "meets" if ratio <= GOAL_ESTIMATE_RATIO else "MISSES"
                print(
                    f"  {model}: {source} estimate {value:.0f} s, model time {actual:.1f} s: ratio {ratio:.2f} "
                    f"(goal <= {GOAL_ESTIMATE_RATIO}: {verdict})"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ctx", default="64k", help="context length of the needle run [default: 64k]")
    parser.add_argument("--skip-exact", action="store_true", help="do not fit every prompt for the reference totals")
    parser.add_argument("--estimates", action="store_true", help="check the time estimate at 4K and 16K instead")
    args = parser.parse_args()
    if args.estimates:
        check_estimates(ESTIMATE_SAMPLES)
        return
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
