"""Variable tracking (RULER's variable_tracking): follow a chain of assignments through noise, past distractor chains.

Recipe (the rest is the haystack family's machinery, diffeval/tasks/haystack):
1. sample: `--chains` chains of `--hops` hops, "VAR QPXLT = 48213", "VAR HDWZE = VAR QPXLT ", ... (5 capital letters,
   5-digit values, every name and value distinct), in the noise haystack. The first chain is asked for: its first
   assignment sits at the cell's depth, the rest in order at seeded depths after it. The other chains are the
   distractors, in order at seeded random depths (RULER: 1 chain of 4 hops, so no distractor by default).
2. prompt: RULER's one-shot example first (a chain of 3-letter names in a short noise text, with its answer), then
   its template and answer prefix (its spelling "assgined" kept, so prompts compare), 30 tokens to generate.
3. score: RULER's string_match_all: the fraction of the chain's hops + 1 names found.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass, replace

from diffeval.config import option
from diffeval.data.haystack import NOISE_SENTENCES, source_files
from diffeval.errors import InputError
from diffeval.longctx.fitting import largest_fitting
from diffeval.tasks.haystack import samples
from diffeval.tasks.haystack.options import DepthOptions
from diffeval.tasks.haystack.probes import probe_task
from diffeval.tasks.haystack.recipe import Recipe, check_haystack

TOKENS_TO_GENERATE = 30  # RULER's variable_tracking tokens_to_generate
INSTRUCTION = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
EXAMPLE_NOISE_SENTENCES = 20  # the one-shot example's noise (RULER fits its example into 500 tokens), more for a
# longer chain: one sentence per assignment
VALUES = 90_000  # distinct 5-digit values: one per chain
NAMES, EXAMPLE_NAMES = 26**5, 26**3  # distinct 5-letter names (the chains'), 3-letter names (the example's chain)


def question(value: str) -> str:
    return f"\nQuestion: Find all variables that are assigned the value {value} in the text above."


def answer_prefix(count: int, value: str) -> str:
    return (f" Answer: According to the chain(s) of variable assignment in the text above, {count} variables are "
            f"assgined the value {value}, they are: ")  # fmt: skip


@dataclass(frozen=True)
class VTOptions(DepthOptions):
    """RULER's variable tracking: chains (the first asked for, the others distractors) and hops per chain."""

    chains: int = option(1, help="chains of assignments; the first is asked for, the others are distractors")
    hops: int = option(4, help="assignments after a chain's first (RULER: 4, so 5 names per chain)")
    haystack: str = option(
        "noise",
        help="noise (RULER's) | book | essays:PATH | hf:DATASET[:SPLIT[:FIELD]]",
        reads=lambda o: source_files(o.haystack),
    )

    def settings(self) -> list[str]:
        return [f"chains={self.chains} hops={self.hops}"]

    def validate(self) -> None:
        super().validate()
        if self.hops < 1:
            raise InputError(f"--hops {self.hops}: a chain needs at least 1 hop (VAR B = VAR A), RULER uses 4")
        if self.chains < 1:
            raise InputError(f"--chains {self.chains}: give at least 1 chain (the one asked for)")
        # the draws take distinct names and values until they have enough: past the pool they would never end
        if self.hops + 1 > EXAMPLE_NAMES:
            raise InputError(f"--hops {self.hops}: the example's chain has {EXAMPLE_NAMES:,} 3-letter names, give at "
                             f"most {EXAMPLE_NAMES - 1:,} hops")  # fmt: skip
        if self.chains > VALUES or self.chains * (self.hops + 1) > NAMES:
            most = min(VALUES, NAMES // (self.hops + 1))
            raise InputError(f"--chains {self.chains}: there are {VALUES:,} distinct values and {NAMES:,} names, "
                             f"enough for {most:,} chains of {self.hops} hops: give at most {most:,}")  # fmt: skip


def chains(rng: random.Random, count: int, hops: int, letters: int) -> list[tuple[list[str], str]]:
    """`count` chains of hops + 1 names and a 5-digit value each, chain by chain, every name and value distinct (so
    fewer chains are the first of more)."""
    names: set[str] = set()
    values: set[str] = set()
    drawn = []
    for _ in range(count):
        chain: list[str] = []
        while len(chain) < hops + 1:
            name = "".join(rng.choices(string.ascii_uppercase, k=letters))
            if name not in names:
                names.add(name)
                chain.append(name)
        value = str(rng.randint(10000, 99999))
        while value in values:
            value = str(rng.randint(10000, 99999))
        values.add(value)
        drawn.append((chain, value))
    return drawn


def statements(names: list[str], value: str) -> list[str]:
    """A chain as RULER writes it (each hop's statement ends with a space)."""
    return [f"VAR {names[0]} = {value}"] + [f"VAR {b} = VAR {a} " for a, b in zip(names, names[1:])]


def example(rng: random.Random, hops: int) -> str:
    """RULER's one-shot example: one chain of 3-letter names in a short noise text, its question and answer."""
    ((names, value),) = chains(rng, 1, hops, 3)
    noise = [NOISE_SENTENCES[i % len(NOISE_SENTENCES)] for i in range(max(EXAMPLE_NOISE_SENTENCES, hops + 1))]
    for statement, at in zip(statements(names, value), sorted(rng.sample(range(len(noise)), hops + 1)), strict=True):
        noise[at] = f"{noise[at]} {statement}"
    return (INSTRUCTION + " ".join(noise) + question(value) + answer_prefix(hops + 1, value) + " ".join(names)
            + "\n\n")  # fmt: skip


def make_sample(options: VTOptions, seed: int, ctx: int, depth: int, setting: str, index: int):
    content = samples.cell_key(seed, ctx, depth, f"hops={options.hops}", index) + f"|haystack={options.haystack}"
    key = content + f"|chains={options.chains}"
    # one stream per kind of draw, none depending on --chains: fewer chains are the first of more
    haystack_seed = samples.sample_rng("vt", content).randrange(2**31)
    drawn = chains(samples.sample_rng("vt", content + "|names"), options.chains, options.hops, 5)
    at = samples.sample_rng("vt", content + "|depths")
    inserts = []
    for c, (names, value) in enumerate(drawn):
        if c == 0:
            depths = samples.follow_depths(depth, options.hops + 1, at)
        else:
            depths = sorted(round(at.uniform(0, 100), 2) for _ in range(options.hops + 1))
        role = samples.ANSWER if c == 0 else samples.DISTRACTOR
        inserts += [samples.Insert(d, s, role, [n]) for d, s, n in zip(depths, statements(names, value), names)]
    names, value = drawn[0]
    return samples.new_sample(
        "vt", key, ctx=ctx, depth=depth, setting=setting, seed=seed, index=index,
        head=example(samples.sample_rng("vt", content + "|example"), options.hops) + INSTRUCTION, tail=question(value),
        answer_prefix=answer_prefix(options.hops + 1, value), inserts=inserts, expected=names,
        haystack=options.haystack, haystack_seed=haystack_seed, token_limit=TOKENS_TO_GENERATE,
    )  # fmt: skip


def most_that_fits(options: VTOptions, sample, backend, budget, chat_template) -> str:
    count = samples.most_groups(sample, backend, budget, chat_template, per_group=options.hops + 1)
    if count:
        return f"{count} chains of {options.hops} hops (--chains {count})"
    hops = most_hops(options, sample, backend, budget, chat_template)
    if hops:
        return f"one chain of {hops} hops (--hops {hops})"
    return "no chain of even 1 hop beside the example: use a longer --ctx"


def most_hops(options: VTOptions, sample, backend, budget: int, chat_template: bool) -> int:
    """The most hops of one chain whose sample (its example's chain as long) fits `budget` with no haystack; 0: none.
    A longer chain only adds statements, so the search may bisect."""

    def fits(hops: int) -> bool:
        fewer = replace(options, chains=1, hops=hops)
        one = make_sample(fewer, sample.seed, sample.ctx, sample.depth, fewer.settings()[0], sample.index)
        return samples.fixed_tokens(one, backend, chat_template) <= budget

    if not fits(1):
        return 0
    return max(1, largest_fitting(lambda n: n == 0 or fits(n), 1, options.hops - 1))


RECIPE = Recipe(name="vt", make_sample=make_sample, most_that_fits=most_that_fits)
TASK = probe_task(
    RECIPE,
    VTOptions,
    help="Variable tracking: a chain of assignments among distractor chains (RULER's variable_tracking).",
    note="score = RULER's string_match_all: the fraction of the asked chain's names found in the output, any case; "
    "names of a distractor chain in the output count in `distractor_named`",
    token_limit=TOKENS_TO_GENERATE,
    check_inputs=check_haystack,
)
