"""The transformers engine's own options, apart from its module so that the CLI builds `--help` without torch.

hf batches prompts by a measured token limit (`HFBackend.MAX_BATCH_TOKENS`, see docs/engines/transformers.md "Batches
on hf"), a constant rather than an option; its one option is the torch thread count, which changes only the speed.
"""

from __future__ import annotations

from dataclasses import dataclass

from diffeval.config import EngineOptions, option
from diffeval.errors import InputError
from diffeval.machine import usable_cores


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
        cores = usable_cores()
        if self.threads is not None and self.threads > cores:  # torch crashes on absurd counts; more only slows
            raise InputError(
                f"--threads {self.threads}: this process may use {cores} core(s): give 1 to {cores}, or leave it out "
                "for the cores the load leaves free"
            )

    def torch_threads(self) -> int | None:
        return self.threads
