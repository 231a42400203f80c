"""The transformers engine's own options, apart from its module so that the CLI builds `--help` without torch.

hf batches prompts by a measured token limit (`HFBackend.MAX_BATCH_TOKENS`, see docs/engines/transformers.md "Batches
on hf"), a constant rather than an option; its one option is the torch thread count, which changes only the speed.
"""

from __future__ import annotations

from dataclasses import dataclass

from diffeval.config import EngineOptions, option
from diffeval.errors import InputError
from diffeval.machine import usable_cores

MAX_THREADS = 1024  # torch's thread pool starts 4096 here; 65536 fails to create its threads


@dataclass(frozen=True)
class HFOptions(EngineOptions):
    threads: int | None = option(
        None,
        help="hf: torch threads [default: the cores this process may use minus the load average on them at start, at "
        "least 1]",
        type=int,
        identity=False,
    )

    def validate(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise InputError(
                f"--threads {self.threads}: give at least 1, or leave it out for the cores the load leaves free"
            )
        # torch's thread pool fails on absurd counts; a count above the cores only slows. The bound is no machine's
        # cores: a run.json read where fewer cores are (view, a Ray driver) stays valid
        if self.threads is not None and self.threads > MAX_THREADS:
            raise InputError(
                f"--threads {self.threads}: give 1 to {MAX_THREADS} (this machine has {usable_cores()} usable "
                "core(s)), or leave it out for the cores the load leaves free"
            )

    def torch_threads(self) -> int | None:
        return self.threads
