"""Multi-value needle-in-a-haystack (RULER's niah_multivalue).

Recipe (the rest is the haystack family's machinery, diffeval/tasks/haystack):
1. sample: `--values` needles "One of the special magic numbers for KEY is: VALUE." with one word key and distinct
   7-digit values, in an essay haystack (`--haystack`, default the shipped novel); the first at the cell's depth, the
   others at seeded random depths.
2. prompt: RULER's template ("What are all the special magic numbers for KEY ...?"), 128 tokens to generate.
3. score: RULER's string_match_all: the fraction of the values found (partial credit per value).
"""

from __future__ import annotations

from dataclasses import dataclass

from diffeval.config import option
from diffeval.data.haystack import source_files
from diffeval.data.words import RESERVED_PAIRS, key_value_pairs, needle_sentence
from diffeval.errors import InputError
from diffeval.tasks.haystack import samples
from diffeval.tasks.haystack.mk_niah import TOKENS_TO_GENERATE, template
from diffeval.tasks.haystack.options import DepthOptions
from diffeval.tasks.haystack.probes import probe_task
from diffeval.tasks.haystack.recipe import Recipe, check_haystack


@dataclass(frozen=True)
class MVNiahOptions(DepthOptions):
    """RULER's multi-value NIAH: values per key and the essay haystack."""

    values: int = option(4, help="needles sharing the one key, each with its own value; all are asked for (RULER: 4)")
    haystack: str = option(
        "book", help="book | essays:PATH | hf:DATASET[:SPLIT[:FIELD]] | noise", reads=lambda o: source_files(o.haystack)
    )

    def settings(self) -> list[str]:
        return [f"values={self.values}"]

    def validate(self) -> None:
        super().validate()
        if not 1 <= self.values <= RESERVED_PAIRS:
            raise InputError(f"--values {self.values}: give 1 to {RESERVED_PAIRS} values")


def make_sample(options: MVNiahOptions, seed: int, ctx: int, depth: int, setting: str, index: int):
    content = samples.cell_key(seed, ctx, depth, "", index) + f"|haystack={options.haystack}"
    rng = samples.sample_rng("mv-niah", content)  # not --values: fewer values are the first of more
    key = content + f"|values={options.values}"
    haystack_seed = rng.randrange(2**31)
    pairs = key_value_pairs("words", "numbers", rng.randrange(2**31))
    chosen = [next(pairs) for _ in range(options.values)]
    word = chosen[0][0]
    values = [value for _, value in chosen]
    depths = [float(depth)] + [round(rng.uniform(0, 100), 2) for _ in range(options.values - 1)]
    inserts = [
        samples.Insert(d, needle_sentence(word, v, "numbers"), samples.ANSWER, [v]) for d, v in zip(depths, values)
    ]
    head, tail, prefix = template("numbers", options.values, word)
    return samples.new_sample(
        "mv-niah", key, ctx=ctx, depth=depth, setting=setting, seed=seed, index=index, head=head, tail=tail,
        answer_prefix=prefix, inserts=inserts, expected=values, haystack=options.haystack,
        haystack_seed=haystack_seed, token_limit=TOKENS_TO_GENERATE,
    )  # fmt: skip


def most_that_fits(options, sample, backend, budget, chat_template) -> str:
    values = samples.most_groups(sample, backend, budget, chat_template)
    return f"{values} values (--values {values})" if values else "no value: use a longer --ctx"


RECIPE = Recipe(name="mv-niah", make_sample=make_sample, most_that_fits=most_that_fits)
TASK = probe_task(
    RECIPE,
    MVNiahOptions,
    help="Multi-value NIAH: one key, several values (RULER's niah_multivalue).",
    note="score = RULER's string_match_all: the fraction of the key's values found in the output, any case",
    token_limit=TOKENS_TO_GENERATE,
    check_inputs=check_haystack,
)
