"""How fast the command line answers: wall time of `diffeval --help` and of one bad-input error, each a fresh process
(interpreter start-up included), the median of several runs, against the goals (≤ 0.5 s and ≤ 1 s on an idle machine).

Also prints the heavy libraries `import diffeval.cli` loads (none is the goal: tests/test_cli_startup.py checks it) and
the import time of diffeval.cli alone (`python -X importtime`). A benchmark, not a timed test: the figures depend on
the machine and its load.

Run: python benchmarks/cli_speed.py [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "diffeval --help": (["--help"], 0, 0.5),
    "bad input (run needle --ctx 0k)": (["run", "needle", "--ctx", "0k"], 2, 1.0),
}
HEAVY = ("torch", "transformers", "pandas", "matplotlib", "scipy", "vllm", "ray", "datasets", "numpy")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def wall_time(args: list[str], expected_code: int) -> float:
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "diffeval", *args], capture_output=True, text=True, env=ENV)
    seconds = time.perf_counter() - start
    if result.returncode != expected_code:
        raise SystemExit(f"diffeval {' '.join(args)} exited {result.returncode}, not {expected_code}: {result.stderr}")
    return seconds


def cli_import_seconds() -> float:
    """diffeval.cli's cumulative import time, as `python -X importtime` reports it."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import diffeval.cli"], capture_output=True, text=True, env=ENV
    )
    match = re.search(r"\|\s*(\d+)\s*\|\s*diffeval\.cli$", result.stderr, re.MULTILINE)
    return int(match.group(1)) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per command; the median is reported")
    runs = parser.parse_args().runs
    code = f"import sys, diffeval.cli; print(','.join(m for m in {HEAVY!r} if m in sys.modules) or 'none')"
    heavy = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV).stdout.strip()
    print(f"heavy libraries loaded by `import diffeval.cli`: {heavy}")
    print(f"import diffeval.cli: {cli_import_seconds():.3f} s (python -X importtime)")
    wall_time(["--help"], 0)  # a first run warms the file cache
    for label, (args, expected_code, goal) in COMMANDS.items():
        times = [wall_time(args, expected_code) for _ in range(runs)]
        median = statistics.median(times)
        verdict = "meets" if median <= goal else "MISSES"
        print(
            f"{label}: median {median:.2f} s over {runs} runs (min {min(times):.2f}, max {max(times):.2f}); "
            f"goal <= {goal} s: {verdict}"
        )


if __name__ == "__main__":
    main()
