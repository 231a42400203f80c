"""Common-words extraction (RULER's cwe): aggregation over a long numbered list of words.

Recipe (the rest is the haystack family's machinery, diffeval/tasks/haystack):
1. sample: `--common` words (10) that appear `C` times each and as many other words as fit, `R` times each, in one
   shuffled numbered list "1. harbour 2. gentle 3. ...". RULER's frequencies (`--frequencies ruler`): C = 30, R = 3
   from 4K on; C = 6, R = 1 below 4K, where 300 entries would not fit. Words come from the shipped novel's vocabulary
   (RULER: wonderwords); which are common and the list's order are pure functions of the sample.
2. prompt: RULER's one-shot example first (40 words at 10 and 3 from 4K, 20 words at 3 and 1 below), then its
   template and answer prefix, 120 tokens to generate. Each model's tokenizer fits its own number of other words
   (binary search, as RULER does): the common words, their frequencies and their order are the same for every model
   (a shorter list is the longer one without some other words' entries).
3. score: RULER's string_match_all: the fraction of the common words found. No depth: the answer is everywhere.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from diffeval.config import is_count, option
from diffeval.data.words import vocabulary
from diffeval.errors import InputError
from diffeval.longctx import fitting
from diffeval.tasks.haystack import samples
from diffeval.tasks.haystack.options import HaystackOptions
from diffeval.tasks.haystack.probes import probe_task
from diffeval.tasks.haystack.recipe import Recipe
from diffeval.tasks.haystack.samples import HaystackPrompt

TOKENS_TO_GENERATE = 120  # RULER's cwe tokens_to_generate
RULER_SHORT = 4096  # below this RULER uses its short frequencies
HEAD = ("Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
        "that appear most often.\n")  # fmt: skip


def question(common: int) -> str:
    return f"\nQuestion: What are the {common} most common words in the above list?"


def answer_prefix(common: int) -> str:
    return f" Answer: The top {common} words that appear most often in the list are:"


@dataclass(frozen=True)
class CWEOptions(HaystackOptions):
    """RULER's common-words extraction: how many words are common and how often words appear."""

    common: int = option(10, help="words that appear most often; all are asked for (RULER: 10)")
    frequencies: str = option(
        "ruler", help="ruler (30 and 3 from 4K, 6 and 1 below) | C,R: each common word C times, each other R times"
    )

    def settings(self) -> list[str]:
        return [f"common={self.common} freq={self.frequencies.replace(',', '/')}"]

    @staticmethod
    def common_of(setting: str) -> int:
        """The common words a cell's setting names: the run's `--common`, or on the built-in models what fits."""
        return int(setting.split()[0].removeprefix("common="))

    def validate(self) -> None:
        super().validate()
        words = len(vocabulary())
        if not 1 <= self.common < words:
            raise InputError(f"--common {self.common}: the word pool holds {words:,} words, give 1 to {words - 1:,} "
                             "common words (some must be left for the others)")  # fmt: skip
        if self.frequencies != "ruler":
            parts = self.frequencies.split(",")
            if len(parts) != 2 or not all(is_count(p) for p in parts) or not int(parts[0]) > int(parts[1]) >= 1:
                raise InputError(f"--frequencies {self.frequencies!r}: use ruler, or C,R with C > R >= 1 (30,3)")

    def counts(self, ctx: int) -> tuple[int, int]:
        """(common word frequency, other word frequency) at this length."""
        if self.frequencies == "ruler":
            return (6, 1) if ctx < RULER_SHORT else (30, 3)
        common, rare = self.frequencies.split(",")
        return int(common), int(rare)


def numbered(words: list[str]) -> str:
    return " ".join(f"{i + 1}. {word}" for i, word in enumerate(words))


def word_list(words: list[str], common: int, freqs: tuple[int, int], rare: int, key: str) -> list[str]:
    """The list of a sample with `rare` other words: the first `common` words `freqs[0]` times and the next `rare`
    `freqs[1]` times, in the order one seeded shuffle of every word's entries gives, so a list with fewer other words
    is the longer list without their entries: every model sees the common words in the same order."""
    entries = words[:common] * freqs[0] + words[common:] * freqs[1]
    random.Random(key).shuffle(entries)
    kept = set(words[: common + rare])
    return [word for word in entries if word in kept]


def example(rng: random.Random, ctx: int, common: int) -> str:
    """RULER's one-shot example: a short list of its own words, the template and the answer."""
    size, freqs = (20, (3, 1)) if ctx < RULER_SHORT else (40, (10, 3))
    words = rng.sample(vocabulary(), size)
    entries = word_list(words, common, freqs, size - common, f"example|{rng.random()}")  # every word: all kept
    return (HEAD + numbered(entries) + question(common) + answer_prefix(common) + " "
            + numbered(words[:common]) + "\n")  # fmt: skip


def make_sample(options: CWEOptions, seed: int, ctx: int, depth, setting: str, index: int):
    key = samples.cell_key(seed, ctx, None, setting, index)
    rng = samples.sample_rng("cwe", key)
    words = list(vocabulary())
    rng.shuffle(words)  # the first `common` are the common words, then the others in the order a fit takes them
    common = options.common_of(setting)
    head = example(rng, ctx, common) + HEAD
    return samples.new_sample(
        "cwe", key, ctx=ctx, depth=None, setting=setting, seed=seed, index=index, head=head,
        tail=question(common), answer_prefix=answer_prefix(common), inserts=[],
        expected=words[:common], haystack="", haystack_seed=0, token_limit=TOKENS_TO_GENERATE,
        extra={"words": words, "freqs": list(options.counts(ctx)), "key": key},
    )  # fmt: skip


def _render(sample, rare: int, backend, chat_template: bool) -> tuple[str, list[str], int]:
    """The prompt with `rare` other words, its list and where the list starts in the text."""
    common = len(sample.expected)
    entries = word_list(sample.extra["words"], common, tuple(sample.extra["freqs"]), rare, sample.extra["key"])
    text = backend.render_prompt(sample.head + numbered(entries) + sample.tail, sample.answer_prefix, chat_template)
    return text, entries, text.index(sample.head) + len(sample.head)


def fit(sample, backend, budget: int, chat_template: bool, refusal: str) -> HaystackPrompt:
    """The most other words whose list fits `budget` tokens of this model."""
    encodings = {}

    def fits(rare: int) -> bool:
        if rare not in encodings:
            encodings[rare] = backend.encode(_render(sample, rare, backend, chat_template)[0])
        return len(encodings[rare].ids) <= budget

    if not fits(0):
        raise InputError(refusal)
    available = len(sample.extra["words"]) - len(sample.expected)
    per_entry = max(len(encodings[0].ids) // max(len(sample.expected) * sample.extra["freqs"][0], 1), 1)
    guess = (budget - len(encodings[0].ids)) // (per_entry * sample.extra["freqs"][1])
    rare = fitting.largest_fitting(fits, guess, available)
    text, entries, list_start = _render(sample, rare, backend, chat_template)
    encoding = encodings[rare]
    to_tokens = fitting.CharToToken(encoding.offsets)
    common = set(sample.expected)
    answers, cursor = [], list_start
    for i, word in enumerate(entries):
        at = text.index(f"{i + 1}. {word}", cursor) + len(f"{i + 1}. ")
        if word in common:
            answers.append(list(to_tokens.span(at, at + len(word))))
        cursor = at + len(word)
    return HaystackPrompt(
        ids=encoding.ids,
        text=text,
        offsets=encoding.offsets,
        haystack_words=len(entries),
        spans={"inserts": [], "answers": answers, "haystack": list(to_tokens.span(list_start, cursor))},
    )


def most_common_that_fit(options: CWEOptions, sample, backend, budget, chat_template) -> int:
    """The most common words whose sample, with no other word in its list, fits `budget` tokens of this model (0:
    none). Each count is its own sample (its example asks for as many words, its setting seeds its draws), built as a
    run at that count builds it; more words only lengthen the list, so the search may bisect."""
    from dataclasses import replace

    def fits(common: int) -> bool:
        if common == 0:
            return True
        fewer = replace(options, common=common)
        one = make_sample(fewer, sample.seed, sample.ctx, None, fewer.settings()[0], sample.index)
        return len(backend.encode(_render(one, 0, backend, chat_template)[0]).ids) <= budget

    return fitting.largest_fitting(fits, 1, len(sample.expected) - 1)


def most_that_fits(options: CWEOptions, sample, backend, budget, chat_template) -> str:
    common = most_common_that_fit(options, sample, backend, budget, chat_template)
    if not common:
        return f"no common word at frequency {sample.extra['freqs'][0]}: use a longer --ctx, or lower --frequencies"
    return f"{common} common words at frequency {sample.extra['freqs'][0]} (--common {common})"


def fewer_common_words(options: CWEOptions, sample, backend, budget, chat_template) -> CWEOptions | None:
    """The built-in models' run at the most common words that fit (their toy tokenizer cannot hold RULER's 10 at 30
    in 4K); None when not even one fits."""
    from dataclasses import replace

    common = most_common_that_fit(options, sample, backend, budget, chat_template)
    return replace(options, common=common) if common else None


def pieces(prompt: HaystackPrompt, sample, whole: bool) -> list:
    """The prompt with every occurrence of a common word marked; the other words are the distractors."""
    from diffeval.tasks.blocks import Mark

    starts = fitting.CharToToken(prompt.offsets).starts + [len(prompt.text)]
    out: list = []
    cursor = 0
    for start, end in prompt.spans["answers"]:
        out.append(prompt.text[cursor : starts[start]])
        word = prompt.text[starts[start] : starts[end]]
        out.append(Mark([word], tone="strong", kind="expected", note=f"common word: tokens {start}-{end}"))
        cursor = starts[end]
    out.append(prompt.text[cursor:])
    return [piece for piece in out if piece != ""]


RECIPE = Recipe(name="cwe", make_sample=make_sample, most_that_fits=most_that_fits, fit=fit, has_depth=False,
                pieces=pieces, shrink_for_builtin=fewer_common_words)  # fmt: skip
TASK = probe_task(
    RECIPE,
    CWEOptions,
    help="Common-words extraction: the most frequent words of a long list (RULER's cwe).",
    note="score = RULER's string_match_all: the fraction of the common words found in the output, any case; every "
    "other word of the list is a distractor",
    token_limit=TOKENS_TO_GENERATE,
)
