"""MRCR's tables and sample view: score by length, by needle count, by the asked needle's index, by the distance from
the asked reply to the last needle; the outcomes; and a conversation with the asked reply and its look-alikes
marked, beside each model's output."""

from __future__ import annotations

from typing import TYPE_CHECKING

from diffeval.data import mrcr as data
from diffeval.errors import InputError
from diffeval.longctx.lengths import format_ctx
from diffeval.models.tokenizer import PLAIN_ROLES
from diffeval.records import MayBeAbsent
from diffeval.tasks import thinking
from diffeval.tasks.base import RunContext, with_cells
from diffeval.tasks.conversations.mrcr_options import MrcrOptions

if TYPE_CHECKING:  # annotations only: heavy libraries load inside the functions that use them (a fast CLI)
    import pandas as pd

TOO_LONG = "too_long"  # the outcome of an OpenAI row that fits no --ctx for some model: counted, never generated
FLOOR = 0.05  # a mean score at or below this: the model hardly ever starts with the random string; no difference read
DISTANCE_EDGES = (0, 1024, 4096, 16384, 65536)  # tokens from the asked reply to the last needle's: bucket edges
# the record fields the tables, view and pairing read; a generated conversation's and an OpenAI row's own are absent
# from the other's records
RECORD_SCHEMA = {
    "ctx": int,
    "n_needles": int,
    "index": int,
    "source": str,
    "rendering": str,
    "expected": str,
    "random_string_to_prepend": str,
    "output": str,
    "score": float | None,
    "answer_budget": int,
    "distance_to_end": MayBeAbsent(int),  # absent where nothing ran: an OpenAI row too long for every --ctx
    "distance_to_last_needle": MayBeAbsent(int),
    "prompt_budget": MayBeAbsent(int),
    "format": MayBeAbsent(str),  # a generated conversation's
    "topic": MayBeAbsent(str),
    "key": MayBeAbsent(str),
    "fillers": MayBeAbsent(int),
    "last_words": MayBeAbsent(int | None),
    "row": MayBeAbsent(str),  # an OpenAI row's number
    "copied": MayBeAbsent(str),  # which reply the output reproduces (a diagnostic): asked | look-alike | other | none
    "copied_ratio": MayBeAbsent(float),
    **thinking.THINKING_SCHEMA,
}

TITLES = {
    "by_length": "Score by length (mean OpenAI-MRCR grade), with samples per model",
    "by_needles": "Score by needle count and length",
    "by_index": "Score by the asked needle's index (1-based) within its needle count",
    "by_distance": "Score by the distance (tokens) from the asked reply to the last needle's reply",
    "outcomes": "Outcomes: samples, share starting with the random string, too long for every length, mean score",
    "copied": "What the outputs reproduce (a diagnostic, not the grade): share of outputs whose closest reply of the "
    "conversation (SequenceMatcher ratio at least 0.5, the random string left out) is the asked one, a look-alike "
    "needle's, another reply, or none, by needle count",
    "thinking": thinking.TITLE,
}


def distance_bucket(tokens: float) -> str:
    """The bucket of a distance to the last needle: "0 (the last)", "1–1K", "1K–4K", …, "64K+"."""
    if tokens <= 0:
        return "0 (the last)"
    edges = DISTANCE_EDGES
    for low, high in zip(edges, edges[1:]):
        if tokens <= high:
            return f"{format_ctx(low) if low else 1}–{format_ctx(high)}"
    return f"{format_ctx(edges[-1])}+"


def _bucket_order(names) -> list[str]:
    order = [
        "0 (the last)",
        *(distance_bucket(high) for high in DISTANCE_EDGES[1:]),
        f"{format_ctx(DISTANCE_EDGES[-1])}+",
    ]
    return [name for name in order if name in set(names)]


def _pivot(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    return frame.pivot_table(index="model", columns=columns, values="score", aggfunc="mean", sort=True)


def tables(records: pd.DataFrame, options: MrcrOptions, paper: bool = False) -> dict[str, pd.DataFrame]:
    scored = records.dropna(subset=["score"]).assign(length=lambda f: f["ctx"].map(format_ctx))
    models = list(dict.fromkeys(records["model"]))
    out: dict[str, pd.DataFrame] = {}
    if not scored.empty:
        lengths = sorted(scored["ctx"].unique())
        by_length = _pivot(scored, ["ctx"]).reindex(index=models, columns=lengths)
        cells = [{"ctx": int(c)} for c in by_length.columns]
        by_length.columns = [format_ctx(int(c)) for c in by_length.columns]
        by_length["samples"] = scored.groupby("model")["sample_id"].count().reindex(models).fillna(0).astype(int)
        out["by_length"] = with_cells(by_length.round(3), [{"model": m} for m in models], [*cells, {}])
        needles = _pivot(scored, ["n_needles", "ctx"]).reindex(index=models)
        cells = [{"n_needles": int(n), "ctx": int(c)} for n, c in needles.columns]
        needles.columns = [f"{n} needles / {format_ctx(int(c))}" for n, c in needles.columns]
        out["by_needles"] = with_cells(needles.round(3), [{"model": m} for m in models], cells)
        index = _pivot(scored, ["n_needles", "index"]).reindex(index=models)
        cells = [{"n_needles": int(n), "index": int(i)} for n, i in index.columns]
        index.columns = [f"{n} needles / #{i}" for n, i in index.columns]
        out["by_index"] = with_cells(index.round(3), [{"model": m} for m in models], cells)
        if "distance_to_last_needle" in scored:
            buckets = scored.assign(distance=scored["distance_to_last_needle"].map(distance_bucket))
            distance = _pivot(buckets, ["distance"]).reindex(index=models)
            distance = distance[_bucket_order(distance.columns)]
            out["by_distance"] = with_cells(distance.round(3), [{"model": m} for m in models],
                                            [None] * distance.shape[1])  # fmt: skip
    out["outcomes"] = _outcomes(records, models)
    if "copied" in records and records["copied"].notna().any():
        out["copied"] = _copied(records.dropna(subset=["copied"]), models)
    if thinking.has_thinking(records):
        out["thinking"] = thinking.thinking_table(records)
    note = "rendering: " + ", ".join(sorted(set(records["rendering"]))) + _rendering_words(records)
    for table in out.values():
        table.attrs["note"] = "; ".join(filter(None, (table.attrs.get("note"), note)))
    return thinking.with_thinking_note(out, records)


def _rendering_words(records: pd.DataFrame) -> str:
    said = {"chat": "every turn through the model's chat template", "plain": "role prefixes User:/Assistant:"}
    return " (" + "; ".join(said[r] for r in sorted(set(records["rendering"])) if r in said) + ")"


def _outcomes(records: pd.DataFrame, models: list[str]) -> pd.DataFrame:
    frame = records.assign(
        prefixed=[o.lstrip().startswith(s) for o, s in zip(records["output"], records["random_string_to_prepend"])],
        too_long=records["outcome"].eq(TOO_LONG) if "outcome" in records else False,
    )
    ran = frame[~frame["too_long"]]
    table = frame.groupby("model", sort=False).agg(samples=("sample_id", "count"), too_long=("too_long", "sum"))
    table["starts_with_string"] = ran.groupby("model", sort=False)["prefixed"].mean()
    table["score"] = records.groupby("model", sort=False)["score"].mean()
    table["too_long"] = table["too_long"].astype(int)
    table = table.reindex(models)
    return with_cells(table.round(3), [{"model": m} for m in models], [{}, {"outcome": TOO_LONG}, {}, {}])


COPIED = ("asked", "look-alike", "other", "none")


def _copied(frame: pd.DataFrame, models: list[str]) -> pd.DataFrame:
    shares = frame.groupby(["model", "n_needles"])["copied"].value_counts(normalize=True).unstack(fill_value=0.0)
    shares = shares.reindex(columns=list(COPIED), fill_value=0.0)
    shares["n"] = frame.groupby(["model", "n_needles"])["sample_id"].count()
    shares = shares.reindex([key for m in models for key in shares.index if key[0] == m])
    rows = [{"model": m, "n_needles": int(n)} for m, n in shares.index]
    return with_cells(shares.round(3), rows, [{"copied": kind} for kind in COPIED] + [{}])


# ---- the sample view ----------------------------------------------------------------------------------------------

VIEW_EDGE_CHARS = 160  # a filler reply's characters shown at each end when it is elided


def sample_view(context: RunContext[MrcrOptions], records: dict[str, dict], tokenizer_for, full_text: bool | None):
    """For `diffeval view`: the conversation (as the first model took it) with the asked-for reply marked and the
    look-alike needle replies marked apart; filler replies elided unless whole texts are asked for; each model's
    output with its grade."""
    from diffeval.tasks.blocks import Document, Elided, Field, Fields, Mark, Output, Outputs, Span, Text

    model, first = next(iter(records.items()))
    messages, needles, asked = _conversation(context.options, first)
    whole = bool(full_text) or (full_text is None and sum(len(m["content"]) for m in messages) < 60_000)
    pieces: list = []
    for i, message in enumerate(messages):
        role, text = PLAIN_ROLES[message["role"]], message["content"]
        pieces.append(f"{role}: ")
        if i == asked:
            pieces.append(Mark([text], tone="highlight", kind="mrcr asked", note="the asked-for reply"))
        elif i in needles:
            k = needles.index(i) + 1
            pieces.append(Mark([text], tone="faint", kind="mrcr look-alike", note=f"look-alike: needle {k}"))
        elif message["role"] == "assistant" and len(text) > 2 * VIEW_EDGE_CHARS + 80:
            edge = VIEW_EDGE_CHARS
            pieces.append(Elided(text[:edge], text[-edge:], f"… {len(text) - 2 * edge} characters …",
                                 text if whole else None, tone="muted"))  # fmt: skip
        else:
            pieces.append(Span(text) if message["role"] == "assistant" else text)
        pieces.append("\n\n")
    facts = Fields([Field("needles", first["n_needles"]), Field("asked index", first["index"]),
                    Field("random string", first["random_string_to_prepend"]), Field("rendering", first["rendering"]),
                    Field("turns", len(messages))], title="Sample")  # fmt: skip
    outputs = [
        Output(name, record.get("output"), None, f"score {record['score']:.3f}" if record.get("score") is not None
               else record.get("outcome", "no score"), [
            Field("prompt tokens", record.get("prompt_tokens")), Field("answer budget", record.get("answer_budget")),
            Field("distance to the end", record.get("distance_to_end")),
            Field("distance to the last needle", record.get("distance_to_last_needle")),
            Field("reproduces", f"{record['copied']} ({record.get('copied_ratio')})" if record.get("copied") else "—"),
        ])
        for name, record in records.items()
    ]  # fmt: skip
    return Document([facts, Text(pieces, style="document", title=f"Conversation as {model} took it"),
                     Text([first["expected"]], style="paragraph", title="Expected"),
                     Outputs(outputs, title="Outputs")])  # fmt: skip


def _conversation(options: MrcrOptions, record: dict) -> tuple[list[dict], list[int], int]:
    """The messages a record's model read, its needle replies' indices and the asked one's, rebuilt from the run's
    options (samples are pure and seeded) or read again from the run's OpenAI data."""
    if record["source"] == "openai":
        rows = {row.id: row for row in data.load(options.data_dir, [record["n_needles"]])}
        row = rows.get(record["row"])
        if row is None:
            raise InputError(f"row {record['row']} is no longer in the run's MRCR data")
        return list(row.messages), row.needle_messages, row.desired_msg_index
    conversation = data.build(record["key"], options.replies, record["n_needles"], options.index)
    messages, needles = conversation.messages(record.get("fillers") or 0, record.get("last_words"))
    return messages, needles, needles[record["index"] - 1]
