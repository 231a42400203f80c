"""The hf engine's default --threads (the cores this process may use minus the load on them at start, at least 1)
against the best fixed thread count (1 or 2), on the README's quick start: idle, and beside a competing process that
runs torch matmuls on 2 threads. Goal: the default within 1.3x of the best in both. Each figure is the wall time of a
fresh `diffeval run needle --ctx 1k --needles 1 --queries 1 --samples N` into an empty folder (loading included).

The competitor runs for a minute before the busy timings: the default reads the one-minute load average, which takes
that long to show a job that has just started (as a CI runner's or workstation's other jobs have been running).

Run: python benchmarks/threads.py [--samples 6]
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

GOAL_RATIO = 1.3
FIXED = (1, 2)
COMPETITOR = (
    "import torch\ntorch.set_num_threads(2)\na = torch.randn(1024, 1024)\nwhile True:\n    a @ a\n"  # 2 busy threads
)


def quick_start(samples: int, threads: int | None) -> tuple[float, int]:
    """Wall seconds of the quick start, and the threads its run.json records."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "diffeval", "run", "needle", "--ctx", "1k", "--needles", "1", "--queries", "1"]
        command += ["--samples", str(samples), "--out", f"{tmp}/run"]
        command += [] if threads is None else ["--threads", str(threads)]
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        env.pop("OMP_NUM_THREADS", None)  # torch's own default where --threads does not set it
        start = time.perf_counter()
        result = subprocess.run(command, capture_output=True, text=True, env=env)
        seconds = time.perf_counter() - start
        if result.returncode != 0:
            raise SystemExit(f"the quick start failed: {result.stderr}")
        return seconds, json.loads(Path(f"{tmp}/run/run.json").read_text())["machine"]["threads"]


def measure(condition: str, samples: int) -> bool:
    load = os.getloadavg()[0]
    default, chosen = quick_start(samples, None)
    fixed = {threads: quick_start(samples, threads)[0] for threads in FIXED}
    best = min(fixed, key=fixed.get)
    ratio = default / fixed[best]
    met = ratio <= GOAL_RATIO
    timings = ", ".join(f"--threads {threads}: {seconds:.1f} s" for threads, seconds in fixed.items())
    print(
        f"{condition} (load average {load:.2f} at start, {os.getloadavg()[0]:.2f} at end): default (--threads "
        f"{chosen}) {default:.1f} s; {timings}; default / best = {ratio:.2f} (goal <= {GOAL_RATIO}: "
        f"{'meets' if met else 'MISSES'})"
    )
    return met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=6, help="quick-start samples per model [default: 6]")
    parser.add_argument("--warm-up", type=float, default=60, help="seconds the competitor runs first [default: 60]")
    args = parser.parse_args()
    print(f"{len(os.sched_getaffinity(0))} cores usable; {args.samples} samples per model")
    measure("idle", args.samples)
    competitor = subprocess.Popen([sys.executable, "-c", COMPETITOR], env={**os.environ, "OMP_NUM_THREADS": "2"})
    try:
        time.sleep(args.warm_up)
        measure("beside a 2-thread torch process", args.samples)
    finally:
        competitor.kill()
        competitor.wait()


if __name__ == "__main__":
    main()
