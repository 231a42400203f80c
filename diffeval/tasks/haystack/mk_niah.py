"""Multi-key needle-in-a-haystack with distractor needles (RULER's niah_multikey_1, _2 and _3).

Recipe (the rest is the haystack family's machinery, diffeval/tasks/haystack):
1. variant 1 (niah_multikey_1): an essay haystack (`--haystack`, default the shipped novel) with `--keys` needles
   "One of the special magic numbers for KEY is: VALUE.", word keys ("adjective-noun") and 7-digit values, all keys
   distinct; one is asked for. It sits at the cell's depth, the others at seeded random depths.
2. variants 2 and 3 (niah_multikey_2, _3): the haystack is made of needles (word keys and numbers; UUID keys and
   UUID values), and one more needle, asked for, sits at the cell's depth. No distractor shares its key or value.
3. prompt: RULER's template, singular for one value ("A special magic number is hidden within the following
   text..."), its answer prefix, and RULER's 128 tokens to generate.
4. score: RULER's string_match_all (the `ruler` rule).
"""

from __future__ import annotations

from dataclasses import dataclass

from diffeval.config import int_list, option
from diffeval.data.haystack import haystack_sentences, source_files
from diffeval.data.words import RESERVED_PAIRS, key_value_pairs, needle_sentence
from diffeval.errors import InputError
from diffeval.tasks.base import RunContext
from diffeval.tasks.haystack import samples
from diffeval.tasks.haystack.options import DepthOptions
from diffeval.tasks.haystack.probes import probe_task
from diffeval.tasks.haystack.recipe import Recipe

TOKENS_TO_GENERATE = 128  # RULER's niah tokens_to_generate
# variant → (haystack: None for the essay haystack of --haystack, key type, value type)
VARIANTS = {1: (None, "words", "numbers"), 2: ("needles:words:numbers", "words", "numbers"),
            3: ("needles:uuids:uuids", "uuids", "uuids")}  # fmt: skip
# --keys and --haystack act on variant 1 only: given without it, they are refused (config.option's `applies`)
ON_VARIANT_1 = (lambda options: 1 in options.variants, "with variant 1 in --variants")


@dataclass(frozen=True)
class MKNiahOptions(DepthOptions):
    """RULER's multi-key NIAH: the variants run, variant 1's needles and essay haystack."""

    variants: list[int] = option(
        [1, 2, 3], help="RULER's niah_multikey variants: 1 (essay, 4 keys), 2 (needles, words), 3 (needles, UUIDs)",
        parse=int_list("--variants"),
    )  # fmt: skip
    keys: int = option(4, help="variant 1: needles with distinct keys, one asked for (RULER: 4)", applies=ON_VARIANT_1)
    haystack: str = option("book", help="variant 1's haystack: book | essays:PATH | hf:DATASET[:SPLIT[:FIELD]] | noise",
                           applies=ON_VARIANT_1, reads=lambda o: source_files(o.haystack))  # fmt: skip

    def settings(self) -> list[str]:
        return [f"multikey_{v}" for v in self.variants]

    def validate(self) -> None:
        super().validate()
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown or not self.variants:
            raise InputError(f"--variants {self.variants}: use RULER's niah_multikey variants 1, 2 or 3")
        if not 1 <= self.keys <= RESERVED_PAIRS:
            raise InputError(f"--keys {self.keys}: give 1 to {RESERVED_PAIRS} keys")


def template(value_type: str, values: int, key: str) -> tuple[str, str, str]:
    """RULER's NIAH instruction, question and answer prefix, singular when one value is asked for."""
    if values == 1:
        kind = value_type[:-1]
        head = (f"A special magic {kind} is hidden within the following text. Make sure to memorize it. I will quiz "
                f"you about the {kind} afterwards.\n")  # fmt: skip
        tail = f"\nWhat is the special magic {kind} for {key} mentioned in the provided text? "
        return head, tail, f"The special magic {kind} for {key} mentioned in the provided text is"
    head = (f"Some special magic {value_type} are hidden within the following text. Make sure to memorize it. I will "
            f"quiz you about the {value_type} afterwards.\n")  # fmt: skip
    tail = f"\nWhat are all the special magic {value_type} for {key} mentioned in the provided text? "
    return head, tail, f"The special magic {value_type} for {key} mentioned in the provided text are"


def make_sample(options: MKNiahOptions, seed: int, ctx: int, depth: int, setting: str, index: int):
    variant = int(setting.rsplit("_", 1)[1])
    content = samples.cell_key(seed, ctx, depth, setting, index)
    if variant == 1:
        content += f"|haystack={options.haystack}"
    # the draws do not depend on --keys, so fewer keys are the first of more: the most that fits is exact
    rng = samples.sample_rng("mk-niah", content)
    key = content + (f"|keys={options.keys}" if variant == 1 else "")
    haystack, key_type, value_type = VARIANTS[variant]
    haystack_seed = rng.randrange(2**31)
    count = options.keys if variant == 1 else 1
    pairs_seed = rng.randrange(2**31) if variant == 1 else haystack_seed  # a needle haystack's own stream
    pairs = key_value_pairs(key_type, value_type, pairs_seed)
    chosen = [next(pairs) for _ in range(count)]
    depths = [float(depth)] + [round(rng.uniform(0, 100), 2) for _ in range(count - 1)]
    inserts = [
        samples.Insert(d, needle_sentence(k, v, value_type), samples.ANSWER if i == 0 else samples.DISTRACTOR, [v])
        for i, (d, (k, v)) in enumerate(zip(depths, chosen))
    ]
    head, tail, prefix = template(value_type, 1, chosen[0][0])
    return samples.new_sample(
        "mk-niah", key, ctx=ctx, depth=depth, setting=setting, seed=seed, index=index, head=head, tail=tail,
        answer_prefix=prefix, inserts=inserts, expected=[chosen[0][1]], haystack=haystack or options.haystack,
        haystack_seed=haystack_seed, token_limit=TOKENS_TO_GENERATE,
    )  # fmt: skip


def most_that_fits(options, sample, backend, budget, chat_template) -> str:
    """The most keys of variant 1 this budget holds (variants 2 and 3 have one needle beside the haystack)."""
    if sample.setting != "multikey_1":
        return "only the instruction and question, no needle"
    keys = samples.most_groups(sample, backend, budget, chat_template)
    return f"{keys} keys (--keys {keys})" if keys else "no key: use a longer --ctx"


def check_inputs(context: RunContext[MKNiahOptions]) -> None:
    """Fail before any work if variant 1's haystack cannot be read."""
    if 1 in context.options.variants:
        haystack_sentences(context.options.haystack, context.seed, 10)


RECIPE = Recipe(name="mk-niah", make_sample=make_sample, most_that_fits=most_that_fits)
TASK = probe_task(
    RECIPE,
    MKNiahOptions,
    help="Multi-key NIAH with distractor needles (RULER's niah_multikey_1/2/3).",
    note="score = RULER's string_match_all: the fraction of expected values found in the output, any case; one value "
    "is asked for, so a sample scores 0 or 1",
    token_limit=TOKENS_TO_GENERATE,
    check_inputs=check_inputs,
)
