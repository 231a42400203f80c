"""Needle's options (`NeedleOptions`: lengths, N needles and R queried per setting, depths, samples per cell, the
haystack, base lengths) and their checks."""

from __future__ import annotations

from dataclasses import dataclass

from diffeval.config import context_option, int_list, option
from diffeval.data.haystack import source_files
from diffeval.errors import InputError
from diffeval.tasks.haystack import options


@dataclass(frozen=True)
class NeedleOptions:
    """The multi-needle task: N needles per sample, R of them queried, at every ctx × depth × (N, R)."""

    ctx: list[int] = context_option([4096], help=options.CTX_HELP)
    needles: list[int] = option([1], help="N, needles per sample; a comma list runs several N/R settings",
                                parse=int_list("--needles"), distinct=False)  # fmt: skip
    queries: list[int] = option([1], help="R, needles queried per sample; one value or one per N",
                                parse=int_list("--queries"), distinct=False)  # fmt: skip
    depths: list[int] = option([0, 25, 50, 75, 100], help="depths of the first queried needle in percent, e.g. "
                               "0,25,50,75,100", parse=int_list("--depths"))  # fmt: skip
    samples: int = option(50, help="samples per depth × length × N/R cell", identity=False)
    haystack: str = option(
        "noise", help="noise | essays:PATH | hf:DATASET[:SPLIT[:FIELD]]", reads=lambda o: source_files(o.haystack)
    )
    base_lengths: list[int] = option([], help=options.BASE_LENGTHS_HELP, parse=options.parse_base_lengths,
                                     identity=False)  # fmt: skip

    def nr_pairs(self) -> list[tuple[int, int]]:
        return list(zip(self.needles, self.queries, strict=True))

    def settings(self) -> list[str]:
        return [f"{n}/{r}" for n, r in self.nr_pairs()]

    def cell_depths(self) -> list[int | None]:
        return list(self.depths)

    def validate(self) -> None:
        if len(self.queries) == 1 and len(self.needles) > 1:
            object.__setattr__(self, "queries", self.queries * len(self.needles))
        if len(self.needles) != len(self.queries):
            raise InputError(f"--needles {self.needles} and --queries {self.queries} differ in length: give one R "
                             "for all or one R per N")  # fmt: skip
        pairs = self.nr_pairs()
        for i, (n, r) in enumerate(pairs):
            if (n, r) in pairs[:i]:
                raise InputError(f"--needles and --queries name N={n}, R={r} twice: give each setting once")
            if r < 1 or n < r:
                raise InputError(f"needles N={n}, queries R={r}: need 1 <= R <= N")
            if n > 64:
                raise InputError(f"needles N={n}: at most 64 needles per sample")
        options.check_depths(self.depths)
        options.check_samples(self.samples)
        options.check_base_lengths(self.base_lengths, self.ctx)
