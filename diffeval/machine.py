"""The machine a run runs on: what run.json records of it, so that a dry run times a run only from runs on the same
hardware and threads; and the default thread count, the cores this process may use less the load already on them.

Nothing here imports torch: GPU names are read only where an engine has loaded it already.
"""

from __future__ import annotations

import math
import os
import platform
import sys
from functools import cache
from pathlib import Path
from typing import Any


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's or `taskset`'s share, not the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def load_average() -> float:
    """Runnable processes over the last minute (0 where the platform does not say)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def default_threads(cores: int, load: float) -> int:
    """The cores the load leaves free: cores − load (rounded half up), at least 1. torch's own default, one thread per
    core, oversubscribes a busy machine: the quick start took 188 s beside another 2-thread job, 24 s on one thread."""
    return max(1, cores - math.floor(load + 0.5))


@cache
def start_threads() -> int:
    """`default_threads` as this process first asks (the start of its run): one value for the whole run, applied and
    recorded alike, however the load moves later."""
    return default_threads(usable_cores(), load_average())


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what the platform names."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Hardware", "Model") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def gpu_names() -> list[str] | None:
    """Names of the GPUs torch sees; None when torch is not loaded (unknown: importing it here would slow the CLI)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def cache_dir() -> Path:
    """Where diffeval keeps what it measured or built once per machine or file (GGUF conversions, judge verdicts,
    the matmul rate): $DIFFEVAL_CACHE_DIR, else ~/.cache/diffeval."""
    return Path(os.environ.get("DIFFEVAL_CACHE_DIR") or Path.home() / ".cache" / "diffeval")


def machine_record(engine: str, threads: int | None) -> dict[str, Any]:
    """What run.json records of the machine: the speed of its records holds on a machine with the same record."""
    return {"cpu": cpu_model(), "cores": usable_cores(), "gpus": gpu_names(), "engine": engine, "threads": threads}


def same_machine(recorded: Any, current: dict[str, Any]) -> bool:
    """A run folder's machine record matches this one (a folder without one, from before it existed, never does)."""
    return isinstance(recorded, dict) and current.get("gpus") is not None and recorded == current
