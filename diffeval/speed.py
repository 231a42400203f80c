"""What a sample costs before anything runs: the FLOPs a checkpoint's config implies for a prompt and its generated
tokens, this machine's matmul rate (a benchmark of about a second, cached per machine), and the two constants that
turn them into seconds, measured against real runs (`CALIBRATION`; `benchmarks/estimate_accuracy.py` measures them).

The dry run falls back on this estimate when nothing better is known, and a run started on a CPU announces its length
with it. Nothing here reads weights; torch is imported only to measure the matmul rate.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from datetime import date
from typing import Any

from diffeval.machine import cache_dir, cpu_model, gpu_names, usable_cores
from diffeval.models.variants.base import DIFF_ATTENTION
from diffeval.models.variants.registry import layers_of


@dataclass(frozen=True)
class Calibration:
    """How a FLOP count becomes seconds, and how well that held against real runs."""

    efficiency: float  # the share of the matmul benchmark's FLOP rate a model's FLOPs run at
    call_seconds: float  # per decoder layer per forward call: the framework's own time, which FLOPs do not count
    within: float  # every run measured was within this factor of its estimate, either way
    runs: int  # (model, length) runs measured
    span: str  # their context lengths
    conditions: str  # where they ran
    measured: str  # when

    def accuracy(self) -> str:
        return f"within ×{self.within:.1f} of {self.runs} real runs ({self.span}, {self.conditions}, {self.measured})"


# Measured with `python benchmarks/estimate_accuracy.py --out A B` (docs/benchmarks.md#the-config-estimate): the two
# constants fitted to a first set of 14 runs (load average 3.4–6.1), then the dry run's estimate against those and a
# second set measured after them (load 4.1–6.3, its 64K DIFF sample 2.5 times slower than the first set's): the
# largest ratio either way over the 28
CALIBRATION = Calibration(
    efficiency=0.32,
    call_seconds=1.35e-3,
    within=2.5,
    runs=28,
    span="1K–64K",
    conditions="needle on the built-in pair, hf, 1 thread of a 2-core CPU shared with other jobs",
    measured="2026-12-05",
)


@dataclass(frozen=True)
class Shape:
    """A checkpoint's cost per token, from its config."""

    layer_weights: int  # weights of the decoder layers' projections: every token passes through each once
    head_weights: int  # the LM head's: generation computes logits of one position per forward call
    attention: tuple[tuple[int, int | None], ...]  # per attending layer: its width (query heads × head_dim × maps)
    # and sliding window (None: the full context)
    layers: int


def shape_of(config: Any) -> Shape:
    """A Llama-style dense decoder's cost, from its config (a transformers config or any object with its fields):
    q and o projections over the query heads, k and v over the KV heads, a gated MLP (three matrices), the LM head.
    Each layer's kind (`registry.layers_of`) says whether it attends, over what window, and with how many maps: DIFF
    attention computes two softmax maps over the same keys (DiffLlama's two attention calls, DIFF V2's 2h query
    heads), so it costs twice a softmax layer's."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden, heads = text.hidden_size, text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    per_layer = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + 3 * hidden * text.intermediate_size
    kinds = layers_of(config)
    attention = tuple(
        (heads * head_dim * (2 if layer.mixer == DIFF_ATTENTION else 1), layer.window)
        for layer in kinds
        if layer.attends
    )
    return Shape(per_layer * len(kinds), hidden * text.vocab_size, attention, len(kinds))


def _pairs(tokens: int, window: int | None) -> int:
    """(query, key) pairs of causal attention over `tokens` positions, each query seeing at most `window` keys."""
    if window is None or window >= tokens:
        return tokens * (tokens + 1) // 2
    return window * (window + 1) // 2 + (tokens - window) * window


def flops(shape: Shape, prompt: int, new: int) -> float:
    """FLOPs of one sample: the prompt's forward pass, then one forward call per generated token after the first (the
    prefill's logits give the first). A matmul of a token through W weights is 2·W FLOPs; attention is 4·width per
    (query, key) pair (QKᵀ and the weighted sum of V)."""
    total = 2 * shape.layer_weights * prompt + 2 * shape.head_weights
    total += sum(4 * width * _pairs(prompt, window) for width, window in shape.attention)
    for step in range(1, new):
        context = prompt + step
        total += 2 * (shape.layer_weights + shape.head_weights)
        total += sum(4 * width * min(context, window or context) for width, window in shape.attention)
    return float(total)


def sample_parts(shape: Shape, prompt: float, new: float, flops_per_s: float) -> tuple[float, int]:
    """One sample's two costs: its FLOPs' seconds at the full matmul rate, and its forward calls × decoder layers."""
    return flops(shape, round(prompt), round(new)) / flops_per_s, max(round(new), 1) * shape.layers


def sample_seconds(shape: Shape, prompt: float, new: float, flops_per_s: float, calibration=CALIBRATION) -> float:
    """Seconds of one sample of `prompt` tokens generating `new`, at this machine's matmul rate."""
    compute, layer_calls = sample_parts(shape, prompt, new, flops_per_s)
    return compute / calibration.efficiency + layer_calls * calibration.call_seconds


@dataclass(frozen=True)
class MatmulRate:
    flops_per_s: float
    device: str
    dtype: str
    threads: int
    measured: str  # the date it was measured (it is cached per machine)

    def describe(self) -> str:
        threads = f", {self.threads} thread{'s' if self.threads != 1 else ''}" if self.device == "cpu" else ""
        return f"{self.flops_per_s / 1e9:,.0f} GFLOP/s {self.dtype} on {self.device}{threads}, measured {self.measured}"


CACHE_FILE = "matmul-rate.json"
# the benchmark's length, in ten windows: the best window's rate is the machine's, a neighbour's burst aside (the
# efficiency in CALIBRATION accounts for how far real runs fall short of it)
BENCH_SECONDS, BENCH_WINDOWS = 1.0, 10
BENCH_SIZE = {"cpu": 1024, "cuda": 4096}  # square matmuls the size of a real model's projections


def matmul_rate(device: str, dtype: str, threads: int) -> MatmulRate:
    """This machine's dense matmul rate on `device` in `dtype` with `threads` torch threads: read from the cache when
    this machine (CPU model, cores, GPUs, torch version) measured it before, else measured now and cached."""
    import torch

    identity = {"cpu": cpu_model(), "cores": usable_cores(), "gpus": gpu_names(), "torch": torch.__version__}
    key = json.dumps({**identity, "device": device, "dtype": dtype, "threads": threads}, sort_keys=True)
    path = cache_dir() / CACHE_FILE
    try:
        cached = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cached = {}
    if not isinstance(cached, dict):
        cached = {}
    entry = cached.get(key)
    if not (isinstance(entry, dict) and isinstance(entry.get("flops_per_s"), float) and entry["flops_per_s"] > 0):
        entry = {"flops_per_s": measure_matmul(device, dtype, threads), "measured": date.today().isoformat()}
        cached[key] = entry
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")  # renamed into place: a reader never sees half a file
        partial.write_text(json.dumps(cached, indent=1), encoding="utf-8")
        partial.replace(path)
    return MatmulRate(entry["flops_per_s"], device, dtype, threads, str(entry.get("measured")))


def measure_matmul(device: str, dtype: str, threads: int) -> float:
    """FLOP/s of square matmuls in the best of BENCH_WINDOWS windows over about BENCH_SECONDS, with the run's torch
    threads (restored after)."""
    import torch

    size = BENCH_SIZE.get(device, BENCH_SIZE["cpu"])
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randn(size, size, device=device, dtype=getattr(torch, dtype))
        b = torch.randn(size, size, device=device, dtype=getattr(torch, dtype))
        rates = []
        for _ in range(BENCH_WINDOWS):
            start, count = time.perf_counter(), 0
            while True:
                a @ b
                count += 1
                if device == "cuda":
                    torch.cuda.synchronize()
                elapsed = time.perf_counter() - start
                if elapsed >= BENCH_SECONDS / BENCH_WINDOWS:
                    break
            rates.append(2 * size**3 * count / elapsed)
        return max(rates)
    finally:
        torch.set_num_threads(before)
