"""Noise probes beyond the paper: what RULER's distractor tasks and NoLiMa's needles share, on the long-context toolkit.

A probe task is a recipe module (mk_niah, mv_niah, vt, cwe, nolima) that says how one sample is made: its
instruction, question and answer prefix, the sentences it inserts into the haystack (each an `Insert`: the answer's,
or a distractor's) and the strings a right answer holds. This module does the rest, the same way for every probe:

1. samples: a recipe's `make_sample(options, seed, ctx, depth, setting, index)`, pure and seeded: the same for every
   model. The answer's first insert sits at the cell's depth, as in needle; a probe without depth (cwe) has None.
2. prompt: `fitting.fit` cuts the same haystack stream with each model's own tokenizer so that the prompt and the
   recipe's token limit (RULER's `tokens_to_generate`) fill 99-100 % of ctx; a recipe whose context is not a
   haystack (cwe's word list) brings its own `fit`. Token spans of every insert and every expected string are kept.
3. backend: greedy generation, stopped at a blank line (needle's rule, on every engine).
4. score: RULER's `string_match_all` (the `ruler` rule: the fraction of expected strings found, any case), or the
   recipe's own rule; `report --scoring` rescores stored outputs.
5. report: score by length and setting, a depth grid per model, the effective length (NoLiMa), the paired DIFF −
   baseline statistics per length and setting, and the cells where every model is at the floor, from which no
   difference is read.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from diffeval.config import context_option, int_list, option, parse_ctx
from diffeval.data.haystack import haystack_sentences
from diffeval.errors import InputError
from diffeval.longctx import fitting, scoring
from diffeval.longctx.lengths import (
    BASE_FLOOR,
    EFFECTIVE_FRACTION,
    effective_lengths,
    format_ctx,
    parse_format_ctx,
    position_curves,
)
from diffeval.models.backend import Backend
from diffeval.records import MayBeAbsent, Record, sample_id
from diffeval.tasks.base import ContextBudget, Reporting, Running, Scoring, Task, Viewing, with_cells

if TYPE_CHECKING:  # annotations only: heavy libraries load inside the functions that use them (a fast CLI)
    import pandas as pd

ANSWER, DISTRACTOR = "answer", "distractor"
STOP = ["\n\n"]
FLOOR = 0.05  # a cell where every model's mean score is at most this is at the floor: no difference is read from it


def parse_base_lengths(text):
    return parse_ctx(text) if text not in ("", []) else []


@dataclass(frozen=True)
class ProbeOptions:
    """What every probe takes: lengths, samples per cell, the base lengths of the effective length."""

    ctx: list[int] = context_option([4096], help="context lengths: 4k, 64K, 65536 or a comma list (k = 1024)")
    samples: int = option(50, help="samples per length × depth × setting cell", identity=False)
    base_lengths: list[int] = option(
        [],
        help="lengths whose mean is each model's base score for the effective length [default: those run ≤ 1K]",
        parse=parse_base_lengths,
        identity=False,
    )

    def settings(self) -> list[str]:
        """The task's settings run, one table column each (mk-niah's RULER variants); one by default."""
        return ["default"]

    def cell_depths(self) -> list[int | None]:
        return [None]

    def validate(self) -> None:
        if self.samples < 1:
            raise InputError(f"--samples {self.samples}: need at least 1 sample per cell")
        not_run = [length for length in self.base_lengths if length not in self.ctx]
        if not_run:
            raise InputError(
                f"--base-lengths {','.join(map(format_ctx, not_run))} is not among the run's lengths "
                f"({','.join(map(format_ctx, self.ctx))}): give base lengths from --ctx, or leave it out (those ≤ 1K)"
            )


@dataclass(frozen=True)
class DepthOptions(ProbeOptions):
    """A probe that places its answer at depths."""

    depths: list[int] = option(
        [0, 25, 50, 75, 100], help="depths of the answer's first insert in percent", parse=int_list("--depths")
    )

    def cell_depths(self) -> list[int | None]:
        return list(self.depths)

    def validate(self) -> None:
        super().validate()
        for depth in self.depths:
            if not 0 <= depth <= 100:
                raise InputError(f"depth {depth} is outside 0-100: give depths in percent, e.g. 0,25,50,75,100")


@dataclass(frozen=True)
class Insert:
    """A sentence inserted into the haystack at `depth` (percent): the answer's or a distractor's, with the strings in
    it a view marks (the expected values, or a distractor's values)."""

    depth: float
    text: str
    role: str  # ANSWER or DISTRACTOR
    values: list[str]


@dataclass(frozen=True)
class ProbeSample:
    sample_id: str
    task: str
    ctx: int
    depth: int | None  # where the answer's first insert sits (None: the probe has no depth)
    setting: str  # the task's setting (a table column): "multikey_2", "chains=1 hops=4"
    seed: int
    index: int
    head: str  # instruction (with its separator)
    tail: str  # question (with its separator)
    answer_prefix: str
    inserts: list[Insert]
    expected: list[str]
    haystack: str  # the haystack source (data/haystack.py)
    haystack_seed: int
    token_limit: int  # tokens generated at most, also reserved in the prompt (RULER's tokens_to_generate)
    exclude: list[str] = field(default_factory=list)  # haystack sentences naming one of these are left out (NoLiMa)
    extra: dict[str, Any] = field(default_factory=dict)  # what a recipe's own fit or view needs (cwe's word list)
    record_fields: dict[str, Any] = field(default_factory=dict)  # what a recipe adds to each record (nolima's pair)


def new_sample(task: str, key: str, **fields) -> ProbeSample:
    return ProbeSample(sample_id=sample_id(f"{task}|{key}"), task=task, **fields)


def sample_rng(task: str, key: str) -> random.Random:
    return random.Random(f"{task}|{key}")


def cell_key(seed: int, ctx: int, depth: int | None, setting: str, index: int) -> str:
    return f"seed={seed}|ctx={ctx}|depth={depth}|setting={setting}|i={index}"


def follow_depths(depth: float, count: int, rng: random.Random) -> list[float]:
    """`depth` and `count - 1` seeded depths after it, in order: an answer spread over several sentences (a chain)
    starts at the cell's depth."""
    return [float(depth)] + sorted(round(rng.uniform(depth, 100), 2) for _ in range(count - 1))


@dataclass
class ProbePrompt:
    ids: list[int]
    text: str
    offsets: list[tuple[int, int]]
    haystack_words: int  # haystack words (cwe: list entries) the model's budget held
    # token [start, end) spans: every insert (sample order), every expected string found in an answer insert, the
    # haystack; as records store them
    spans: dict[str, list] = field(default_factory=dict)
    depth_actual: float | None = None  # where the answer's first insert starts, as % of the haystack's tokens


def layout(sample: ProbeSample) -> fitting.Layout:
    return fitting.Layout(sample.head, [(i.depth, i.text) for i in sample.inserts], sample.tail, sample.answer_prefix)


def fit_haystack(sample: ProbeSample, backend: Backend, budget: int, chat_template: bool, refusal: str) -> ProbePrompt:
    """The sample's layout fitted into `budget` tokens of this model: the most haystack words that fit."""
    fitted = fitting.fit(layout(sample), backend, sample.haystack, sample.haystack_seed, budget, sample.ctx,
                         chat_template, refusal, tuple(sample.exclude))  # fmt: skip
    answers = [
        list(fitted.token_span_of(value, i))
        for i, insert in enumerate(sample.inserts)
        if insert.role == ANSWER
        for value in insert.values
    ]
    first_answer = next((i for i, insert in enumerate(sample.inserts) if insert.role == ANSWER), None)
    return ProbePrompt(
        ids=fitted.ids,
        text=fitted.text,
        offsets=fitted.offsets,
        haystack_words=fitted.haystack_words,
        spans={
            "inserts": [list(span) for span in fitted.insert_spans],
            "answers": answers,
            "haystack": list(fitted.haystack_span),
        },
        depth_actual=None if first_answer is None or sample.depth is None else fitted.depth_of(first_answer),
    )


@dataclass(frozen=True)
class Recipe:
    """What a probe module gives: its samples, and how far its prompt bends the shared machinery."""

    name: str
    make_sample: Callable[..., ProbeSample]  # (options, seed, ctx, depth, setting, index) → sample
    # (options, sample, backend, budget, chat template) → the most the sample's length holds, in the recipe's own
    # units ("3 keys"): named in the refusal when a sample's fixed part (instruction, inserts, question) overflows
    most_that_fits: Callable[..., str]
    # (sample, backend, budget, chat template, refusal) → prompt; the default fits a haystack with inserts
    fit: Callable[..., ProbePrompt] = fit_haystack
    # the depth grid and depth curves apply (cwe has no depth)
    has_depth: bool = True
    rules: tuple[str, ...] = ("ruler",)
    # (prompt, sample, whole) → the view's pieces of the prompt; the default marks the inserts in the haystack
    pieces: Callable[..., list] | None = None


def make_samples_for(recipe: Recipe):
    def make_samples(options, seed: int, limit: int | None = None, prepared=None) -> list[ProbeSample]:
        count = min(options.samples, limit) if limit else options.samples
        return [
            recipe.make_sample(options, seed, ctx, depth, setting, i)
            for ctx in options.ctx
            for setting in options.settings()
            for depth in options.cell_depths()
            for i in range(count)
        ]

    return make_samples


def check_haystack(config) -> None:
    """Fail before any work if the probe's haystack cannot be read."""
    haystack_sentences(config.options.haystack, config.seed, 10)


def check_fits_with(recipe: Recipe):
    def prepare(config, tokenizers: dict) -> None:
        """Refuse before any engine starts where a length cannot hold a sample's fixed part (too many keys, chains or
        common words): one fit per length and setting, per model, of the cell's first sample."""
        from diffeval.models.tokenizer import PromptTokenizer

        options = config.options
        prompt_tokenizers = [PromptTokenizer(tokenizer, name) for name, tokenizer in tokenizers.items()]
        for ctx in options.ctx:
            for setting in options.settings():
                sample = recipe.make_sample(options, config.seed, ctx, options.cell_depths()[0], setting, 0)
                for tokenizer in prompt_tokenizers:
                    fitted_prompt(recipe, sample, tokenizer, config)

    return prepare


def fitted_prompt(recipe: Recipe, sample: ProbeSample, backend: Backend, config) -> ProbePrompt:
    """The sample's prompt fitted to ctx minus its token limit (the task, the attention analysis and the viewer
    build prompts this one way); refused, naming the most that fits, when even no haystack leaves room."""
    budget = sample.ctx - sample.token_limit
    try:
        return recipe.fit(sample, backend, budget, config.chat_template, _refusal(sample))
    except InputError as exc:
        if str(exc) != _refusal(sample):
            raise
        most = recipe.most_that_fits(config.options, sample, backend, budget, config.chat_template)
        raise InputError(f"{exc}: at {format_ctx(sample.ctx)} this model holds at most {most}") from None


def _refusal(sample: ProbeSample) -> str:
    return (
        f"context {format_ctx(sample.ctx)} cannot hold {sample.task}'s instruction, inserts, question and "
        f"{sample.token_limit} answer tokens ({sample.setting})"
    )


def fixed_tokens(sample: ProbeSample, backend: Backend, chat_template: bool) -> int:
    """The sample's prompt without haystack words, in this model's tokens (a recipe's `most_that_fits` counts it)."""
    return len(backend.encode(layout(sample).render(fitting.Haystack([]), 0, backend, chat_template)[0]).ids)


def most_groups(sample: ProbeSample, backend: Backend, budget: int, chat_template: bool, per_group: int = 1) -> int:
    """The most leading groups of `per_group` inserts (keys, values, chains) whose fixed part fits `budget`, fewer
    than the sample has (it did not fit); 0 when none does. Fewer groups are the first of more (the recipes' draws
    do not depend on the count), so this is exact for the sample."""
    from dataclasses import replace

    for count in range(len(sample.inserts) // per_group - 1, 0, -1):
        fewer = replace(sample, inserts=sample.inserts[: count * per_group])
        if fixed_tokens(fewer, backend, chat_template) <= budget:
            return count
    return 0


def evaluate_with(recipe: Recipe):
    def prepare_batch(batch: list[ProbeSample], backend: Backend, config):
        return [(s, fitted_prompt(recipe, s, backend, config)) for s in batch]

    def evaluate(batch: list[tuple[ProbeSample, ProbePrompt]], backend: Backend, config) -> list[Record]:
        """Greedy answers for one batch on one model, as scored records; one generate call per token limit."""
        outputs = {}
        for limit in dict.fromkeys(sample.token_limit for sample, _ in batch):
            same = [i for i, (sample, _) in enumerate(batch) if sample.token_limit == limit]
            outputs.update(zip(same, backend.generate([batch[i][1].ids for i in same], limit, STOP)))
        return [
            record(recipe, s, p, backend.info.name, outputs[i].text, outputs[i].new_tokens, outputs[i].seconds,
                   outputs[i].batch)  # fmt: skip
            for i, (s, p) in enumerate(batch)
        ]

    return prepare_batch, evaluate


def record(recipe: Recipe, sample: ProbeSample, prompt: ProbePrompt, model: str, output: str, new_tokens: int,
           seconds: float, batch: int = 1) -> Record:  # fmt: skip
    value, correct = scoring.score(output, sample.expected, recipe.rules[0])
    fields = {
        "ctx": sample.ctx,
        "depth": sample.depth,
        "setting": sample.setting,
        "seed": sample.seed,
        "index": sample.index,
        "inserts": [{"role": i.role, "depth": i.depth, "values": i.values} for i in sample.inserts],
        "expected": sample.expected,
        "distractor_values": [v for i in sample.inserts if i.role == DISTRACTOR for v in i.values],
        "haystack_words": prompt.haystack_words,
        "depth_actual": prompt.depth_actual,
        "spans": prompt.spans,
        "output": output,
        "score": value,
        "correct": correct,
        "generation_batch": batch,
        "max_new_tokens": sample.token_limit,
        "hit_token_limit": new_tokens >= sample.token_limit,
        **sample.record_fields,
    }
    return Record(sample.task, model, sample.sample_id, len(prompt.ids), new_tokens, seconds, fields)


def rescore(records: pd.DataFrame, rule: str) -> pd.DataFrame:
    """The records scored by `rule` from their stored outputs, with `distractor_named`: the output holds a
    distractor's value (an answer copied from the wrong needle or chain)."""
    scored = [scoring.score(output, expected, rule) for output, expected in zip(records["output"], records["expected"])]
    named = [
        any(value.lower() in output.lower() for value in values)
        for output, values in zip(records["output"], records["distractor_values"])
    ]
    return records.assign(
        score=[value for value, _ in scored], correct=[correct for _, correct in scored], distractor_named=named
    )


def tables_for(recipe: Recipe, extra_tables: dict[str, Callable] | None = None):
    def tables(records: pd.DataFrame, options, paper: bool = False) -> dict[str, pd.DataFrame]:
        """Score by length and setting (rows = models), the floor cells, the answers' diagnostics, a depth × length
        grid per model where the probe has depth, and the effective length over several lengths."""
        import pandas as pd

        frame = records.assign(length=records["ctx"].map(format_ctx))
        lengths = sorted(frame["length"].unique(), key=parse_format_ctx)
        settings = list(dict.fromkeys(frame["setting"]))
        out = {}
        scores = frame.pivot_table(index="model", columns=["length", "setting"], values="score", aggfunc="mean",
                                   sort=False)  # fmt: skip
        scores = scores.reindex(columns=pd.MultiIndex.from_product([lengths, settings])).dropna(axis=1, how="all")
        column_cells = [{"ctx": parse_format_ctx(length), "setting": s} for length, s in scores.columns]
        floor = [(length, s) for length, s in scores.columns if (scores[(length, s)] <= FLOOR).all()]
        multi_setting = len(settings) > 1
        scores.columns = [f"{length} {s}" if multi_setting else length for length, s in scores.columns]
        out["scores"] = with_cells(scores.round(3), [{"model": m} for m in scores.index], column_cells)
        out["floor"] = _floor_table(floor, frame)
        out["answers"] = _answers(frame)
        if recipe.has_depth:
            for model, group in frame.groupby("model", sort=False):
                grid = group.pivot_table(index="depth", columns="length", values="score", aggfunc="mean")
                grid = grid.reindex(columns=[c for c in lengths if c in grid.columns])
                depths = [int(d) for d in grid.index]
                grid.index = [f"{d}%" for d in depths]
                grid.index.name = "depth"
                out[f"depth_grid:{model}"] = with_cells(
                    grid.round(3),
                    [{"depth": d} for d in depths],
                    [{"ctx": parse_format_ctx(c)} for c in grid.columns],
                    {"model": model},
                )
        if len(lengths) > 1:  # per setting: variants and templates differ in difficulty, their bases too
            parts, cells = [], []
            for setting in settings:
                table = effective_lengths(frame[frame["setting"] == setting], options.base_lengths)
                parts.append(table.assign(setting=setting).set_index("setting", append=True))
                cells += [{"model": m, "setting": setting} for m in table.index]
            table = pd.concat(parts)
            out["effective_length"] = with_cells(table, cells, [None] * table.shape[1])
        for key, make in (extra_tables or {}).items():
            out[key] = make(records, options)
        return out

    return tables


def _floor_table(floor: list[tuple[str, str]], frame: pd.DataFrame) -> pd.DataFrame:
    """The (length, setting) cells where every model's mean score is at most FLOOR, each model's mean beside."""
    import pandas as pd

    rows, cells = [], []
    for length, setting in floor:
        cell = frame[(frame["length"] == length) & (frame["setting"] == setting)]
        means = cell.groupby("model", sort=False)["score"].mean()
        rows.append({"length": length, "setting": setting, **{m: round(float(v), 3) for m, v in means.items()}})
        cells.append({"ctx": parse_format_ctx(length), "setting": setting})
    columns = ["length", "setting", *frame["model"].unique()]
    table = pd.DataFrame(rows, columns=columns).set_index(["length", "setting"])
    return with_cells(table, cells, [{"model": m} for m in table.columns])


def _answers(frame: pd.DataFrame) -> pd.DataFrame:
    """Per model: samples, accuracy, the share of outputs naming a distractor's value, samples stopped at the token
    limit."""
    frame = frame.assign(hit=frame["hit_token_limit"].fillna(False))
    table = frame.groupby("model", sort=False).agg(
        samples=("sample_id", "count"),
        accuracy=("score", "mean"),
        all_found=("correct", "mean"),
        distractor_named=("distractor_named", "mean"),
        at_token_limit=("hit", "sum"),
    )
    table["at_token_limit"] = table["at_token_limit"].astype(int)
    return with_cells(table.round(3), [{"model": m} for m in table.index], [{}] * table.shape[1])


def sample_view_for(recipe: Recipe):
    def sample_view(config, records: dict[str, dict], tokenizer_for, full_text: bool | None):
        """Each model's prompt, rebuilt from the run's config (samples are pure and seeded), cut at its token spans:
        the answer's inserts marked strong with their expected strings, distractors faint, haystack stretches elided
        when long."""
        from diffeval.tasks.blocks import Document, Notice, Section, Text

        first = next(iter(records.values()))
        sample = recipe.make_sample(config.options, first["seed"], first["ctx"], first["depth"], first["setting"],
                                    first["index"])  # fmt: skip
        if sample.sample_id != first["sample_id"]:
            raise InputError(
                "this diffeval builds another sample from the recorded parameters: view it with the version "
                f"that ran it ({first['sample_id']} vs {sample.sample_id})"
            )
        sections = []
        for model, stored in records.items():
            try:
                prompt = fitted_prompt(recipe, sample, tokenizer_for(model), config)
            except Exception as exc:  # a tokenizer or haystack unreachable where one views: the records still show
                sections.append(Section([Notice(f"prompt text unavailable: {exc}")], title=f"Prompt ({model})",
                                        model=model))  # fmt: skip
                continue
            whole = len(prompt.ids) <= VIEW_FULL_TOKENS if full_text is None else full_text
            spans = json.loads(json.dumps(prompt.spans))
            blocks = []
            if len(prompt.ids) != stored.get("prompt_tokens") or spans != stored.get("spans"):
                blocks.append(Notice("the rebuilt prompt differs from the recorded one (tokenizer or data changed "
                                     "since the run)", model=model))  # fmt: skip
            pieces = (recipe.pieces or prompt_pieces)(prompt, sample, whole)
            blocks.append(Text(pieces, style="prompt", model=model))
            title = f"Prompt as {model} tokenized it ({len(prompt.ids)} tokens)"
            sections.append(Section(blocks, title=title, model=model))
        return Document(sections)

    return sample_view


VIEW_EDGE_TOKENS = 32
VIEW_FULL_TOKENS = 16384


def prompt_pieces(prompt: ProbePrompt, sample: ProbeSample, whole: bool) -> list:
    """The prompt's text in pieces that tile it: scaffold, haystack stretches (elided when long), each insert marked
    (the answer's strong with its expected strings inside, distractors faint)."""
    from diffeval.tasks.blocks import Elided, Mark, Span

    text = prompt.text
    starts = fitting.CharToToken(prompt.offsets).starts + [len(text)]

    def piece(a: int, b: int) -> str:
        return text[starts[a] : starts[b]]

    def haystack(a: int, b: int):
        edge = VIEW_EDGE_TOKENS
        if b - a <= 2 * edge + 16:
            return Span(piece(a, b))
        hidden = f"… {b - a - 2 * edge} haystack tokens …"
        return Elided(piece(a, a + edge), piece(b - edge, b), hidden, piece(a, b) if whole else None, tone="muted")

    hay_start, hay_end = prompt.spans["haystack"]
    pieces: list = [piece(0, hay_start)]
    cursor = hay_start
    for (start, end), insert in sorted(zip(map(tuple, prompt.spans["inserts"]), sample.inserts),
                                       key=lambda pair: pair[0]):  # fmt: skip
        if start < cursor:  # inserts sharing a token with the previous one: shown with it
            continue
        if start > cursor:
            pieces.append(haystack(cursor, start))
        sentence = text[starts[start] : starts[end]]
        inner = _marked_values(sentence, insert) if insert.role == ANSWER else [sentence]
        pieces.append(Mark(
            inner, tone="highlight" if insert.role == ANSWER else "faint",
            kind="needle" if insert.role == ANSWER else "needle other",
            note=f"{insert.role}: tokens {start}-{end}" + (f" (expected {', '.join(insert.values)})"
                                                             if insert.role == ANSWER else ""),
        ))  # fmt: skip
        cursor = end
    if hay_end > cursor:
        pieces.append(haystack(cursor, hay_end))
    pieces.append(piece(hay_end, len(prompt.ids)))
    return pieces


def _marked_values(sentence: str, insert: Insert) -> list:
    """An answer insert's text with each of its expected strings marked."""
    from diffeval.tasks.blocks import Mark

    pieces: list = []
    cursor = 0
    for value in insert.values:
        at = sentence.find(value, cursor)
        if at < 0:
            continue
        if at > cursor:
            pieces.append(sentence[cursor:at])
        pieces.append(Mark([value], tone="strong", kind="expected", note=f"expected {value}"))
        cursor = at + len(value)
    if cursor < len(sentence):
        pieces.append(sentence[cursor:])
    return pieces


def sizing_for(recipe: Recipe):
    def sizing(samples: list[ProbeSample], tokenizer, config) -> tuple[int, int]:
        """Prompt tokens of every sample, from one exact fit per length and setting (a fit fills 99-100 % of its
        budget, so the others are counted at that fit's size), and generated tokens at most."""
        exact: dict[tuple[int, str], int] = {}
        prompt_tokens = generated = 0
        for sample in samples:
            key = (sample.ctx, sample.setting)
            if key not in exact:
                exact[key] = len(fitted_prompt(recipe, sample, tokenizer, config).ids)
            prompt_tokens += exact[key]
            generated += sample.token_limit
        return prompt_tokens, generated

    return sizing


RECORD_SCHEMA = {
    "ctx": int,
    "depth": int | None,
    "setting": str,
    "seed": int,
    "index": int,
    "expected": list[str],
    "distractor_values": list[str],
    "output": str,
    "score": float,
    "correct": bool,
    "hit_token_limit": bool,
    "spans": MayBeAbsent(dict),
    "prompt_tokens": MayBeAbsent(int),
}

MIN_PROMPT_TOKENS = 64


def probe_task(recipe: Recipe, options: type, help: str, note: str, token_limit: Callable[[Any], int],
               check_inputs: Callable | None = None, titles: dict[str, str] | None = None,
               extra_tables: dict[str, Callable] | None = None, extra_schema: dict | None = None) -> Task:  # fmt: skip
    """The `Task` of a probe recipe: the shared running, reporting, viewing and scoring above; `extra_tables` (key →
    (records, options) → DataFrame) and `extra_schema` (the record fields they read) are the recipe's own."""
    prepare_batch, evaluate = evaluate_with(recipe)

    def budget(config) -> ContextBudget:
        return ContextBudget(config.options.ctx, token_limit(config.options), MIN_PROMPT_TOKENS)

    return Task(
        name=recipe.name,
        help=help,
        options=options,
        running=Running(
            make_samples=make_samples_for(recipe),
            evaluate=evaluate,
            needs=frozenset({"generate"}),
            budget=budget,
            check_inputs=check_inputs,
            prepare=check_fits_with(recipe),
            prepare_batch=prepare_batch,
            sizing=sizing_for(recipe),
        ),
        reporting=Reporting(
            tables=tables_for(recipe, extra_tables),
            titles={
                "scores": "Score by length (and setting)",
                "floor": f"Cells at the floor: every model's mean score ≤ {FLOOR}; no difference is read from them",
                "answers": "Answers: mean score, all expected found, outputs naming a distractor's value, samples "
                "stopped at the token limit",
                "depth_grid": "Depth x length grid",
                "effective_length": f"Effective length (NoLiMa): the longest length up to which every length keeps "
                f"{EFFECTIVE_FRACTION:.0%} of the base score (mean over the base lengths); undefined when the base "
                f"is below {BASE_FLOOR}; 95 % bootstrap interval over samples",
                **(titles or {}),
            },
            note=note,
            summary_keys=["model", "ctx", "depth", "setting"] if recipe.has_depth else ["model", "ctx", "setting"],
            pair_keys=["ctx", "setting"],
            metrics={"accuracy": "score"},
            decimals={"resamples with base below floor": 0},
            plots=plots_for(recipe),
            floor=FLOOR,
        ),
        viewing=Viewing(sample_view=sample_view_for(recipe)),
        scoring=Scoring(
            record_schema={**RECORD_SCHEMA, **(extra_schema or {})},
            rules=scoring.described(recipe.rules),
            rescore=rescore,
        ),
    )


def plots_for(recipe: Recipe):
    def plots(records: pd.DataFrame, folder) -> list:
        """Score by depth, one line per length, one panel per model (probes with depth)."""
        if not recipe.has_depth:
            return []
        frame = records.assign(length=records["ctx"].map(format_ctx))
        models = list(frame["model"].unique())
        lengths = sorted(frame["length"].unique(), key=parse_format_ctx)
        return [position_curves(frame, models, lengths, folder / f"{recipe.name}_position_curves.png",
                                "answer depth (%)")]  # fmt: skip

    return plots
