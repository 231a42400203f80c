"""LongBench v2's tables and sample view: accuracy by length, by domain, by difficulty, by the dataset's length label
and by how much of the document was cut; the answers' counts; a question with its choices and each model's answer or
the four letters' log-likelihoods."""

from __future__ import annotations

from typing import TYPE_CHECKING

from diffeval.data import longbench2 as data
from diffeval.errors import InputError
from diffeval.tasks import thinking
from diffeval.tasks.base import RunContext, with_cells

if TYPE_CHECKING:  # annotations only: heavy libraries load inside the functions that use them (a fast CLI)
    import pandas as pd

    from diffeval.tasks.choices.longbench2_options import LongBench2Options

TRUNCATION = ("none", "under half", "half or more")  # the share of the document's tokens cut to fit
TITLES = {
    "accuracy": "Accuracy by context length",
    "by_domain": "Accuracy by domain (every length)",
    "by_difficulty": "Accuracy by difficulty (every length)",
    "by_length": "Accuracy by the dataset's length label (every length)",
    "by_truncation": "Accuracy by the share of the document cut from its middle to fit (every length)",
    "answers": "Answers: samples, correct, unparsed (pred.py's rule reads no letter), truncated prompts, mean "
    "document tokens cut",
}


def tables(records: pd.DataFrame, options: LongBench2Options, paper: bool = False) -> dict[str, pd.DataFrame]:
    scored = records.dropna(subset=["score"])
    models = list(dict.fromkeys(records["model"]))
    out = {}
    for key, column, order in (
        ("accuracy", "ctx", sorted(set(records["ctx"]))),
        ("by_domain", "domain", sorted(set(records["domain"]))),
        ("by_difficulty", "difficulty", [d for d in data.DIFFICULTIES if d in set(records["difficulty"])]),
        ("by_length", "length_label", [x for x in data.LENGTH_LABELS if x in set(records["length_label"])]),
        ("by_truncation", "truncation", [t for t in TRUNCATION if t in set(records["truncation"])]),
    ):
        table = scored.pivot_table(index="model", columns=column, values="score", aggfunc="mean", sort=False)
        table = table.reindex(index=models, columns=order)
        table.index.name = "model"
        out[key] = with_cells(table.round(3), [{"model": m} for m in models], [{column: v} for v in order])
    out["answers"] = _answers(records)
    return thinking.with_thinking_note(out, records)


def _answers(records: pd.DataFrame) -> pd.DataFrame:
    outcome = records["outcome"]
    grouped = records.assign(
        unparsed=outcome.eq("unparsed"),
        unclosed=outcome.eq(thinking.UNCLOSED),
        right=records["correct"].eq(True),
        cut=records["truncated_tokens"] > 0,
    ).groupby(["model", "ctx"], sort=False)
    counts = grouped.agg(
        samples=("sample_id", "count"),
        correct=("right", "sum"),
        unparsed=("unparsed", "sum"),
        **({thinking.UNCLOSED: ("unclosed", "sum")} if thinking.has_thinking(records) else {}),
        truncated=("cut", "sum"),
        tokens_cut=("truncated_tokens", "mean"),
    )
    columns = [{}, {"correct": True}, {"outcome": "unparsed"}]
    columns += [{"outcome": thinking.UNCLOSED}] if thinking.UNCLOSED in counts else []
    columns += [{"truncation": ["under half", "half or more"]}, {}]
    return with_cells(counts.round(1), [{"model": m, "ctx": c} for m, c in counts.index], columns)


def sample_view(context: RunContext[LongBench2Options], records: dict[str, dict], tokenizer_for, full_text):
    """For `diffeval view`: the question, its choices with the gold one marked, and each model's answer (generation:
    its output and the letter read from it) or the four letters' log-likelihoods (choice mode), with the tokens cut."""
    from diffeval.tasks.blocks import Bar, Bars, Block, Document, Field, Fields, Output, Outputs, Text

    first = next(iter(records.values()))
    found = {q.id: q for q in data.load(context.options.data_dir)}.get(first["id"])
    if found is None:
        raise InputError(f"question {first['id']} is no longer in the run's LongBench v2 data")
    gold = data.LETTERS.index(found.answer)
    choices = [
        f"({letter}) {text}" + ("  ← gold" if i == gold else "")
        for i, (letter, text) in enumerate(zip(data.LETTERS, found.choices))
    ]
    blocks: list[Block] = [
        Text([found.question], style="paragraph", title="Question"),
        Text(["\n".join(choices)], style="paragraph", title=f"Choices (gold: {found.answer})"),
        Fields(
            [
                Field("domain", f"{found.domain} / {found.sub_domain}"),
                Field("difficulty", found.difficulty),
                Field("length label", found.length),
                Field("document characters", len(found.context)),
            ]
        ),
    ]
    if context.options.mode == "choices":
        for model, record in records.items():
            values = record.get("choice_logprobs") or []
            blocks.append(
                Bars(
                    [
                        Bar(
                            letter,
                            value,
                            colour=i,
                            emphasis=letter == record.get("prediction"),
                            note="(gold)" if i == gold else None,
                        )
                        for i, (letter, value) in enumerate(zip(data.LETTERS, values))
                    ],
                    title=f"{model}: log-likelihood of each letter",
                    model=model,
                )
            )
        return Document(blocks)

    def label(record: dict) -> str:
        if record.get("outcome") == thinking.UNCLOSED:
            return "thinking unclosed"
        return f"answered {record['prediction']}" if record.get("prediction") else "unparsed"

    rows = [
        Output(
            model,
            record.get("output"),
            record.get("correct"),
            label(record),
            [
                Field("document tokens cut", record.get("truncated_tokens")),
                *([Field("thinking", record.get("thinking"))] if record.get("thinking") is not None else []),
            ],
        )
        for model, record in records.items()
    ]
    return Document([*blocks, Outputs(rows, title="Outputs")])
