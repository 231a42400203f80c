"""Multi-needle needle-in-a-haystack (paper Table 2 and Figure 5; the LWM / Gemini 1.5 protocol).

Recipe:
1. samples: N needles "The special magic number for CITY is: NNNNNNN." with unique cities and 7-digit numbers;
   the first of the R queried needles sits at the cell's depth, the others at seeded random depths. A sample is a
   pure function of (seed, ctx, depth, N, R, index): the same for every model.
2. prompt: instruction, haystack with the needles at sentence boundaries, question, answer prefix. Each model's
   tokenizer cuts the same haystack stream so that prompt + the sample's token limit fills 99-100 % of ctx (binary
   search on words, as RULER does); token offsets of every needle and number are recorded. The token limit is
   --max-new-tokens, or by default the expected answer's length in the model's own tokens plus a margin per queried
   needle, at least 32: a tokenizer that spends a token per digit is never cut short.
3. backend: greedy generation, stopped at a blank line; the record says when it stopped at the token limit.
4. score: the fraction of the R expected numbers found in the output under a named scoring rule (SCORING_RULES:
   `default` at run time; `diffeval report --scoring ruler` rescores the stored outputs); `correct` = all found.

The rest is the long-context toolkit (diffeval/longctx): prompt fitting and haystack streams (`fitting`), the scoring
rules (`scoring`), length names, effective length and position curves (`lengths`); the cities are data/cities.py.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from diffeval.config import context_option, int_list, option, parse_ctx
from diffeval.data.cities import CITIES
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
from diffeval.paper import TABLE2
from diffeval.records import MayBeAbsent, Record, sample_id
from diffeval.tasks.base import ContextBudget, Reporting, Running, Scoring, Task, Viewing, with_cells, with_rows

if TYPE_CHECKING:  # annotations only: heavy libraries load inside the functions that use them (a fast CLI)
    import pandas as pd


@dataclass(frozen=True)
class NeedleOptions:
    """The multi-needle task: N needles per sample, R of them queried, at every ctx × depth × (N, R)."""

    ctx: list[int] = context_option([4096], help="context lengths: 4k, 64K, 65536 or a comma list (k = 1024)")
    needles: list[int] = option(
        [1], help="N, needles per sample; a comma list runs several N/R settings", parse=int_list("--needles")
    )
    queries: list[int] = option(
        [1], help="R, needles queried per sample; one value or one per N", parse=int_list("--queries")
    )
    depths: list[int] = option(
        [0, 25, 50, 75, 100],
        help="depths of the first queried needle in percent, e.g. 0,25,50,75,100",
        parse=int_list("--depths"),
    )
    samples: int = option(50, help="samples per depth × length × N/R cell", identity=False)
    haystack: str = option("noise", help="noise | essays:PATH | hf:DATASET[:SPLIT[:FIELD]]")
    base_lengths: list[int] = option(
        [],
        help="lengths whose mean is each model's base score for the effective length [default: those run ≤ 1K]",
        parse=lambda text: parse_ctx(text) if text not in ("", []) else [],
        identity=False,
    )

    def nr_pairs(self) -> list[tuple[int, int]]:
        return list(zip(self.needles, self.queries, strict=True))

    def validate(self) -> None:
        if len(self.queries) == 1 and len(self.needles) > 1:
            object.__setattr__(self, "queries", self.queries * len(self.needles))
        if len(self.needles) != len(self.queries):
            raise InputError(
                f"--needles {self.needles} and --queries {self.queries} differ in length: "
                "give one R for all or one R per N"
            )
        for n, r in self.nr_pairs():
            if r < 1 or n < r:
                raise InputError(f"needles N={n}, queries R={r}: need 1 <= R <= N")
            if n > 64:
                raise InputError(f"needles N={n}: at most 64 needles per sample")
        for depth in self.depths:
            if not 0 <= depth <= 100:
                raise InputError(f"depth {depth} is outside 0-100: give depths in percent, e.g. 0,25,50,75,100")
        if self.samples < 1:
            raise InputError(f"--samples {self.samples}: need at least 1 sample per cell")
        not_run = [length for length in self.base_lengths if length not in self.ctx]
        if not_run:
            raise InputError(
                f"--base-lengths {','.join(map(format_ctx, not_run))} is not among the run's lengths "
                f"({','.join(map(format_ctx, self.ctx))}): give base lengths from --ctx, or leave it out (those ≤ 1K)"
            )


INSTRUCTION = (
    "Some special magic numbers are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the numbers afterwards."
)
STOP = ["\n\n"]


def needle_sentence(city: str, number: str) -> str:
    return f"The special magic number for {city} is: {number}."


def question(cities: list[str]) -> str:
    if len(cities) == 1:
        return f"What is the special magic number for {cities[0]} mentioned in the provided text?"
    return f"What are all the special magic numbers for {_join(cities)} mentioned in the provided text?"


def answer_prefix(cities: list[str]) -> str:
    if len(cities) == 1:
        return f"The special magic number for {cities[0]} mentioned in the provided text is:"
    return f"The special magic numbers for {_join(cities)} mentioned in the provided text are:"


def _join(items: list[str]) -> str:
    return ", ".join(items[:-1]) + " and " + items[-1]


@dataclass(frozen=True)
class NeedleSample:
    sample_id: str
    ctx: int
    depth: int
    needles: int
    queries: int
    seed: int
    index: int
    cities: list[str]  # all N; the first R are queried, cities[0] sits at `depth`
    numbers: list[str]
    needle_depths: list[float]  # requested depth (percent) of each needle
    haystack_seed: int

    @property
    def expected(self) -> list[str]:
        return self.numbers[: self.queries]


def make_sample(seed: int, ctx: int, depth: int, n: int, r: int, index: int, cities=CITIES) -> NeedleSample:
    key = f"needle|seed={seed}|ctx={ctx}|depth={depth}|N={n}|R={r}|i={index}"
    rng = random.Random(key)
    chosen = rng.sample(list(cities), n)
    numbers: list[str] = []
    while len(numbers) < n:
        number = str(rng.randint(1_000_000, 9_999_999))
        if number not in numbers:
            numbers.append(number)
    depths = [float(depth)] + [round(rng.uniform(0, 100), 2) for _ in range(n - 1)]
    return NeedleSample(
        sample_id=sample_id(key),
        ctx=ctx,
        depth=depth,
        needles=n,
        queries=r,
        seed=seed,
        index=index,
        cities=chosen,
        numbers=numbers,
        needle_depths=depths,
        haystack_seed=rng.randrange(2**31),
    )


def make_samples(options, seed: int, limit: int | None = None, prepared=None) -> list[NeedleSample]:
    count = min(options.samples, limit) if limit else options.samples
    return [
        make_sample(seed, ctx, depth, n, r, i)
        for ctx in options.ctx
        for n, r in options.nr_pairs()
        for depth in options.depths
        for i in range(count)
    ]


@dataclass
class NeedlePrompt:
    ids: list[int]
    haystack_words: int
    spans: dict[str, list] = field(default_factory=dict)  # token [start, end) spans
    depth_actual: float = 0.0  # where the first queried needle starts, as % of the haystack's tokens
    text: str = ""  # the prompt as text, and each token's character span in it (`diffeval view` shows it)
    offsets: list[tuple[int, int]] = field(default_factory=list)


def layout(sample: NeedleSample) -> fitting.Layout:
    """The sample's prompt before fitting: instruction, haystack with every needle at its depth, question, answer
    prefix."""
    queried = sample.cities[: sample.queries]
    needles = [(d, needle_sentence(c, n)) for d, c, n in zip(sample.needle_depths, sample.cities, sample.numbers)]
    return fitting.Layout(INSTRUCTION + "\n\n", needles, "\n\n" + question(queried) + " ", answer_prefix(queried))


def _too_long(sample: NeedleSample) -> str:
    return (
        f"context {sample.ctx} cannot hold the instruction, {sample.needles} needles, the question and "
        "--max-new-tokens: use a longer --ctx or fewer needles"
    )


def build_prompt(sample: NeedleSample, source: str, backend: Backend, budget: int, chat_template: bool) -> NeedlePrompt:
    """Fit the sample into `budget` tokens of this model: the most haystack words that fit."""
    fitted = fitting.fit(
        layout(sample), backend, source, sample.haystack_seed, budget, sample.ctx, chat_template, _too_long(sample)
    )
    number_spans = [fitted.token_span_of(number, i) for i, number in enumerate(sample.numbers)]
    return NeedlePrompt(
        ids=fitted.ids,
        haystack_words=fitted.haystack_words,
        spans={"needles": fitted.insert_spans, "numbers": number_spans, "haystack": list(fitted.haystack_span)},
        depth_actual=fitted.depth_of(0),
        text=fitted.text,
        offsets=fitted.offsets,
    )


SCORING_RULES = scoring.described(("default", "ruler"))


def rescore(records: pd.DataFrame, rule: str) -> pd.DataFrame:
    """The records scored by `rule` from their stored outputs, with the rule-independent answer diagnostics:
    `unqueried_numbers` (the output names a number of a needle that was not asked for) and `precision` (expected
    numbers found ÷ distinct numbers in the output; empty where the output has none)."""
    scored = [scoring.score(output, expected, rule) for output, expected in zip(records["output"], records["expected"])]
    found = [scoring.numbers_in(output) for output in records["output"]]
    unqueried = [
        bool(found_here & (set(numbers) - set(expected)))
        for found_here, numbers, expected in zip(found, records["numbers"], records["expected"])
    ]
    precision = [
        len(found_here & set(expected)) / len(found_here) if found_here else float("nan")
        for found_here, expected in zip(found, records["expected"])
    ]
    return records.assign(
        score=[value for value, _ in scored],
        correct=[correct for _, correct in scored],
        unqueried_numbers=unqueried,
        precision=precision,
    )


def record(
    sample: NeedleSample,
    prompt: NeedlePrompt,
    model: str,
    output: str,
    new_tokens: int,
    seconds: float,
    batch: int = 1,
    token_limit: int = 32,
):
    value, correct = scoring.score(output, sample.expected)
    fields = asdict(sample)
    for key in ("sample_id", "haystack_seed"):
        fields.pop(key)
    fields.update(
        haystack_words=prompt.haystack_words,
        depth_actual=prompt.depth_actual,
        spans=prompt.spans,
        expected=sample.expected,
        output=output,
        score=value,
        correct=correct,
        generation_batch=batch,  # prompts that shared the forward pass (hf runs long prompts one at a time)
        max_new_tokens=token_limit,
        hit_token_limit=new_tokens >= token_limit,  # the answer may have been cut short
    )
    return Record("needle", model, sample.sample_id, len(prompt.ids), new_tokens, seconds, fields)


def tables(records: pd.DataFrame, options: NeedleOptions, paper: bool = False) -> dict[str, pd.DataFrame]:
    """Table 2 layout (rows = models, columns = N/R, per length) and a depth × length grid per model; with several
    lengths, the effective length over the run's `options.base_lengths`."""
    import pandas as pd

    frame = records.assign(nr=records["needles"].astype(str) + "/" + records["queries"].astype(str))
    frame["length"] = frame["ctx"].map(format_ctx)
    nr_order = sorted(frame["nr"].unique(), key=lambda s: tuple(int(x) for x in s.split("/")))
    out = {}
    table2 = frame.pivot_table(index="model", columns=["length", "nr"], values="score", aggfunc="mean", sort=False)
    lengths = sorted(frame["length"].unique(), key=parse_format_ctx)
    table2 = table2.reindex(columns=pd.MultiIndex.from_product([lengths, nr_order])).dropna(axis=1, how="all")
    column_cells = [_cell(length, nr) for length, nr in table2.columns]
    table2.columns = [f"{length} N/R={nr}" for length, nr in table2.columns]
    row_cells = [{"model": m} for m in table2.index]
    if paper and "4K" in lengths:  # the paper's Table 2 is at 4K
        rows = {
            m: {f"4K N/R={nr}": v for nr, v in cells.items() if f"4K N/R={nr}" in table2.columns}
            for m, cells in TABLE2.items()
        }
        table2 = with_rows(table2, pd.DataFrame.from_dict(rows, orient="index"))
    out["table2"] = with_cells(table2.round(3), row_cells, column_cells)
    out["answers"] = _answers(frame)
    if len(lengths) > 1:
        out["effective_length"] = effective_length_table(frame, options.base_lengths)
    for model, group in frame.groupby("model", sort=False):
        grid = group.pivot_table(index="depth", columns="length", values="score", aggfunc="mean")
        grid = grid.reindex(columns=[c for c in lengths if c in grid.columns])
        depths = list(grid.index)
        grid.index = [f"{d}%" for d in grid.index]
        grid.index.name = "depth"
        out[f"depth_grid:{model}"] = with_cells(
            grid.round(3), [{"depth": d} for d in depths], [_cell(c) for c in grid.columns], {"model": model}
        )
    return out


def effective_length_table(frame: pd.DataFrame, base_lengths: list[int]) -> pd.DataFrame:
    """Per model, the effective length and its interval (longctx.lengths.effective_lengths), each row the model's
    records."""
    table = effective_lengths(frame, base_lengths)
    return with_cells(table, [{"model": m} for m in table.index], [None] * table.shape[1])


def _answers(frame: pd.DataFrame) -> pd.DataFrame:
    """Per model: samples, accuracy, the share of outputs naming an unqueried needle's number, precision (expected
    numbers found ÷ numbers in the output, over outputs with a number), and samples stopped at the token limit
    (records from before that field was kept count as not stopped)."""
    frame = frame.assign(hit=frame["hit_token_limit"].fillna(False) if "hit_token_limit" in frame else False)
    table = frame.groupby("model", sort=False).agg(
        samples=("sample_id", "count"),
        accuracy=("score", "mean"),
        unqueried_numbers=("unqueried_numbers", "mean"),
        precision=("precision", "mean"),
        at_token_limit=("hit", "sum"),
    )
    table["at_token_limit"] = table["at_token_limit"].astype(int)
    return with_cells(table.round(3), [{"model": m} for m in table.index], [{}] * table.shape[1])


def _cell(length: str, nr: str | None = None) -> dict:
    """The records behind a table column: its length (and N/R), as record values."""
    cell: dict = {"ctx": parse_format_ctx(length)}
    if nr is not None:
        needles, queries = nr.split("/")
        cell.update(needles=int(needles), queries=int(queries))
    return cell


def plots(records: pd.DataFrame, folder: Path) -> list[Path]:
    """Figure 5 style: a depth × length accuracy heatmap per model, side by side on one colour scale."""
    import numpy as np

    from diffeval.plotting import plt

    frame = records.assign(length=records["ctx"].map(format_ctx))
    models = list(frame["model"].unique())
    lengths = sorted(frame["length"].unique(), key=parse_format_ctx)
    fig, axes = plt.subplots(1, len(models), figsize=(1.2 + 1.1 * len(lengths) * len(models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], models):
        grid = (
            frame[frame["model"] == model]
            .pivot_table(index="depth", columns="length", values="score", aggfunc="mean")
            .reindex(columns=lengths)
        )
        image = ax.imshow(grid.to_numpy(), vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        ax.set_xticks(range(len(lengths)), lengths)
        ax.set_yticks(range(len(grid.index)), [f"{d}%" for d in grid.index])
        for (i, j), value in np.ndenumerate(grid.to_numpy()):
            if not np.isnan(value):
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7)
        ax.set(title=f"{model} (mean over N/R)", xlabel="context length")
    axes[0][0].set_ylabel("answer needle depth")
    fig.colorbar(image, ax=axes[0].tolist(), label="accuracy")
    path = folder / "needle_heatmap.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    curves = position_curves(frame, models, lengths, folder / "needle_position_curves.png", "answer needle depth (%)")
    return [path, curves]


def check_inputs(config) -> None:
    """Fail before any work if the haystack cannot be read."""
    haystack_sentences(config.options.haystack, config.seed, 10)


MIN_NEW_TOKENS = 32
ANSWER_MARGIN_PER_QUERY = 16  # tokens per queried needle beyond its number: a city name, punctuation, a restated phrase


def token_limit(sample: NeedleSample, tokenizer, config) -> int:
    """Tokens to generate for this sample on this model, also reserved in its prompt budget: --max-new-tokens when
    given; else the expected answer's length in the model's own tokens plus a margin per queried needle, at least
    MIN_NEW_TOKENS."""
    if config.max_new_tokens is not None:
        return config.max_new_tokens
    answer = tokenizer.encode(" " + ", ".join(sample.expected), special_tokens=False).ids
    return max(MIN_NEW_TOKENS, len(answer) + ANSWER_MARGIN_PER_QUERY * len(sample.expected))


def fitted_prompt(sample: NeedleSample, tokenizer, config) -> tuple[NeedlePrompt, int]:
    """The sample's prompt fitted to ctx minus its token limit, and the limit (needle, attention and the viewer
    build prompts this one way)."""
    limit = token_limit(sample, tokenizer, config)
    prompt = build_prompt(sample, config.options.haystack, tokenizer, sample.ctx - limit, config.chat_template)
    return prompt, limit


def prepare_batch(batch: list[NeedleSample], backend: Backend, config) -> list[tuple[NeedleSample, NeedlePrompt, int]]:
    return [(s, *fitted_prompt(s, backend, config)) for s in batch]


def evaluate(batch: list[tuple[NeedleSample, NeedlePrompt, int]], backend: Backend, config) -> list[Record]:
    """Greedy answers for one batch of samples on one model, as scored records; one generate call per token limit."""
    outputs = {}
    for limit in dict.fromkeys(limit for _, _, limit in batch):
        same = [i for i, (_, _, each) in enumerate(batch) if each == limit]
        outputs.update(zip(same, backend.generate([batch[i][1].ids for i in same], limit, STOP)))
    return [
        record(s, p, backend.info.name, outputs[i].text, outputs[i].new_tokens, outputs[i].seconds, outputs[i].batch,
               limit)  # fmt: skip
        for i, (s, p, limit) in enumerate(batch)
    ]


VIEW_EDGE_TOKENS = 32  # haystack tokens shown on each side of an elided stretch
VIEW_FULL_TOKENS = 16384  # prompts up to this length come with their whole haystack text


def sample_view(config, records: dict[str, dict], tokenizer_for, full_text: bool | None):
    """Each model's prompt for `diffeval view`, rebuilt from the run's config (samples are pure and seeded), cut at
    its token spans (the recorded ones, unless a notice says the rebuilt prompt differs): head, haystack stretches,
    needles with their numbers marked, tail. A long haystack stretch comes as its two ends, and whole too when
    `full_text` (None: when the prompt has at most VIEW_FULL_TOKENS tokens), so the page can show the middle."""
    from diffeval.tasks.blocks import Document, Notice, Section, Text

    first = next(iter(records.values()))
    sample = make_sample(
        first["seed"], first["ctx"], first["depth"], first["needles"], first["queries"], first["index"]
    )
    if sample.sample_id != first["sample_id"]:
        raise InputError(
            "this diffeval builds another sample from the recorded parameters: view it with the version "
            f"that ran it ({first['sample_id']} vs {sample.sample_id})"
        )
    sections = []
    for model, record in records.items():
        try:
            prompt, _ = fitted_prompt(sample, tokenizer_for(model), config)
        except Exception as exc:  # a tokenizer or haystack unreachable where one views: the records still show
            unavailable = Notice(f"prompt text unavailable: {exc}")
            sections.append(Section([unavailable], title=f"Prompt ({model})", model=model))
            continue
        whole = len(prompt.ids) <= VIEW_FULL_TOKENS if full_text is None else full_text
        spans = json.loads(json.dumps(prompt.spans))  # as a record stores them: tuples become lists
        blocks = []
        if len(prompt.ids) != record["prompt_tokens"] or spans != record["spans"]:
            blocks.append(Notice("the rebuilt prompt differs from the recorded one (tokenizer or data changed "
                                 "since the run)", model=model))  # fmt: skip
        blocks.append(Text(_prompt_pieces(prompt, spans, sample, whole), style="prompt", model=model))
        title = f"Prompt as {model} tokenized it ({len(prompt.ids)} tokens)"
        sections.append(Section(blocks, title=title, model=model))
    return Document(sections)


def _prompt_pieces(prompt: NeedlePrompt, spans: dict, sample: NeedleSample, whole: bool) -> list:
    """The prompt's text in pieces that tile it: scaffold text, haystack stretches (elided when long), and each
    needle marked (unqueried ones faint) with its number's own tokens marked inside it."""
    from diffeval.tasks.blocks import Elided, Mark, Span

    text, offsets = prompt.text, prompt.offsets
    # token i's first character; slices between them tile the text
    starts = fitting.CharToToken(offsets).starts + [len(text)]

    def piece(a: int, b: int) -> str:
        return text[starts[a] : starts[b]]

    def haystack(a: int, b: int):
        """A stretch of haystack: its two ends and how much lies between (the page shows that much until asked),
        with the whole text when `whole`; a short stretch whole."""
        edge = VIEW_EDGE_TOKENS
        if b - a <= 2 * edge + 16:
            return Span(piece(a, b))
        hidden = f"… {b - a - 2 * edge} haystack tokens …"
        return Elided(piece(a, a + edge), piece(b - edge, b), hidden, piece(a, b) if whole else None, tone="muted")

    hay_start, hay_end = spans["haystack"]
    pieces: list = [piece(0, hay_start)]
    cursor = hay_start
    needles = zip(spans["needles"], spans["numbers"], sample.cities, sample.numbers, range(sample.needles))
    for (start, end), (number_start, number_end), city, number, i in sorted(needles):
        if start > cursor:
            pieces.append(haystack(cursor, start))
        number_chars = offsets[number_start][0], offsets[number_end - 1][1]  # the number's own tokens, exactly
        queried = i < sample.queries
        marked = Mark([text[number_chars[0] : number_chars[1]]], tone="strong", kind="number",
                      note=f"recorded span: tokens {number_start}-{number_end} (expected {number})")  # fmt: skip
        pieces.append(Mark(
            [text[starts[start] : number_chars[0]], marked, text[number_chars[1] : starts[end]]],
            tone="highlight" if queried else "faint", kind="needle" if queried else "needle other",
            note=f"{'queried' if queried else 'other'} needle: {city}, tokens {start}-{end}",
        ))  # fmt: skip
        cursor = end
    if hay_end > cursor:
        pieces.append(haystack(cursor, hay_end))
    pieces.append(piece(hay_end, len(prompt.ids)))
    return pieces


def sizing(samples: list[NeedleSample], tokenizer, config) -> tuple[int, int]:
    """Prompt tokens of every sample as this model's tokenizer would fit them, and generated tokens at most (each
    sample's token limit), without fitting each prompt: a prompt is its fixed part (instruction, needles, question)
    plus the haystack words a fit tries first, read off one haystack stream's per-word token counts; one exact fit per
    length adds what that misses (merges at the joins, a search below the first guess). Every fit lands within 1 % of
    ctx below its budget, so the totals are within 1 % of fitting every prompt."""
    options = config.options
    stream_seeds: dict[int, int] = {}  # per length, the stream of its first sample: the one its exact fit reads
    corrections: dict[int, int] = {}
    prompt_tokens = generated = 0
    for sample in samples:
        limit = token_limit(sample, tokenizer, config)
        budget = sample.ctx - limit
        seed = stream_seeds.setdefault(sample.ctx, sample.haystack_seed)
        estimate = fitting.estimated_tokens(
            layout(sample), tokenizer, options.haystack, seed, budget, sample.ctx, config.chat_template,
            _too_long(sample),
        )  # fmt: skip
        if sample.ctx not in corrections:
            exact = build_prompt(sample, options.haystack, tokenizer, budget, config.chat_template)
            corrections[sample.ctx] = len(exact.ids) - estimate
        prompt_tokens += estimate + corrections[sample.ctx]
        generated += limit
    return prompt_tokens, generated


# what needle's tables, rescoring (output against expected and the other needles' numbers) and view read; the view's
# prompt rebuild needs the sample's seed, index and spans, and says so where hand-made or older records lack them
SPANS = {"needles": list[list[int]], "numbers": list[list[int]], "haystack": list[int]}
RECORD_SCHEMA = {
    "ctx": int,
    "depth": int,
    "needles": int,
    "queries": int,
    "numbers": list[str],
    "expected": list[str],
    "output": str,
    "score": float,
    "correct": bool,
    "hit_token_limit": MayBeAbsent(bool),  # kept since the token limit was recorded
    "seed": MayBeAbsent(int),
    "index": MayBeAbsent(int),
    "spans": MayBeAbsent(SPANS),
    "prompt_tokens": MayBeAbsent(int),
}


MIN_PROMPT_TOKENS = 65  # the least prompt a context must leave beside the answer: instruction, needles and question


def budget(config) -> ContextBudget:
    """Each length holds a prompt and the answer's token limit: --max-new-tokens, else at least MIN_NEW_TOKENS (the
    rest of a longer expected answer is fitted per sample, `token_limit`)."""
    return ContextBudget(config.options.ctx, config.max_new_tokens or MIN_NEW_TOKENS, MIN_PROMPT_TOKENS)


TASK = Task(
    name="needle",
    help="Multi-needle needle-in-a-haystack (paper Table 2 / Figure 5).",
    options=NeedleOptions,
    run_options=("chat_template", "max_new_tokens"),
    running=Running(
        make_samples=make_samples,
        evaluate=evaluate,
        needs=frozenset({"generate"}),
        budget=budget,
        check_inputs=check_inputs,
        prepare_batch=prepare_batch,
        sizing=sizing,
    ),
    reporting=Reporting(
        tables=tables,
        titles={
            "table2": "Table 2 layout: accuracy by model and N/R",
            "answers": "Answers: accuracy, outputs naming unqueried needles' numbers, precision, samples stopped at "
            "the token limit",
            "depth_grid": "Depth x length grid",
            "effective_length": f"Effective length (NoLiMa): the longest length up to which every length keeps "
            f"{EFFECTIVE_FRACTION:.0%} of the base score (mean over the base lengths); undefined when the base is "
            f"below {BASE_FLOOR}; 95 % bootstrap interval over samples, as the 2.5th-97.5th percentile lengths",
        },
        note=(
            "accuracy = mean per-sample score (fraction of the R queried numbers found in the output), "
            "as in LWM and the DIFF paper; averaged over depths in Table 2; precision counts distinct numbers in an "
            "output, over outputs that contain one"
        ),
        summary_keys=["model", "ctx", "depth", "needles", "queries"],
        pair_keys=["ctx", "needles", "queries"],
        metrics={"accuracy": "score"},
        # a count in a column that missing values (models without an effective length) turn into floats
        decimals={"resamples with base below floor": 0},
        plots=plots,
    ),
    viewing=Viewing(sample_view=sample_view),
    scoring=Scoring(record_schema=RECORD_SCHEMA, rules=SCORING_RULES, rescore=rescore),
)
