"""The options every haystack task takes (lengths, samples per cell, the effective length's base lengths, depths),
and their checks."""

from __future__ import annotations

from dataclasses import dataclass

from diffeval.config import context_option, int_list, option, parse_ctx
from diffeval.errors import InputError
from diffeval.longctx.lengths import format_ctx

CTX_HELP = "context lengths: 4k, 64K, 65536 or a comma list (k = 1024)"
BASE_LENGTHS_HELP = "lengths whose mean is each model's base score for the effective length [default: those run ≤ 1K]"


def parse_base_lengths(text: str | list[int]) -> list[int]:
    return parse_ctx(text) if text not in ("", []) else []


def check_samples(samples: int) -> None:
    if samples < 1:
        raise InputError(f"--samples {samples}: need at least 1 sample per cell")


def check_depths(depths: list[int]) -> None:
    for depth in depths:
        if not 0 <= depth <= 100:
            raise InputError(f"depth {depth} is outside 0-100: give depths in percent, e.g. 0,25,50,75,100")


def check_base_lengths(base_lengths: list[int], lengths: list[int]) -> None:
    not_run = [length for length in base_lengths if length not in lengths]
    if not_run:
        raise InputError(
            f"--base-lengths {','.join(map(format_ctx, not_run))} is not among the run's lengths "
            f"({','.join(map(format_ctx, lengths))}): give base lengths from --ctx, or leave it out (those ≤ 1K)"
        )


@dataclass(frozen=True)
class HaystackOptions:
    """What every probe takes: lengths, samples per cell, the base lengths of the effective length."""

    ctx: list[int] = context_option([4096], help=CTX_HELP)
    samples: int = option(50, help="samples per length × depth × setting cell", identity=False)
    base_lengths: list[int] = option([], help=BASE_LENGTHS_HELP, parse=parse_base_lengths, identity=False)

    def settings(self) -> list[str]:
        """The task's settings run, one table column each (mk-niah's RULER variants); one by default."""
        return ["default"]

    def cell_depths(self) -> list[int | None]:
        return [None]

    def validate(self) -> None:
        check_samples(self.samples)
        check_base_lengths(self.base_lengths, self.ctx)


@dataclass(frozen=True)
class DepthOptions(HaystackOptions):
    """A probe that places its answer at depths."""

    depths: list[int] = option(
        [0, 25, 50, 75, 100], help="depths of the answer's first insert in percent", parse=int_list("--depths")
    )

    def cell_depths(self) -> list[int | None]:
        return list(self.depths)

    def validate(self) -> None:
        super().validate()
        check_depths(self.depths)
