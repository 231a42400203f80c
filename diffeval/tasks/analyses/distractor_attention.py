"""Attention to the distractors: the noise-cancelling claim measured on the probes' samples.

Recipe:
1. samples: a probe's own samples (`--probe mk-niah`: RULER's multi-key needles; `--probe vt`: variable tracking with
   distractor chains; `--probe mrcr`: MRCR's conversations), built by its recipe with the same seed, so the prompts
   and token spans are those of its runs.
2. rows: the last prompt token (it predicts the first answer token).
3. segments (shares.SEGMENTS): answer = the sentences that hold the answer (the needle asked for; the asked
   chain's assignments; MRCR's asked-for reply), needles = the distractors' sentences (the other keys' needles, a
   haystack made of needles, the other chains; MRCR's look-alike needle replies), noise = the rest of the haystack
   (MRCR's other replies), scaffold = instruction, example, question and answer prefix (MRCR's user turns and chat
   template), sink = the first token. Whole sentences on both sides, so the two shares compare like with like.
4. backend: per layer and head, the softmax weight each segment receives in that row (shares.per_map_shares): a
   baseline's one map; a DIFF model's map 1, map 2 and the differential map A1 − λ·A2 of its variant.
5. report: per model and map, the share on the answer against the share on the distractors, in total and per token,
   by length and setting; the differential map should put less on the distractors than either of its maps. Only
   layers whose kind attends are read; the tables' note names a hybrid's skipped layers and their kind.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, replace
from statistics import fmean
from typing import TYPE_CHECKING, Any

from diffeval.config import int_list, option
from diffeval.data.haystack import source_files
from diffeval.errors import InputError
from diffeval.longctx.lengths import format_ctx, parse_format_ctx
from diffeval.models.backend import Backend
from diffeval.models.layer_kinds import record_fields
from diffeval.records import MayBeAbsent, Record
from diffeval.tasks.analyses.shares import (
    MAPS_SCHEMA,
    SEGMENTS,
    SEGMENTS_TITLE,
    check_capturable,
    measure,
    sample_view,
    segments_out,
)
from diffeval.tasks.base import (
    ContextBudget,
    Listing,
    Reporting,
    RunContext,
    Running,
    Scoring,
    Task,
    Viewing,
    with_cells,
    with_skipped_layers,
)
from diffeval.tasks.conversations import mrcr
from diffeval.tasks.conversations.mrcr_options import MrcrOptions
from diffeval.tasks.haystack import mk_niah, vt
from diffeval.tasks.haystack.options import DepthOptions
from diffeval.tasks.haystack.probes import MIN_PROMPT_TOKENS
from diffeval.tasks.haystack.recipe import Recipe, check_fits_with, fitted_prompt, make_samples_for
from diffeval.tasks.haystack.samples import ANSWER, HaystackPrompt, HaystackSample

if TYPE_CHECKING:
    import pandas as pd

PROBES = {"mk-niah": mk_niah, "vt": vt}  # the haystack probes whose samples hold distractor sentences
MRCR = "mrcr"  # and MRCR's conversations, whose look-alike replies are the distractors
# where each probe's own options act: given beside the other probe, they are refused (config.option's `applies`)
ON_MK_NIAH = (lambda options: options.probe == "mk-niah", "with --probe mk-niah")
ON_VARIANT_1 = (lambda options: options.probe == "mk-niah" and 1 in options.variants,
                "with --probe mk-niah and its variant 1 in --variants")  # fmt: skip
ON_VT = (lambda options: options.probe == "vt", "with --probe vt")
ON_MRCR = (lambda options: options.probe == MRCR, "with --probe mrcr")
ON_HAYSTACK = (lambda options: options.probe != MRCR, "with --probe mk-niah or vt")


@dataclass(frozen=True)
class DistractorAttentionOptions(DepthOptions):
    """Attention to the answer and to the distractors, on mk-niah's or vt's samples."""

    samples: int = option(10, help="samples per length × depth × setting cell", identity=False)
    depths: list[int] = option([0, 25, 50, 75, 100], help="depths of the answer's first insert in percent",
                               parse=int_list("--depths"), applies=ON_HAYSTACK)  # fmt: skip
    probe: str = option("mk-niah", help="the probe whose samples are read: mk-niah | vt | mrcr")
    variants: list[int] = option(
        [1, 2, 3], help="mk-niah: RULER's niah_multikey variants", parse=int_list("--variants"), applies=ON_MK_NIAH
    )
    keys: int = option(4, help="mk-niah variant 1: needles with distinct keys, one asked for", applies=ON_VARIANT_1)
    haystack: str = option("book", help="mk-niah variant 1's haystack; vt reads RULER's noise", applies=ON_VARIANT_1,
                           reads=lambda o: source_files(o.haystack) if ON_VARIANT_1[0](o) else [])  # fmt: skip
    chains: int = option(3, help="vt: chains, the first asked for, the others distractors (at least 2)",
                         applies=ON_VT)  # fmt: skip
    hops: int = option(4, help="vt: assignments after a chain's first", applies=ON_VT)
    needles: list[int] = option([2, 4, 8], help="mrcr: needle counts", parse=int_list("--needles"), applies=ON_MRCR)
    rendering: str = option("chat", help="mrcr: chat | plain (role prefixes)", applies=ON_MRCR)

    def mrcr_options(self) -> MrcrOptions:
        """MRCR's options, as its runs would take them (the book's replies, each conversation's own asked index)."""
        return MrcrOptions(ctx=self.ctx, needles=self.needles, samples=self.samples, rendering=self.rendering)

    def probe_options(self) -> mk_niah.MKNiahOptions | vt.VTOptions:
        """The probe's own options, as its runs would take them."""
        shared: dict[str, Any] = {
            "ctx": self.ctx,
            "samples": self.samples,
            "base_lengths": self.base_lengths,
            "depths": self.depths,
        }
        if self.probe == "mk-niah":
            return mk_niah.MKNiahOptions(**shared, variants=self.variants, keys=self.keys, haystack=self.haystack)
        return vt.VTOptions(**shared, chains=self.chains, hops=self.hops)

    def validate(self) -> None:
        super().validate()
        if self.probe == MRCR:
            self.mrcr_options().validate()
            return
        if self.probe not in PROBES:
            raise InputError(f"bad --probe {self.probe!r}: use mk-niah, vt or mrcr (the probes with distractors)")
        if self.probe == "vt" and self.chains < 2:
            raise InputError(f"--chains {self.chains} leaves vt no distractor chain: use at least 2")
        if self.probe == "mk-niah" and self.variants == [1] and self.keys < 2:
            raise InputError(f"--keys {self.keys} leaves mk-niah variant 1 no distractor needle: use at least 2")
        self.probe_options().validate()


def probe_context(context: RunContext[DistractorAttentionOptions]) -> RunContext[Any]:
    """The run's context as the probe's own runs see it: with the probe's options."""
    general: RunContext[Any] = context
    return replace(general, options=context.options.probe_options())


def recipe_of(options: DistractorAttentionOptions) -> Recipe:
    return PROBES[options.probe].RECIPE


def make_samples(options: DistractorAttentionOptions, seed: int, limit: int | None = None,
                 prepared: Any = None) -> list[HaystackSample] | list[mrcr.MrcrSample]:  # fmt: skip
    if options.probe == MRCR:
        return mrcr.make_samples(options.mrcr_options(), seed, limit)
    return make_samples_for(recipe_of(options))(options.probe_options(), seed, limit)


def segment_ids(prompt: HaystackPrompt, sample: HaystackSample) -> list[int]:
    """The segment of every prompt position (see the module's recipe, step 3)."""
    index = SEGMENTS.index
    ids = [index("scaffold")] * len(prompt.ids)
    start, end = prompt.spans["haystack"]
    haystack = "needles" if sample.haystack.startswith("needles:") else "noise"  # a haystack made of needles
    ids[start:end] = [index(haystack)] * (end - start)
    for (start, end), insert in zip(prompt.spans["inserts"], sample.inserts):
        segment = "answer" if insert.role == ANSWER else "needles"
        ids[start:end] = [index(segment)] * (end - start)
    ids[0] = index("sink")
    return ids


def mrcr_prompt(sample: mrcr.MrcrSample, backend: Backend, rendering: str) -> tuple[list[int], list[int], dict]:
    """An MRCR conversation fitted as its runs fit it (beside its answer budget), the segment of every position
    (answer: the asked-for reply; needles: the look-alike needle replies; noise: the other replies; scaffold: the
    user turns and the template), and the record's cell: depth = where the asked reply starts, in percent."""
    conversation = sample.conversation
    assert conversation is not None
    budget = sample.ctx - mrcr.answer_budget(backend, conversation.expected)
    fitted, needles = mrcr.conversation_prompt(sample, backend, rendering == "chat", budget)
    asked = needles[conversation.index - 1]
    index = SEGMENTS.index
    ids = [index("scaffold")] * len(fitted.ids)
    for message, (start, end) in fitted.spans.items():
        segment = "answer" if message == asked else "needles" if message in needles else "noise"
        ids[start:end] = [index(segment)] * (end - start)
    ids[0] = index("sink")
    cell = {"probe": MRCR, "ctx": sample.ctx, "depth": round(100 * fitted.spans[asked][0] / len(fitted.ids)),
            "setting": f"{sample.n_needles} needles", "index": conversation.index, "key": conversation.key}  # fmt: skip
    return fitted.ids, ids, cell


def evaluate(batch: list, backend: Backend, context: RunContext[DistractorAttentionOptions]) -> list[Record]:
    options = context.options
    records = []
    for sample in batch:
        start = time.perf_counter()
        if options.probe == MRCR:
            ids, segments, cell = mrcr_prompt(sample, backend, options.rendering)
        else:
            prompt = fitted_prompt(recipe_of(options), sample, backend, probe_context(context))
            ids, segments = prompt.ids, segment_ids(prompt, sample)
            cell = {"probe": sample.task, "ctx": sample.ctx, "depth": sample.depth, "setting": sample.setting,
                    "seed": sample.seed, "index": sample.index}  # fmt: skip
        maps, headline = measure(backend, ids, [len(ids) - 1], segments)
        tokens = Counter(SEGMENTS[s] for s in segments)
        fields = {
            "is_diff": backend.info.is_diff,
            "diff_variant": backend.info.diff_variant,
            **cell,
            "tokens": {segment: tokens.get(segment, 0) for segment in SEGMENTS},
            "answer_share": fmean(headline["answer"]),
            "distractor_share": fmean(headline["needles"]),
            "noise_share": fmean(headline["noise"]),
            "shares": maps,
            **record_fields(backend.info, whole_context=True),
        }
        seconds = time.perf_counter() - start
        records.append(Record("distractor-attention", backend.info.name, sample.sample_id, len(ids), 0, seconds,
                              fields))  # fmt: skip
    return records


def distractor_tables(records: pd.DataFrame, options: DistractorAttentionOptions,
                      paper: bool = False) -> dict[str, pd.DataFrame]:  # fmt: skip
    """Per model and map: the shares on the answer, the distractors and the noise, in total and per token, by length
    and setting; and every segment's share per map (attention's segment table)."""
    import pandas as pd

    rows, cells = [], []
    frame = records.assign(length=records["ctx"].map(format_ctx))
    for (model, length, setting), group in frame.groupby(["model", "length", "setting"], sort=False):
        tokens = pd.DataFrame(list(group["tokens"])).mean()
        variant = group["diff_variant"].iloc[0]
        for name in group["shares"].iloc[0]:
            answer, distractors, noise, row_sum = (
                group["shares"].map(lambda shares, n=name, k=key: fmean(shares[n][k])).mean()
                for key in ("answer", "needles", "noise", "row_sum")
            )
            rows.append({
                "model": model, "variant": variant if isinstance(variant, str) else "baseline", "map": name,
                "length": length, "setting": setting, "n": len(group), "answer": answer, "distractors": distractors,
                "noise": noise, "row sum": row_sum, "answer normalised": answer / row_sum,
                "distractors normalised": distractors / row_sum,
                "answer per 1K tokens": 1000 * answer / max(tokens["answer"], 1),
                "distractors per 1K tokens": 1000 * distractors / max(tokens["needles"], 1),
            })  # fmt: skip
            cells.append({"model": model, "ctx": parse_format_ctx(length), "setting": setting})
    table = pd.DataFrame(rows).set_index(["model", "variant", "map", "length", "setting"])
    out = {"answer_vs_distractors": with_cells(table.round(4), cells, [{}] * table.shape[1])}
    out["segments"] = segments_out(frame)
    return with_skipped_layers(out, frame)


def check_inputs(context: RunContext[DistractorAttentionOptions]) -> None:
    """The probe's haystack reads, and every model's architecture is one the analysis can capture."""
    if context.options.probe == "mk-niah":
        check_capturable(context, lambda: mk_niah.check_inputs(probe_context(context)))
    else:
        check_capturable(context)


def prepare(context: RunContext[DistractorAttentionOptions], tokenizers: dict) -> None:
    """Refuse before any engine starts where a length cannot hold the probe's samples (as the probe does); MRCR's
    also where a model has no chat template and the rendering is chat."""
    if context.options.probe == MRCR:
        general: RunContext[Any] = context
        mrcr.prepare(replace(general, options=context.options.mrcr_options()), tokenizers)
        return
    check_fits_with(recipe_of(context.options))(probe_context(context), tokenizers)


def budget(context: RunContext[DistractorAttentionOptions]) -> ContextBudget:
    """The probe's own: its prompt is fitted beside the probe's answer limit, so it is the prompt of its runs."""
    options = context.options
    if options.probe == MRCR:  # each conversation is checked with each model's tokenizer in `prepare`
        return ContextBudget(context.lengths, mrcr.LEAST_ANSWER, mrcr.LEAST_PROMPT)
    return ContextBudget(context.lengths, PROBES[options.probe].TOKENS_TO_GENERATE, MIN_PROMPT_TOKENS)


RECORD_SCHEMA = {
    "is_diff": bool,
    "diff_variant": str | None,
    "ctx": int,
    "depth": int,
    "setting": str,
    "tokens": dict[str, int],
    "answer_share": float,
    "distractor_share": float,
    "noise_share": float,
    "shares": MAPS_SCHEMA,
    "seed": MayBeAbsent(int),
    "key": MayBeAbsent(str),  # an MRCR conversation's seed
    "skipped_layers": MayBeAbsent(dict[str, str]),  # a hybrid's layers without attention: {decoder index: kind}
}

TASK = Task(
    name="distractor-attention",
    help="Attention to the answer against attention to distractor needles, chains and look-alike replies (mk-niah, "
    "vt, mrcr samples).",
    options=DistractorAttentionOptions,
    running=Running(
        make_samples=make_samples,
        evaluate=evaluate,
        needs=frozenset({"attention_rows"}),
        budget=budget,
        check_inputs=check_inputs,
        prepare=prepare,
    ),
    reporting=Reporting(
        tables=distractor_tables,
        titles={
            "answer_vs_distractors": "Attention on the answer's sentences against the distractors' (last prompt "
            "row; raw shares, mean over heads and layers; normalised: ÷ the row sum; per 1K tokens: a segment's "
            "share ÷ its tokens × 1000)",
            "segments": SEGMENTS_TITLE,
        },
        note=(
            "share = attention weight of the last prompt token's row on a segment, mean over heads and layers; "
            "answer = the answer's whole sentences, distractors = the distractor needles' or chains' whole sentences "
            "(a haystack made of needles counts whole); DIFF models: map 1, map 2 and the differential map A1 − λ·A2 "
            "(raw: its rows sum to 1 − λ); baselines: the softmax map"
        ),
        summary_keys=["model", "ctx", "depth", "setting"],
        pair_keys=["ctx", "setting"],
        metrics={"answer_share": "answer_share", "distractor_share": "distractor_share"},
        summary_value="answer_share",
    ),
    viewing=Viewing(sample_view=sample_view, listing=Listing(answer=None, expected=None, outcome=None)),
    scoring=Scoring(record_schema=RECORD_SCHEMA),
)
