"""Activation outliers (paper Table 5): the largest |attention logits| and |hidden states| over a token budget.

Recipe:
1. samples: sequences of `seq_len` tokens cut from one haystack text stream (the same text for every model; each
   model tokenizes it and cuts its own sequences), enough of them to cover `tokens`.
2. backend: one forward per sequence. Attention logits QKᵀ/√d of every layer that attends and every head (for DIFF
   both maps) over all causal positions, computed in row chunks through the attention interface (a hybrid's Mamba
   layers have none: its records list them, and the tables' note names them and their kind); hidden states = each
   layer's output.
3. statistics, streaming: a running top-100 and a log-spaced histogram of |value| per layer; memory does not grow
   with the token budget. The median is read from the histogram (relative error ≤ 0.28 %, one bin's width).
4. tables: top-1, top-2, top-3, top-10, top-100 and the median per model and activation, overall and per layer.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from types import GenericAlias
from typing import TYPE_CHECKING

from diffeval.config import context_option, option, parse_ctx
from diffeval.data.haystack import haystack_sentences, source_files
from diffeval.errors import InputError
from diffeval.models.backend import Backend
from diffeval.models.layer_kinds import check_attends, check_captured, record_fields
from diffeval.models.variants import registry as variants
from diffeval.paper import TABLE5, coverage
from diffeval.records import MayBeAbsent, Record, sample_id
from diffeval.tasks.base import Reporting, RunContext, Running, Scoring, Task, with_cells, with_skipped_layers

if TYPE_CHECKING:  # annotations only: heavy libraries load inside the functions that use them (a fast CLI)
    import pandas as pd

    from diffeval.models.activations import RunningStats

RANKS = (1, 2, 3, 10, 100)


@dataclass(frozen=True)
class OutliersOptions:
    """Activation outliers (paper Table 5): sequences of `ctx` tokens (the training length) covering `tokens`."""

    ctx: list[int] = context_option([4096], help="sequence length (the model's training length), e.g. 4k")
    tokens: int = option(
        409_600, help="token budget, e.g. 400k (k = 1024) [default: 400k]", parse=lambda v: parse_ctx(v)[0]
    )
    haystack: str = option(
        "noise", help="noise | essays:PATH | hf:DATASET[:SPLIT[:FIELD]]", reads=lambda o: source_files(o.haystack)
    )

    def validate(self) -> None:
        if len(self.ctx) != 1:
            raise InputError(f"--ctx {self.ctx}: give one sequence length (the model's training length)")
        if self.tokens < 1:
            raise InputError("--tokens must be positive, e.g. 400k")


@dataclass(frozen=True)
class Sequence:
    sample_id: str
    index: int
    seq_len: int


def make_samples(options, seed: int, limit: int | None = None, prepared=None) -> list[Sequence]:
    seq_len = options.ctx[0]
    count = -(-options.tokens // seq_len)
    count = min(count, limit) if limit else count
    key = f"outliers|{options.haystack}|{seed}|{seq_len}"
    return [Sequence(sample_id(f"{key}|{i}"), i, seq_len) for i in range(count)]


def check_inputs(context: RunContext[OutliersOptions]) -> None:
    """The haystack reads, and every model has a layer that attends (the attention logits are read there)."""
    from diffeval.models.checkpoints.loading import load_config

    haystack_sentences(context.options.haystack, context.seed, 10)
    for spec in context.models:
        layers = variants.layers_of(load_config(spec, context.trust_remote_code))
        check_attends(spec.name, layers, "outliers")


_streams: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _token_stream(backend: Backend, source: str, seed: int, tokens: int) -> list[int]:
    """The haystack stream's tokens for this model, at least `tokens` of them (cached per model)."""
    cached = _streams.get(backend)
    if cached is not None and len(cached) >= tokens:
        return cached
    words = tokens
    while True:
        ids = backend.encode(" ".join(haystack_sentences(source, seed, words)), special_tokens=False).ids
        if len(ids) >= tokens:
            _streams[backend] = ids
            return ids
        words *= 2


def evaluate(batch: list[Sequence], backend: Backend, context: RunContext[OutliersOptions]) -> list[Record]:
    import torch

    from diffeval.models.activations import RunningStats, logit_statistics

    options = context.options
    seq_len = options.ctx[0]
    loaded = backend.torch_module()  # the activations are read inside the transformers model
    stream = _token_stream(backend, options.haystack, context.seed, (batch[-1].index + 1) * seq_len)
    bos = [loaded.tokenizer.bos_token_id] if loaded.tokenizer.bos_token_id is not None else []
    records = []
    for sequence in batch:
        start = time.perf_counter()
        body = stream[sequence.index * seq_len : (sequence.index + 1) * seq_len - len(bos)]
        ids = torch.tensor([bos + body], device=loaded.model.device)
        with torch.inference_mode(), logit_statistics(loaded.model) as logit_stats:
            out = loaded.model.get_decoder()(input_ids=ids, use_cache=False, output_hidden_states=True)
        check_captured(backend.info, logit_stats, "outliers")
        hidden = {}
        for layer, states in enumerate(out.hidden_states[1:]):
            hidden[layer] = RunningStats()
            hidden[layer].add(states)
        fields = {
            "index": sequence.index,
            "seq_len": seq_len,
            "max_attention_logit": max(float(s.top[0]) for s in logit_stats.values()),
            "max_hidden_state": max(float(s.top[0]) for s in hidden.values()),
            "attention_logits": _serialise(logit_stats),
            "hidden_states": _serialise(hidden),
            **record_fields(backend.info),
        }
        seconds = time.perf_counter() - start
        records.append(Record("outliers", backend.info.name, sequence.sample_id, ids.shape[1], 0, seconds, fields))
    return records


def _serialise(stats: dict[int, RunningStats]) -> dict[str, dict]:
    """Per layer: the top values and the histogram's non-empty bins (sparse, to keep records small)."""
    import torch

    out = {}
    for layer, running in sorted(stats.items()):
        nonzero = torch.nonzero(running.hist).flatten().tolist()
        out[str(layer)] = {
            "top": [round(float(v), 5) for v in running.top],
            "hist": {str(b): int(running.hist[b]) for b in nonzero},
            "count": running.count,
        }
    return out


def _merge(records: pd.Series, layer: str | None = None) -> tuple[list[float], list[int]]:
    """Top values and histogram over records (and all layers, or one)."""
    from diffeval.models.activations import HIST_BINS

    tops, hist = [], [0] * HIST_BINS
    for per_layer in records:
        for name, stats in per_layer.items():
            if layer is None or name == layer:
                tops.extend(stats["top"])
                for b, count in stats["hist"].items():
                    hist[int(b)] += count
    return sorted(tops, reverse=True), hist


def _row(tops: list[float], hist: list[int]) -> dict:
    from diffeval.models.activations import histogram_median

    row = {f"top-{k}": tops[k - 1] if len(tops) >= k else float("nan") for k in RANKS}
    row["median"] = histogram_median(hist)
    return row


def paper_coverage(records: pd.DataFrame, options: OutliersOptions) -> str:
    """Table 5 gives the largest attention logits and hidden states over 0.4M tokens; every run measures both."""
    tokens = int(records.groupby("model", sort=False)["prompt_tokens"].sum().min())
    return coverage("Table 5 (largest activations over 0.4M tokens)", [f"both activations over {tokens:,} tokens"], [])


def tables(records: pd.DataFrame, options: OutliersOptions, paper: bool = False) -> dict[str, pd.DataFrame]:
    import pandas as pd

    from diffeval.models.activations import histogram_median

    rows, layers = {}, {}
    for model, group in records.groupby("model", sort=False):
        for column, label in (("attention_logits", "attention logits"), ("hidden_states", "hidden states")):
            rows[(model, label)] = _row(*_merge(group[column]))
            for layer in group[column].iloc[0]:
                tops, hist = _merge(group[column], layer)
                layers[(model, label, int(layer))] = {"top-1": tops[0], "median": histogram_median(hist)}
    table5 = pd.DataFrame.from_dict(rows, orient="index")
    if paper:
        table5 = pd.concat([table5, pd.DataFrame.from_dict(TABLE5, orient="index")])
    table5.index.names = ["model", "activation"]
    per_layer = pd.DataFrame.from_dict(layers, orient="index")
    per_layer.index.names = ["model", "activation", "layer"]
    tokens = records.groupby("model", sort=False)["prompt_tokens"].sum().to_frame("tokens")
    ours = set(records["model"])
    attention = {  # the tables of attention logits, which a hybrid's layers without attention have none of
        "table5": with_cells(
            table5.round(4), [{"model": m} if m in ours else None for m, _ in table5.index], [{}] * table5.shape[1]
        ),
        "outliers_per_layer": with_cells(
            per_layer.round(4), [{"model": m} for m, _, _ in per_layer.index], [{}] * per_layer.shape[1]
        ),
    }
    return {
        **with_skipped_layers(attention, records, "attention logits"),
        "outlier_tokens": with_cells(tokens, [{"model": m} for m in tokens.index], [{}]),
    }


LAYER_STATS = {"top": list[float], "hist": dict[str, int], "count": int}  # `_serialise`'s per-layer statistics
PER_LAYER = GenericAlias(dict, (str, LAYER_STATS))  # dict[str, LAYER_STATS], a schema kind (not a type) inside
RECORD_SCHEMA = {
    "prompt_tokens": int,
    "max_attention_logit": float,
    "max_hidden_state": float,
    "attention_logits": PER_LAYER,
    "hidden_states": PER_LAYER,
    "skipped_layers": MayBeAbsent(dict[str, str]),  # a hybrid's layers without attention: {decoder index: kind}
}


TASK = Task(
    name="outliers",
    help="Largest attention logits and hidden states over a token budget (paper Table 5).",
    options=OutliersOptions,
    running=Running(
        make_samples=make_samples,
        evaluate=evaluate,
        needs=frozenset({"torch_module"}),
        # no budget: a length is a sequence of haystack tokens, with no prompt to fit and nothing generated
        check_inputs=check_inputs,
        sizing=lambda samples, tokenizer, context: (sum(s.seq_len for s in samples), 0),
    ),
    reporting=Reporting(
        tables=tables,
        paper_coverage=paper_coverage,
        titles={
            "table5": "Table 5 layout: largest |activation| values and the median",
            "outliers_per_layer": "Largest |activation| and median per layer",
            "outlier_tokens": "Tokens analysed per model",
        },
        note=(
            "largest |values| over all sequences; attention logits = QK^T/sqrt(d) at every causal position of every "
            "head (DIFF: both maps); hidden states = every layer's output; median from a log-spaced histogram "
            "(rel. error <= 0.28 %)"
        ),
        summary_keys=["model"],
        pair_keys=None,  # each model cuts its own token sequences: no sample-level pairs
        metrics={"max_attention_logit": "max_attention_logit", "max_hidden_state": "max_hidden_state"},
        summary_value="max_attention_logit",
    ),
    scoring=Scoring(record_schema=RECORD_SCHEMA),
)
