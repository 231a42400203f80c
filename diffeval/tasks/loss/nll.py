"""NLL by position on long documents (paper Figure 4): how well each model uses a growing context.

Recipe:
1. documents: books from their first chapter (the `--data-dir` folder, else the book the package ships), or a
   dataset's `text` field (`--data hf:DATASET[:SPLIT]`); `--windows K` cuts K disjoint windows from each.
2. windows (`prepare`, with every model's tokenizer): a window is the longest stretch of text from its start, cut at
   whitespace, that fits `--ctx` − 1 tokens with the document-start token in every model's tokens, so every model
   scores the same bytes (the position left over is the one token vLLM must generate after a prompt).
3. backend: `token_nll` over [start token] + the window's tokens, one causal pass: every text token's NLL.
4. scores (pure): per window, NLL summed per token-position bucket (token j at sequence position j) and per
   byte-position bucket (a token counts in the bucket of its last UTF-8 byte), the bucket's bytes, and a strip of
   STRIP_BINS byte bins for the viewer.
5. tables: bits per byte by byte position (comparable across any tokenizers), NLL per token by token position (only
   when every model has the same tokens for every window: the paper's plot), the context gain (the first bucket
   minus each later one) and the paired DIFF − baseline difference per bucket; intervals resample whole documents
   (a book's windows together); the paper's cumulative-average curve as a PNG.
"""

from __future__ import annotations

import hashlib
import time

from diffeval.data import books
from diffeval.models.backend import Backend, Tokenizer
from diffeval.records import Record, Sized, sample_id
from diffeval.tasks.base import ContextBudget, Reporting, RunContext, Running, Scoring, Task, Viewing
from diffeval.tasks.blocks import Listing
from diffeval.tasks.loss.buckets import STRIP_BINS, score
from diffeval.tasks.loss.nll_options import NLLOptions
from diffeval.tasks.loss.nll_report import pair_tables, paper_coverage, plots, sample_view, tables
from diffeval.tasks.loss.windows import Window, cut_windows, token_limits, window_text


def budget(context: RunContext[NLLOptions]) -> ContextBudget:
    # one position past the sequence: vLLM generates a token after every prompt, and both engines score the same ids
    return ContextBudget(context.lengths, answer=1, least_prompt=2)


def check_inputs(context: RunContext[NLLOptions]) -> None:
    books.load(context.options.data, context.options.data_dir, context.options.docs)


def prepare(context: RunContext[NLLOptions], tokenizers: dict[str, Tokenizer]) -> list[Window]:
    """Every document's windows, fitted to every model's tokens (see the module's recipe, step 2)."""
    options = context.options
    ctx = options.ctx[0]
    limits = token_limits(tokenizers, ctx)
    windows = []
    for doc in books.load(options.data, options.data_dir, options.docs):
        for index, (start, end) in enumerate(cut_windows(doc, options.windows, tokenizers, limits, ctx)):
            key = f"nll|{options.data}|{doc.id}|{ctx}|{options.buckets}|{index}|{start}|{end}"
            size = len(doc.text[start:end].encode("utf-8"))
            windows.append(Window(sample_id(key), doc.id, doc.title, doc.group, index, start, end, size, ctx))
    return windows


def make_samples(options: NLLOptions, seed: int, limit: int | None = None, prepared=None) -> list[Window]:
    """The windows `prepare` fitted (documents are read in their order: the seed changes nothing)."""
    return list(prepared[:limit] if limit else prepared)


def _text(window: Window, options: NLLOptions) -> str:
    return window_text(window, options.data, options.data_dir, options.docs)


def evaluate(batch: list[Window], backend: Backend, context: RunContext[NLLOptions]) -> list[Record]:
    import numpy as np

    options = context.options
    records = []
    for window in batch:
        began = time.perf_counter()
        text = _text(window, options)
        start = backend.document_start()
        encoding = backend.encode(text, special_tokens=False)
        ids = start + encoding.ids
        nll = np.asarray(backend.token_nll(ids), dtype=np.float64)
        fields = score(nll, encoding.offsets, len(start), text, window, options.buckets)
        fields["ids_sha"] = hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()[:16]
        seconds = time.perf_counter() - began
        records.append(Record("nll", backend.info.name, window.sample_id, len(ids), 0, seconds, fields))
    return records


RECORD_SCHEMA = {
    "doc": str,
    "title": str,
    "group": str,
    "window": int,
    "start": int,
    "end": int,
    "ctx": int,
    "bytes": int,
    "tokens": int,
    "nll": float,
    "bpb": float,
    "nll_per_token": float,
    "token_nll": Sized(list[float], "buckets", "bucket"),  # its length is the run's --buckets
    "token_counts": Sized(list[int], "buckets", "bucket"),
    "byte_nll": Sized(list[float], "buckets", "bucket"),
    "bucket_bytes": Sized(list[int], "buckets", "bucket"),
    "strip": Sized(list[float], STRIP_BINS, "strip bin"),
    "ids_sha": str,
}


def sizing(samples: list[Window], tokenizer, context: RunContext[NLLOptions]) -> tuple[int, int]:
    """Tokens each window costs this model (start token included), nothing generated."""
    start = len(tokenizer.document_start())
    return sum(start + len(tokenizer.encode(_text(w, context.options), False).ids) for w in samples), 0


TASK = Task(
    name="nll",
    help="NLL by position on long documents: bits per byte and per-token NLL by position (paper Figure 4).",
    options=NLLOptions,
    running=Running(
        make_samples=make_samples,
        evaluate=evaluate,
        needs=frozenset({"token_nll"}),
        budget=budget,
        check_inputs=check_inputs,
        prepare=prepare,
        sizing=sizing,
    ),
    reporting=Reporting(
        tables=tables,
        paper_coverage=paper_coverage,
        titles={
            "nll_bytes": "Bits per byte by byte position",
            "nll_tokens": "NLL per token by token position",
            "nll_gain": "Context gain: bits per byte of the first bucket minus each bucket's",
            "nll_paired": "Paired DIFF − baseline difference per position bucket",
            "nll_past_training": "Past the training length: change in NLL per token from its last bucket",
        },
        note=(
            "bits per byte = sum of token NLL / (ln 2 x bytes), a token counted in the bucket of its last UTF-8 byte; "
            "NLL per token in nats; one pass per window; 95 % intervals from a bootstrap of whole documents"
        ),
        summary_keys=["model", "ctx"],
        pair_keys=["ctx"],
        metrics={"bpb": "bpb", "nll_per_token": "nll_per_token"},
        summary_value="bpb",
        cluster_keys=["group"],
        plots=plots,
        pair_tables=pair_tables,
    ),
    viewing=Viewing(sample_view=sample_view, listing=Listing(answer=None, expected=None, outcome=None)),
    scoring=Scoring(record_schema=RECORD_SCHEMA),
)
