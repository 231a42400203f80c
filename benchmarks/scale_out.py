"""Scale-out on Ray: 1 worker against 2 on this machine, one torch thread each (hf workers, built-in pair, needle at
2K, 40 samples per model), measured in one run.

Prints:
- steady-state throughput: samples per second from the moment every worker has loaded its model to the last record,
  2 workers ÷ 1 (goal ≥ 1.6×);
- end to end, including `ray.init` and the workers' start-up: 2 workers ÷ 1;
- Ray's overhead per sample: a 1-worker Ray run's steady-state seconds per sample minus the generation seconds per
  sample of the same run in one process (one torch thread).

Run: python benchmarks/scale_out.py [--samples 40]   (needs the ray extra)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console

from diffeval import runner
from diffeval.scale import evaluate_on_ray, ray_session
from diffeval.tasks import TASKS, build_config


def measure(workers: int | None, samples: int, out: Path) -> dict:
    flags = {"ctx": "2k", "depths": "0,25,50,75,100", "samples": samples // 5, "out": str(out), "device": "cpu"}
    if workers:
        flags.update(ray="local", workers=workers, cpus_per_worker=1.0)
    config = build_config("needle", {}, flags)
    task = TASKS["needle"]
    start = time.perf_counter()
    if not workers:
        torch.set_num_threads(1)
        folder = runner.run(config, Console(quiet=True))
        rows = [json.loads(line) for line in folder.samples_path.read_text().splitlines()]
        return {
            "wall": time.perf_counter() - start,
            "generation_per_sample": sum(r["seconds"] for r in rows) / len(rows),
        }
    ready, last = {}, {}
    samples_list = runner.make_samples(task, config)
    chunks = {spec.name: runner.chunks_of(task, samples_list, config) for spec in config.models}
    with ray_session("local"), (out / "samples.jsonl").open("a") as handle:
        from diffeval.results import RecordWriter

        evaluate_on_ray(
            task,
            config,
            chunks,
            RecordWriter(handle),
            report=lambda model, record: last.__setitem__(model, time.perf_counter()),
            record_model=lambda model, info: ready.__setitem__(model, time.perf_counter()),
        )
    steady = sum(last[m] - ready[m] for m in ready)  # models run one after another
    count = sum(len(samples_list) for _ in config.models)
    return {"wall": time.perf_counter() - start, "steady_per_sample": steady / count, "samples": count}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=40, help="needle samples per model (a multiple of 5)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for workers in (None, 1, 2):
            out = Path(tmp) / f"workers-{workers or 0}"
            out.mkdir()
            results[workers] = measure(workers, args.samples, out)
    one, two, local = results[1], results[2], results[None]
    print(f"# needle 2K, built-in pair, {args.samples} samples per model, hf workers with one torch thread each\n")
    print("measure | 1 worker | 2 workers | 2 ÷ 1")
    print("--- | --- | --- | ---")
    steady = one["steady_per_sample"] / two["steady_per_sample"]
    print(f"steady state, samples/s | {1 / one['steady_per_sample']:.2f} | {1 / two['steady_per_sample']:.2f} | "
          f"{steady:.2f}x (goal >= 1.6x)")  # fmt: skip
    print(f"end to end, s (with ray.init and worker start-up) | {one['wall']:.1f} | {two['wall']:.1f} | "
          f"{one['wall'] / two['wall']:.2f}x")  # fmt: skip
    overhead = one["steady_per_sample"] - local["generation_per_sample"]
    ray_s, local_s = one["steady_per_sample"], local["generation_per_sample"]
    print(f"\nRay overhead per sample: {overhead * 1000:.0f} ms (1-worker steady state {ray_s:.3f} s vs in-process "
          f"generation {local_s:.3f} s)")  # fmt: skip


if __name__ == "__main__":
    main()
