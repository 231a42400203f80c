"""GraphWalks' answer parsing, set F1, rescoring, tables and sample view.

The answer is read as OpenAI and lm-eval read it (`strict`, lm-eval's `f1`): the output's last line must hold
"Final Answer: [..]"; the list is split at commas, each item stripped of spaces and quotes. `flexible` (lm-eval's
`flexible_f1`) takes the last line anywhere in the output that holds the pattern. A set F1 against the answer nodes
the model's own prompt holds; an output without the pattern scores 0 and counts as a parse error.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from diffeval.data import graphwalks as data
from diffeval.tasks import thinking
from diffeval.tasks.base import RunContext, with_cells
from diffeval.tasks.generated.graphwalks_options import GraphwalksOptions

if TYPE_CHECKING:  # annotations only: pandas loads inside the functions that use it
    import pandas as pd

RULES = {
    "strict": "OpenAI's and lm-eval's f1: the list of 'Final Answer: [..]' on the output's last line, else a parse "
    "error and 0",
    "flexible": "lm-eval's flexible_f1: the last line anywhere in the output that holds 'Final Answer: [..]'",
}
_ANSWER = re.compile(r"Final Answer:\s*\[(.*)\]")
TOO_LONG = "too_long"  # a published row longer than the run's longest length on some model: counted, not run


def _items(content: str) -> list[str]:
    return [item.strip().strip("'\"") for item in content.split(",") if item.strip()]


def parse(output: str, rule: str = "strict") -> tuple[list[str], bool]:
    """(answer nodes, parse error) of an output by `rule`."""
    lines = output.rstrip("\n").split("\n")
    for line in reversed(lines) if rule == "flexible" else lines[-1:]:
        match = _ANSWER.search(line)
        if match:
            return _items(match.group(1)), False
    return [], True


def set_scores(predicted: list[str], answer: list[str]) -> tuple[float, float, float]:
    """(precision, recall, F1) of the predicted set against the answer set, as OpenAI grades (0 where empty)."""
    found, truth = set(predicted), set(answer)
    overlap = len(found & truth)
    recall = overlap / len(truth) if truth else 0.0
    precision = overlap / len(found) if found else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return precision, recall, f1


def scored_fields(output: str, answer: list[str], rule: str = "strict") -> dict[str, Any]:
    predicted, error = parse(output, rule)
    precision, recall, f1 = set_scores(predicted, answer)
    return {"predicted": predicted, "parse_error": error, "precision": precision, "recall": recall, "score": f1}


def rescore(records: pd.DataFrame, rule: str) -> pd.DataFrame:
    """The records scored by `rule` from their stored outputs; a sample without an answer (thinking that never
    closed, a row too long to run) keeps its null score."""
    keep = list(~thinking.unclosed(records) & records["score"].notna())
    rows = [scored_fields(o, a, rule) if k else None
            for o, a, k in zip(records["output"], records["answer_nodes"], keep)]  # fmt: skip
    columns = {name: [row[name] if row else None for row in rows]
               for name in ("predicted", "parse_error", "precision", "recall", "score")}  # fmt: skip
    columns["parse_error"] = thinking.nullable(columns["parse_error"])
    return records.assign(**columns)


def setting(operation: str, depth: int) -> str:
    return f"bfs depth {depth}" if operation == "bfs" else "parents"


def size_bucket(count: int) -> int:
    """A power-of-two bucket of a count of edges or nodes, by its upper bound: 64 (up to 64), 128 (65 to 128), ..."""
    upper = 64
    while count > upper:
        upper *= 2
    return upper


def _summary(frame: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    groups = frame.groupby(by, sort=True)
    errors = ("parse_error", lambda e: int(e.fillna(False).sum()))
    table = groups.agg(samples=("sample_id", "count"), F1=("score", "mean"), precision=("precision", "mean"),
                       recall=("recall", "mean"), parse_errors=errors)  # fmt: skip
    if TOO_LONG in set(frame.get("outcome", [])):
        table["too_long"] = groups["outcome"].apply(lambda o: int((o == TOO_LONG).sum()))
    if thinking.has_thinking(frame):
        table[thinking.UNCLOSED] = thinking.unclosed_counts(frame, by).reindex(table.index).fillna(0).astype(int)
    return table


def tables(records: pd.DataFrame, options: GraphwalksOptions, paper: bool = False) -> dict[str, pd.DataFrame]:
    """F1, precision and recall by length and operation; by depth (BFS); by graph size (edges and nodes the model's
    prompt held) and operation."""
    frame = records.assign(setting=[setting(o, d) for o, d in zip(records["operation"], records["depth"])],
                           edge_bucket=[size_bucket(e) for e in records["edges"]],
                           node_bucket=[size_bucket(n) for n in records["nodes"]])  # fmt: skip
    out = {}
    by_length = _summary(frame, ["model", "ctx", "setting"])
    out["scores"] = with_cells(by_length, [{"model": m, "ctx": c, "operation": s.split()[0], **_depth(s)}
                                           for m, c, s in by_length.index], [{}] * by_length.shape[1])  # fmt: skip
    bfs = frame[frame["operation"] == "bfs"]
    if len(bfs):
        by_depth = _summary(bfs, ["model", "depth"])
        out["depth"] = with_cells(by_depth, [{"model": m, "operation": "bfs", "depth": d} for m, d in by_depth.index],
                                  [{}] * by_depth.shape[1])  # fmt: skip
    for key, bucket, column in (("size_edges", "edge_bucket", "edges"), ("size_nodes", "node_bucket", "nodes")):
        sized = _summary(frame, ["model", "operation", bucket]).rename_axis(index={bucket: f"{column} up to"})
        rows = [{"model": m, "operation": o, column: _bounds(b)} for m, o, b in sized.index]
        out[key] = with_cells(sized, rows, [{}] * sized.shape[1])
    if thinking.has_thinking(frame):
        out["thinking"] = thinking.thinking_table(frame)
    return thinking.with_thinking_note(out, frame)


def _depth(label: str) -> dict[str, int]:
    return {"depth": int(label.rsplit(" ", 1)[1])} if label.startswith("bfs") else {}


def _bounds(upper: int) -> list[int]:
    """The counts a size bucket holds, for the viewer's cell filter (a list of values)."""
    return list(range(0 if upper == 64 else upper // 2 + 1, upper + 1))


TITLES = {
    "scores": "F1, precision and recall by length and operation",
    "depth": "BFS: F1, precision and recall by depth",
    "size_edges": "By graph size: edges in the model's prompt (power-of-two buckets, by their upper bound), per "
    "operation",
    "size_nodes": "By graph size: distinct nodes in the model's prompt (power-of-two buckets, by their upper bound), "
    "per operation",
    "thinking": thinking.TITLE,
}
NOTE = (
    "F1 = set F1 of the parsed answer nodes against the nodes the operation gives on the edges the model's prompt "
    "held, as OpenAI grades (0 for a parse error or an empty list); precision and recall likewise, means over the "
    "scored samples; parse_errors counts outputs whose last line holds no 'Final Answer: [..]'"
)


@lru_cache(maxsize=2)
def _rows(data_dir: str | None) -> dict[int, data.Row]:
    """A run's published rows by index, read once for all the samples a viewer opens."""
    return {row.index: row for row in data.load_rows(data_dir)}


def _edge_lines(context: RunContext[GraphwalksOptions], record: dict, count: int) -> list[str]:
    """The first `count` edges of a sample's graph (the most any model's prompt held), rebuilt from the run's seed
    and options (generated) or read again from its rows (published)."""
    options = context.options
    if record["source"] == "generated":
        key = data.graph_key(record["seed"], record["ctx"], record["operation"], record["depth"], record["index"])
        graph = data.make_graph(key, record["operation"], record["depth"], options.nodes, options.degree,
                                record["span"])  # fmt: skip
        return [f"{source} -> {target}" for source, target in graph.edges(count)]
    prompt = _rows(options.data_dir)[record["index"]].prompt
    return [line for line in data.graph_of(prompt).splitlines() if " -> " in line]


def sample_view(context: RunContext[GraphwalksOptions], records: dict[str, dict], tokenizer_for, full_text):
    """For `diffeval view`: the operation with the asked node marked, the edge list (elided, its edges into or out of
    the asked node and its answer nodes marked), and each model's parsed set with precision and recall."""
    from diffeval.tasks.blocks import Document, Elided, Field, Fields, Mark, Output, Outputs, Text

    first = next(iter(records.values()))
    asked, answer = first["node"], set(first["answer_nodes"])
    question = first.get("operation_text") or setting(first["operation"], first["depth"])
    head, _, tail = question.partition(asked)
    blocks: list = [Text([head, Mark([asked], kind="asked-node", note="the asked node"), tail], style="paragraph",
                         title="Operation")]  # fmt: skip
    edges = _edge_lines(context, first, max(int(r.get("edges") or 0) for r in records.values()))
    if edges:
        marked = [Mark([line], kind="answer-edge") if any(n in answer or n == asked for n in line.split(" -> "))
                  else line for line in edges]  # fmt: skip
        pieces: list = [piece for line in marked for piece in (line, "\n")]
        if len(edges) > 40 and not full_text:
            pieces = pieces[:40] + [Elided("", "", f"… {len(edges) - 40} more edges …")] + pieces[-20:]
        blocks.append(Text(pieces, style="prompt", title=f"Edges ({len(edges)}), those touching the asked or an "
                                                         "answer node marked"))  # fmt: skip
    blocks.append(Fields([Field("answer nodes", ", ".join(first["answer_nodes"])), Field("source", first["source"])],
                         title="Answer"))  # fmt: skip
    outputs = [
        Output(model, record.get("output"), None if record.get("score") is None else record["score"] == 1.0,
               f"F1 {record['score']:.2f}" if record.get("score") is not None else record.get("outcome", "no answer"),
               [Field("parsed", ", ".join(record.get("predicted") or []) or "—"),
                Field("precision", record.get("precision")), Field("recall", record.get("recall")),
                Field("parse error", record.get("parse_error")), Field("edges seen", record.get("edges"))])
        for model, record in records.items()
    ]  # fmt: skip
    return Document([*blocks, Outputs(outputs, title="Outputs")])
