"""The dry run's config estimate (diffeval/speed.py) against real runs: needle on the built-in pair at several context
lengths, each run for real (`diffeval run needle --ctx L --depths 50 --samples N`), then per model and length the
estimate the dry run prints for it beside the run's model time (the seconds of its records: the estimate leaves out
model loading), and their ratio.

It also fits the two constants of `speed.CALIBRATION` to these runs (least squares on the relative error) and prints
the ratios they would give: copy them, with the worst ratio, the date and the conditions, into `CALIBRATION`.
`--records FOLDER …` checks earlier run folders too (any task and model, each record at its own prompt and generated
tokens, at the threads its run.json records): a check on runs the constants were not fitted to.

The run folders stay in --out: a second call resumes them (nothing is rerun) and only recomputes the estimates;
`--out A B` runs (or resumes) a set in each folder, a day or a load apart, and fits the constants to all of them.

Run: python benchmarks/estimate_accuracy.py [--lengths 1k:4,2k:4,4k:4,8k:2,16k:1,32k:1,64k:1] [--threads 1]
                                           [--out /tmp/estimate-runs] [--records results/probes-toy/*]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

from diffeval import estimate, speed
from diffeval.config import parse_ctx
from diffeval.models.backend import EngineSettings, open_tokenizer
from diffeval.models.spec import ModelSpec
from diffeval.models.tokenizer import PromptTokenizer
from diffeval.tasks import TASKS, build_config

LENGTHS = "1k:4,2k:4,4k:4,8k:2,16k:1,32k:1,64k:1"


def run(ctx: str, samples: int, threads: int, folder: Path) -> None:
    """The real run (resumed, so nothing is rerun, when the folder holds it already)."""
    command = [sys.executable, "-m", "diffeval", "run", "needle", "--ctx", ctx, "--depths", "50",
               "--samples", str(samples), "--threads", str(threads), "--out", str(folder)]  # fmt: skip
    print(f"{' '.join(command[1:])}  (load average {os.getloadavg()[0]:.2f})", flush=True)
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if result.returncode != 0:
        raise SystemExit(f"the run failed: {result.stderr}")


def records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines() if line.strip()]


def needle_rows(ctx: str, samples: int, threads: int, folder: Path) -> list[tuple[str, float, float, float]]:
    """Per model of the run: its model time, and the FLOP-bound and call-bound parts of the dry run's estimate (the
    estimate is the first ÷ efficiency + the second × call_seconds), sized as the dry run sizes them."""
    flags = {"ctx": ctx, "depths": "50", "samples": samples, "threads": threads, "dry_run": True}
    config = build_config("needle", {}, flags)
    task, settings = TASKS["needle"], EngineSettings.from_config(config)
    sample_list = task.running.make_samples(config.options, config.seed)
    rate = estimate.run_matmul_rate(config, settings)
    rows = []
    for spec in config.models:
        tokenizer = PromptTokenizer(open_tokenizer(spec, settings), spec.name)
        [length] = estimate._lengths(task, sample_list, {s.sample_id for s in sample_list}, tokenizer, config)
        shape = estimate.model_shape(config, spec)
        assert shape is not None, spec.name
        prompt, new = length.totals[0] / length.samples, length.totals[1] / length.samples
        actual = sum(r["seconds"] for r in records(folder) if r["model"] == spec.name)
        compute, calls = speed.sample_parts(shape, prompt, new, rate.flops_per_s)
        rows.append((f"{spec.name} {ctx}", actual, compute * length.samples, calls * length.samples))
    return rows


def folder_rows(folder: Path) -> list[tuple[str, float, float, float]]:
    """Per model and length of an earlier run folder: its model time and the estimate's parts at each record's own
    prompt and generated tokens, at the matmul rate of the threads its run.json records."""
    run_json = json.loads((folder / "run.json").read_text())
    stored = run_json["config"]
    threads = (run_json.get("machine") or {}).get("threads") or 1
    config = build_config(stored["task"], {}, {"models": [f"{m['name']}={m['spec']}" for m in stored["models"]],
                                               "threads": threads, "dry_run": True})  # fmt: skip
    rate = estimate.run_matmul_rate(config, EngineSettings.from_config(config))
    rows = []
    for model in stored["models"]:
        shape = estimate.model_shape(config, ModelSpec.parse(f"{model['name']}={model['spec']}"))
        assert shape is not None, model
        groups: dict[object, list[dict]] = {}
        for row in records(folder):
            if row["model"] == model["name"] and isinstance(row.get("seconds"), (int, float)):
                groups.setdefault(row.get("ctx"), []).append(row)
        for ctx, rows_at in sorted(groups.items(), key=lambda item: str(item[0])):
            split = [speed.sample_parts(shape, r["prompt_tokens"], r["new_tokens"], rate.flops_per_s) for r in rows_at]
            actual = sum(r["seconds"] for r in rows_at)
            name = f"{folder.name}: {model['name']} {ctx}"
            rows.append((name, actual, sum(p[0] for p in split), sum(p[1] for p in split)))
    return rows


def fit(rows: list[tuple[str, float, float, float]]) -> tuple[float, float]:
    """efficiency and call_seconds minimising Σ log²(estimate ÷ actual), by a grid search (a ratio's log weighs an
    estimate twice too high as one half too low; one noisy run does not pull the fit as it would a squared error)."""

    def loss(efficiency: float, call_seconds: float) -> float:
        return sum(
            math.log((compute / efficiency + calls * call_seconds) / actual) ** 2 for _, actual, compute, calls in rows
        )

    grid = [(e / 100, c / 1e5) for e in range(10, 301, 2) for c in range(0, 1001, 5)]  # 0.1–3, 0–10 ms
    return min(grid, key=lambda point: loss(*point))


def report(title: str, rows: list[tuple[str, float, float, float]], efficiency: float, call_seconds: float) -> float:
    """Print each row's estimate against its model time; return the worst ratio either way."""
    print(f"\n{title} (efficiency {efficiency:.3f}, call_seconds {call_seconds * 1e3:.3f} ms)")
    print(f"{'run':<44} {'estimate':>10} {'model time':>11} {'ratio':>6}")
    ratios = []
    for name, actual, compute, calls in rows:
        value = compute / efficiency + calls * call_seconds
        ratios.append(value / actual)
        print(f"{name:<44} {value:>9.2f}s {actual:>10.2f}s {ratios[-1]:>6.2f}")
    factors = [max(ratio, 1 / ratio) for ratio in ratios]
    print(
        f"worst ratio, either way: {max(factors):.2f} over {len(rows)} runs; median ratio "
        f"{statistics.median(ratios):.2f}; within 1.5x either way: {sum(f <= 1.5 for f in factors)} of {len(rows)}"
    )
    return max(factors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default=LENGTHS, help=f"CTX:SAMPLES,… [default: {LENGTHS}]")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the runs [default: 1]")
    where = "where the runs are kept; several folders: a set of runs in each, fitted together"
    parser.add_argument("--out", type=Path, nargs="+", default=[Path("/tmp/estimate-runs")], help=where)
    parser.add_argument("--records", type=Path, nargs="*", default=[], help="earlier run folders to check too")
    args = parser.parse_args()
    lengths = [(ctx, int(samples)) for ctx, samples in (item.split(":") for item in args.lengths.split(","))]
    for ctx, _ in lengths:
        parse_ctx(ctx)  # a bad length is refused before any run
    rows = []
    for out in args.out:
        for ctx, samples in lengths:
            folder = out / f"needle-{ctx}"
            run(ctx, samples, args.threads, folder)
            rows += [(f"{out.name}: {name}", *rest) for name, *rest in needle_rows(ctx, samples, args.threads, folder)]
    calibration = speed.CALIBRATION
    print(f"load average now {os.getloadavg()[0]:.2f}")
    report("the built-in pair's needle runs, CALIBRATION as committed", rows, calibration.efficiency,
           calibration.call_seconds)  # fmt: skip
    efficiency, call_seconds = fit(rows)
    report("the same runs, the constants fitted to them", rows, efficiency, call_seconds)
    others = [row for folder in args.records for row in folder_rows(folder)]
    if others:
        report("earlier run folders, CALIBRATION as committed", others, calibration.efficiency,
               calibration.call_seconds)  # fmt: skip


if __name__ == "__main__":
    main()
