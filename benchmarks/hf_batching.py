"""`--batch-size` on the hf engine at long context: peak memory and wall time of the same needle run at batch 4 and
batch 1, each measured in one run of this script.

The built-in toy-base (4 layers, 4 heads of 32, fp32) on CPU; needle at --ctx (default 16K), depth 50 %, 4 samples,
through the real command line, each setting in its own process so its peak RSS (ru_maxrss from wait4) is its own.
Wall time is the whole command (load included, the same for both); generation seconds are the sum of the records'
`seconds`. Goal (issue 21): batch 4 peaks at ≤ 1.3x and takes ≤ 1.0x the wall time of batch 1, with the same outputs.
A forward pass holds at most HFBackend.MAX_BATCH_TOKENS prompt tokens (batch × longest prompt), so at 16K hf runs
the prompts one at a time; each record's `generation_batch` says how many shared a forward pass.

Run: python benchmarks/hf_batching.py [--ctx 16384] [--samples 4] [--rounds 1]
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


def run_needle(batch_size: int, ctx: int, samples: int, out: Path) -> dict:
    command = [sys.executable, "-m", "diffeval", "run", "needle", "-m", "toy=toy-base", "--ctx", str(ctx),
               "--depths", "50", "--samples", str(samples), "--batch-size", str(batch_size), "--device", "cpu",
               "--out", str(out)]  # fmt: skip
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"batch {batch_size} failed: {process.stderr.read().decode()[-2000:]}")
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return {
        "peak_rss_gb": usage.ru_maxrss / 2**20,  # KiB on Linux
        "wall_s": wall,
        "generation_s": sum(r["seconds"] for r in records),
        "outputs": [r["output"] for r in records],
        "generation_batch": sorted({r["generation_batch"] for r in records}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ctx", type=int, default=16384)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1, help="alternate the two settings this many times")
    args = parser.parse_args()
    results: dict[int, list[dict]] = {1: [], 4: []}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for batch in (1, 4):
                results[batch].append(run_needle(batch, args.ctx, args.samples, Path(tmp) / f"b{batch}-{round_}"))
    one, four = results[1], results[4]
    best = lambda runs, key: min(r[key] for r in runs)  # noqa: E731  (the least disturbed round)
    print(f"# hf needle, toy-base fp32, CPU ({os.cpu_count()} cores), ctx {args.ctx}, {args.samples} samples, "
          f"{args.rounds} round(s), {time.strftime('%Y-%m-%d')}\n")  # fmt: skip
    print("measure | --batch-size 1 | --batch-size 4 | 4 ÷ 1")
    print("--- | --- | --- | ---")
    for key, label in (("peak_rss_gb", "peak RSS (GB)"), ("wall_s", "wall (s)"), ("generation_s", "generation (s)")):
        a, b = best(one, key), best(four, key)
        print(f"{label} | {a:.2f} | {b:.2f} | {b / a:.2f}")
    same = sum(x == y for x, y in zip(one[0]["outputs"], four[0]["outputs"]))
    print(f"identical outputs | {same}/{len(one[0]['outputs'])} | | ")
    print(f"prompts per forward pass (records' generation_batch) | {one[0]['generation_batch']} | "
          f"{four[0]['generation_batch']} | ")  # fmt: skip


if __name__ == "__main__":
    main()
