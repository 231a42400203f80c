"""Scale-out on Ray: one run sharded over many GPUs and machines, with the driver as the only writer.

The driver (this process) holds the run folder's lock, makes the samples, skips those done, and streams chunks of the
rest to Ray actors, a free worker taking the next chunk, so fast workers take more. A worker holds one loaded
backend for one model and returns records; it never writes. The driver appends them to samples.jsonl in sample
order (a chunk that finishes early waits for the ones before it), so a sharded run writes what a single-process run
writes. Models run one after another, each over all workers.

Faults: Ray restarts a worker whose process dies (kill -9, out of memory) once and retries its chunk there
(`max_restarts`, `max_task_retries`); a worker that dies for good hands its chunk back to the queue for the others.
When every worker of a model is gone, the run stops with one line. Nothing is written twice: records reach the file
only from the driver, once per chunk. When the driver dies, rerunning the same command resumes, as without Ray.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

from diffeval.config import EngineOptions, RunConfig, is_count
from diffeval.errors import InputError, RunFailure
from diffeval.models.backend import EngineSettings, make_backend
from diffeval.results import RecordWriter
from diffeval.tasks import TASKS
from diffeval.tasks.base import RunContext, Task

NAMESPACE = "diffeval"


class EvalWorker:
    """A Ray actor: one backend for one model; evaluates chunks of samples and returns their records."""

    def __init__(self, task: str, spec, config: RunConfig):
        import torch

        torch.set_num_threads(max(1, int(config.cpus_per_worker)))
        self.task, self.context = TASKS[task], RunContext.of(config)
        self.backend = make_backend(spec, EngineSettings.from_config(config), config.backend)

    def evaluate(self, chunk: list) -> list[dict]:
        running = self.task.running
        prepared = running.prepare_batch(chunk, self.backend, self.context) if running.prepare_batch else chunk
        return [record.to_dict() for record in running.evaluate(prepared, self.backend, self.context)]

    def info(self) -> dict:
        return self.backend.info.to_dict()

    def pid(self) -> int:
        return os.getpid()


@contextmanager
def ray_session(address: str):
    """Connected to Ray for the length of a run; a local instance started here stops with it."""
    connect(address)
    import ray

    try:
        yield
    finally:
        ray.shutdown()


def connect(address: str) -> None:
    """A local Ray instance (`local`), or an existing cluster (`auto`, HOST:PORT). One line when unreachable."""
    try:
        import ray
    except ImportError:
        raise InputError('--ray needs Ray: pip install "diffeval[ray]"') from None
    host, sep, port = address.rpartition(":")
    if sep and is_count(port) and "://" not in address:  # ray.init waits long where nothing listens: say so at once
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except OSError as exc:
            raise InputError(
                f"cannot reach a Ray cluster at {address} ({exc.strerror or exc}): start one with `ray start --head`, "
                "or check the address"
            ) from None
    try:  # "local" always starts a new instance, whatever RAY_ADDRESS says
        ray.init(
            address=address,
            include_dashboard=False,
            log_to_driver=False,
            namespace=NAMESPACE,
            logging_level=logging.ERROR,
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise InputError(
            f"cannot reach a Ray cluster at {address} ({_first_line(exc)}): start one with `ray start --head`, or "
            "check the address"
        ) from None


def gpus_per_worker(config: RunConfig) -> float:
    """--gpus-per-worker, else by the cluster (not this driver, which may be a CPU-only head node): none without GPUs,
    else what the engine's options say a worker holds (vllm: --tensor-parallel-size; hf: 1)."""
    import ray

    if config.gpus_per_worker is not None:
        return config.gpus_per_worker
    if not ray.cluster_resources().get("GPU", 0):
        return 0
    return (config.engine or EngineOptions()).worker_gpus()  # no engine options: a RunConfig built by hand


def check_fits(config: RunConfig, gpus: float) -> None:
    """Actors that cannot be placed would wait forever: refuse a request larger than the cluster, in one line."""
    import ray

    have = ray.cluster_resources()
    workers = config.workers or 1
    for resource, each in (("CPU", config.cpus_per_worker), ("GPU", gpus)):
        if each and workers * each > have.get(resource, 0):
            raise InputError(
                f"{workers} workers x {each:g} {resource} need {workers * each:g} {resource}s, but the Ray cluster has "
                f"{have.get(resource, 0):g}: lower --workers or --{resource.lower()}s-per-worker"
            )


def evaluate_on_ray(
    task: Task,
    config: RunConfig,
    chunks_per_model: dict,
    writer: RecordWriter,
    report: Callable[[str, dict], None],
    record_model: Callable[[str, dict], None],
) -> None:
    """Evaluate every model's chunks on `config.workers` Ray workers; `record_model(model, info)` once every worker has
    loaded the model, then `report(model, record)` after each record is written."""
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    remote = ray.remote(EvalWorker)
    gpus = gpus_per_worker(config)
    check_fits(config, gpus)
    placement = dict(num_cpus=config.cpus_per_worker, num_gpus=gpus, max_restarts=1, max_task_retries=1)
    for spec in config.models:
        chunks = chunks_per_model[spec.name]
        if not chunks:
            continue
        workers: list[Any] = [  # Ray actor handles: each method is called through its `.remote`
            remote.options(name=f"{spec.name}-{i}-{time.time_ns()}", **placement).remote(task.name, spec, config)
            for i in range(config.workers or 1)
        ]
        try:
            infos = ray.get([w.info.remote() for w in workers])  # every worker has loaded the model
        except RayActorError as exc:
            raise RunFailure(f"Ray workers for model {spec.name} failed to start: {_first_line(exc)}") from None
        record_model(spec.name, infos[0])
        queue, idle = deque(range(len(chunks))), list(workers)
        in_flight: dict[Any, tuple[int, Any]] = {}  # a chunk's Ray result → (its index, the worker evaluating it)
        finished: dict[int, list[dict]] = {}
        next_to_write = 0
        while queue or in_flight:
            while queue and idle:
                worker, index = idle.pop(), queue.popleft()
                in_flight[worker.evaluate.remote(chunks[index])] = (index, worker)
            [done], _ = ray.wait(list(in_flight), num_returns=1)
            index, worker = in_flight.pop(done)
            try:
                finished[index] = ray.get(done)
            except RayTaskError as exc:  # the task raised: surface its own error (an InputError stays one line)
                _save_finished(finished, writer, report, spec.name)
                raise (exc.cause if isinstance(exc.cause, Exception) else exc) from None
            except RayActorError:
                workers.remove(worker)  # gone for good (Ray already restarted it once): its chunk goes back
                queue.appendleft(index)
                if not workers:
                    _save_finished(finished, writer, report, spec.name)
                    raise RunFailure(
                        f"every Ray worker of model {spec.name} died (the last while evaluating chunk {index}); "
                        "finished samples are saved: rerun the same command to resume"
                    ) from None
                continue
            idle.append(worker)
            while next_to_write in finished:  # in sample order, as a single-process run writes
                for record in finished.pop(next_to_write):
                    writer.append(record)
                    report(spec.name, record)
                next_to_write += 1
        for worker in workers:
            ray.kill(worker)


def _save_finished(finished: dict[int, list[dict]], writer: RecordWriter, report, model: str) -> None:
    """Before a run stops, save the chunks that finished out of order: readers key records on model and sample id."""
    for index in sorted(finished):
        for record in finished.pop(index):
            writer.append(record)
            report(model, record)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
