"""Needles with little literal overlap with their question (after NoLiMa, Modarressi et al. 2025).

Recipe (the rest is the haystack family's machinery, diffeval/tasks/haystack):
1. needle set: pairs of a needle ("Actually, {character} lives next to the Semper Opera House.") and a question that
   reaches it by one hop of association, not by shared words ("Which character has been to Dresden?"), each with a
   direct and an inverted template (the character first, or the fact first). diffeval ships 42 pairs written for
   it (data/needle_sets/nolima-diffeval.json); `--needle-set PATH` reads another file of that schema. Each pair's
   literal overlap (the share of the question's content words that the needle holds) is measured and reported.
2. sample: a pair (every pair in turn, in a seeded order per cell) and a character name, the needle at the cell's
   depth in the haystack (default the shipped novel). NoLiMa's distractor-free rule: haystack sentences that name the
   character or any of the pair's keywords are left out, so only the needle can answer.
3. prompt: the snippet, the question and an instruction to answer with the name alone; 32 tokens to generate.
4. score: the character's name in the output (the `ruler` rule: any case). Effective length as NoLiMa defines it:
   the longest length whose score keeps 85 % of the base score (`--base-lengths`, default those ≤ 1K).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from diffeval.config import option
from diffeval.data.haystack import source_files
from diffeval.errors import InputError
from diffeval.tasks.base import with_cells
from diffeval.tasks.haystack import samples
from diffeval.tasks.haystack.options import DepthOptions
from diffeval.tasks.haystack.probes import probe_task
from diffeval.tasks.haystack.recipe import Recipe, check_haystack

if TYPE_CHECKING:
    import pandas as pd

TOKENS_TO_GENERATE = 32
SHIPPED = Path(__file__).parents[2] / "data" / "needle_sets" / "nolima-diffeval.json"
TEMPLATES = ("direct", "inverted")
HEAD = "You will answer a question based on the following book snippet:\n\n"
STOP_WORDS = frozenset(
    "a an the of to in on at by for from with and or is are was were be been has have had do does did can cannot "
    "which who what whom whose character characters".split()
)


def tail(question: str) -> str:
    return (
        "\n\nUse the information provided in the book snippet to answer the question. Your answer should be short "
        f"and based on either explicitly stated facts or strong, logical inferences.\n\nQuestion: {question}\n\n"
        "Return only the final answer with no additional explanation or reasoning.\n"
    )


ANSWER_PREFIX = "Answer:"


@dataclass(frozen=True)
class NeedleSet:
    name: str
    digest: str  # the file's sha256 prefix: a sample's id changes with the set
    characters: list[str]
    pairs: list[dict]


def content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]+(?:-[a-z]+)*", text.lower()) if w not in STOP_WORDS}


def literal_overlap(pair: dict, template: str) -> float:
    """The share of the question's content words (stop words and "character" left out) that the needle holds."""
    question = content_words(pair["question"])
    needle = content_words(pair[template].replace("{character}", ""))
    return len(question & needle) / len(question) if question else 0.0


@lru_cache(maxsize=4)
def load_needle_set(path: str) -> NeedleSet:
    """A needle set file: {"name", "characters": [names], "pairs": [{"id", "question", "direct", "inverted",
    "keywords"}]}; each template holds {character} once. Missing or malformed files are one line."""
    file = Path(path).expanduser() if path else SHIPPED
    try:
        raw = file.read_bytes()
        data = json.loads(raw)
    except FileNotFoundError:
        raise InputError(f"needle set {file} does not exist: give a JSON file (docs/tasks/nolima.md), or leave "
                         "--needle-set out for the shipped one") from None  # fmt: skip
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read needle set {file} ({type(exc).__name__}): give valid JSON") from None
    problem = _problem(data)
    if problem:
        raise InputError(f"needle set {file} is malformed: {problem} (schema: docs/tasks/nolima.md)")
    digest = hashlib.sha256(raw).hexdigest()[:12]
    return NeedleSet(str(data.get("name", file.stem)), digest, list(data["characters"]), list(data["pairs"]))


def _problem(data) -> str | None:
    if not isinstance(data, dict):
        return "it is no JSON object"
    characters, pairs = data.get("characters"), data.get("pairs")
    if not isinstance(characters, list) or not characters or not all(isinstance(c, str) and c for c in characters):
        return '"characters" must be a non-empty list of names'
    if len(set(characters)) != len(characters):  # a repeated name would be drawn more often than the others
        return f'"characters" names {next(c for c in characters if characters.count(c) > 1)!r} twice'
    if not isinstance(pairs, list) or not pairs:
        return '"pairs" must be a non-empty list'
    seen = set()
    for n, pair in enumerate(pairs):
        if not isinstance(pair, dict):
            return f"pair {n} is no object"
        for key in ("id", "question", *TEMPLATES):
            if not isinstance(pair.get(key), str) or not pair[key]:
                return f"pair {n} lacks the text field {key!r}"
        for template in TEMPLATES:
            if pair[template].count("{character}") != 1:
                return f"pair {pair['id']!r}: its {template} needle must hold {{character}} once"
        keywords = pair.get("keywords")
        if not isinstance(keywords, list) or not all(isinstance(k, str) and k for k in keywords):
            return f'pair {pair["id"]!r}: "keywords" must be a list of words the haystack must not hold'
        if pair["id"] in seen:
            return f"pair id {pair['id']!r} repeats"
        seen.add(pair["id"])
    return None


@dataclass(frozen=True)
class NoLiMaOptions(DepthOptions):
    """Low-literal-overlap needles: the templates run, the needle set, the haystack."""

    templates: list[str] = option(
        list(TEMPLATES), help="needle templates: direct (character first), inverted (fact first), or both",
        parse=lambda text: [t.strip() for t in text.split(",")] if isinstance(text, str) else list(text),
    )  # fmt: skip
    needle_set: str = option(
        "",
        help="a needle set JSON file [default: the shipped nolima-diffeval set]",
        reads=lambda o: [Path(o.needle_set).expanduser()],
    )
    haystack: str = option(
        "book", help="book | essays:PATH | hf:DATASET[:SPLIT[:FIELD]] | noise", reads=lambda o: source_files(o.haystack)
    )

    def settings(self) -> list[str]:
        return list(self.templates)

    def validate(self) -> None:
        super().validate()
        unknown = [t for t in self.templates if t not in TEMPLATES]
        if unknown or not self.templates:
            raise InputError(f"--templates {','.join(self.templates)}: use direct, inverted or both")
        load_needle_set(self.needle_set)


def make_sample(options: NoLiMaOptions, seed: int, ctx: int, depth: int, setting: str, index: int):
    needles = load_needle_set(options.needle_set)
    key = samples.cell_key(seed, ctx, depth, setting, index) + f"|set={needles.digest}|haystack={options.haystack}"
    order = list(range(len(needles.pairs)))
    random.Random(f"nolima-order|{seed}|{ctx}|{depth}|{setting}").shuffle(order)
    pair = needles.pairs[order[index % len(order)]]
    rng = samples.sample_rng("nolima", key)
    character = rng.choice(needles.characters)
    needle = pair[setting].replace("{character}", character)
    return samples.new_sample(
        "nolima", key, ctx=ctx, depth=depth, setting=setting, seed=seed, index=index, head=HEAD,
        tail=tail(pair["question"]), answer_prefix=ANSWER_PREFIX,
        inserts=[samples.Insert(float(depth), needle, samples.ANSWER, [character])], expected=[character],
        haystack=options.haystack, haystack_seed=rng.randrange(2**31), token_limit=TOKENS_TO_GENERATE,
        exclude=[character, *pair["keywords"]], record_fields={"pair": pair["id"]},
    )  # fmt: skip


def most_that_fits(options, sample, backend, budget, chat_template) -> str:
    return "the needle and the question alone"


def needle_set_table(records: pd.DataFrame, options: NoLiMaOptions) -> pd.DataFrame:
    """Per pair: its literal overlap under each template run and each model's mean score."""
    import pandas as pd

    needles = load_needle_set(options.needle_set)
    by_id = {p["id"]: p for p in needles.pairs}
    scores = records.pivot_table(index="pair", columns="model", values="score", aggfunc="mean", sort=False)
    rows = {}
    for pair_id in scores.index:
        pair = by_id.get(pair_id)
        row = {"question": pair["question"] if pair else "(not in this needle set)"}
        for template in options.templates:
            row[f"overlap {template}"] = round(literal_overlap(pair, template), 3) if pair else None
        rows[pair_id] = {**row, **scores.loc[pair_id].round(3).to_dict()}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "pair"
    return with_cells(table, [{"pair": p} for p in table.index], [None] * (1 + len(options.templates))
                      + [{"model": m} for m in scores.columns])  # fmt: skip


RECIPE = Recipe(name="nolima", make_sample=make_sample, most_that_fits=most_that_fits)
TASK = probe_task(
    RECIPE,
    NoLiMaOptions,
    help="Needles with low literal overlap with their question (after NoLiMa).",
    note="score = 1 when the output names the needle's character (any case), else 0; the haystack holds no sentence "
    "naming the character or the pair's keywords; overlap = the share of the question's content words the needle "
    "holds",
    token_limit=TOKENS_TO_GENERATE,
    check_inputs=check_haystack,
    titles={"needle_set": "Needle set: each pair's literal overlap with its question, and each model's mean score"},
    extra_tables={"needle_set": needle_set_table},
    extra_schema={"pair": str},
)
