"""GraphWalks (OpenAI): the nodes at one BFS depth from a node, or a node's parents, over a long list of directed edges.

Recipe (the graphs and OpenAI's prompt: data/graphwalks.py; parsing, tables and view: graphwalks_report):
1. prepare: at each length, the fewest edges any model's prompt holds (OpenAI's prompt through its chat template,
   filling ctx − the answer budget); the answer's subgraph lies among the first 90 % of them (`span`). A subgraph
   with more edges than that is refused in one line, with the most nodes that fit. With `--source openai`, each
   published row goes to the shortest length that holds it on every model; a row no length holds is recorded as
   `too_long`, without an answer, and counted in the tables.
2. samples: per length × operation (× depth), a seeded subgraph and asked node whose answer is non-empty, in a stream
   of filler edges that cannot change it; the same stream for every model.
3. prompt: each model's prompt holds as many of the stream's edges as fill its budget (the last edge that fits: within
   one edge line of it); the answer is computed on exactly those edges and recorded per model (`answer_nodes`).
4. backend: greedy generation up to the answer budget (--max-new-tokens; by default 16 + 12 tokens per node of the
   subgraph, 256 for published rows), a whole chunk per engine call.
5. score: the set F1 of the last line's "Final Answer: [..]" against the answer nodes (`strict`, OpenAI's and
   lm-eval's rule), with precision, recall and the parse error; `report --scoring flexible` rescores by lm-eval's
   flexible rule.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from diffeval.data import graphwalks as data
from diffeval.errors import InputError
from diffeval.records import MayBeAbsent, Record, sample_id
from diffeval.tasks import thinking
from diffeval.tasks.base import ContextBudget, Listing, Reporting, RunContext, Running, Scoring, Task, Viewing
from diffeval.tasks.generated import graphwalks_report as report
from diffeval.tasks.generated.fitting import Renderer, most_items
from diffeval.tasks.generated.graphwalks_options import GraphwalksOptions

# the default answer budget: "Final Answer: [" and the list, at most every node of the answer's subgraph, a 10-character
# name and its comma in up to 12 tokens (a byte-level tokenizer's); a published row's lists run longer
ANSWER_BASE, ANSWER_PER_NODE, ANSWER_PUBLISHED = 16, 12, 256
MIN_PROMPT_TOKENS = 300  # the least prompt a length must leave beside the answer: OpenAI's instruction and examples


@dataclass(frozen=True)
class GraphwalksSample:
    sample_id: str
    ctx: int  # for a published row no length holds: the run's longest
    operation: str
    depth: int
    index: int  # the cell's sample index, or the published row's index
    span: int  # the stream's edges among which the answer's subgraph lies (0 for a published row)
    seed: int
    fits: bool = True  # False: a published row too long for every length of the run, recorded and never run
    graph: data.Graph | None = None
    row: data.Row | None = None


def answer_budget(context: RunContext[GraphwalksOptions]) -> int:
    """--max-new-tokens, else room for a list of every node of the answer's subgraph (generated) or 256 tokens."""
    if context.max_new_tokens:
        return context.max_new_tokens
    options = context.options
    return ANSWER_PUBLISHED if options.source == "openai" else ANSWER_BASE + ANSWER_PER_NODE * options.nodes


def most_edges(graph: data.Graph, renderer: Renderer, budget: int) -> int:
    """The most edges of the graph's stream whose prompt fits `budget` tokens: -1 when even none fits."""

    def size(count: int) -> int:
        return len(renderer.ids(data.prompt_text(graph.edges(count), graph.operation, graph.node, graph.depth)))

    return most_items(size, budget)


def _budget(ctx: int, context: RunContext[GraphwalksOptions]) -> int:
    return ctx - answer_budget(context) - thinking.reserve(context)


def prepare(context: RunContext[GraphwalksOptions], tokenizers: dict[str, Any]) -> dict:
    """Generated: {ctx: span}, the stream's first edges that every model's prompt holds, 90 % of them. Published:
    {"rows": [(row, shortest length that holds it on every model, or None)]}."""
    options = context.options
    renderers = {name: Renderer(t, context.chat_template, name) for name, t in tokenizers.items()}
    if options.source == "openai":
        placed = []
        for row in data.load_rows(options.data_dir):
            tokens = max(len(r.ids(row.prompt)) for r in renderers.values())
            fits = [ctx for ctx in sorted(context.lengths) if tokens <= _budget(ctx, context)]
            placed.append((row, fits[0] if fits else None, max(context.lengths)))
        return {"rows": placed}
    spans = {}
    probe = data.Graph(f"graphwalks|probe|{context.seed}", (), (), "parents", data.node_name("probe"), 0, (),
                       options.degree)  # fmt: skip
    for ctx in context.lengths:
        held = {name: most_edges(probe, r, _budget(ctx, context)) for name, r in renderers.items()}
        name, fewest = min(held.items(), key=lambda item: item[1])
        if fewest < 1:
            given = "" if context.max_new_tokens else " (16 + 12 per --nodes: give fewer, or --max-new-tokens)"
            raise InputError(f"--ctx {ctx}: model {name}'s prompt holds no edge beside the answer budget of "
                             f"{answer_budget(context)} tokens{given}: use a longer --ctx")  # fmt: skip
        span = int(data.SPAN_SHARE * fewest)
        if options.nodes * options.degree > span:
            most = span // options.degree
            advice = f"use --nodes {most} or fewer" if most >= 2 else "use a lower --degree"
            raise InputError(f"--nodes {options.nodes} × --degree {options.degree} = {options.nodes * options.degree} "
                             f"edges: context {ctx} holds {fewest} edges on model {name}, the answer's graph at most "
                             f"{span}: {advice}, or a longer --ctx")  # fmt: skip
        spans[ctx] = span
    return spans


def make_samples(options: GraphwalksOptions, seed: int, limit: int | None = None, prepared=None) -> list:
    count = min(options.samples, limit) if limit else options.samples
    if options.source == "openai":
        taken: dict[tuple, int] = {}
        out = []
        for row, ctx, longest in prepared["rows"]:
            cell = (ctx, row.operation)
            taken[cell] = taken.get(cell, 0) + 1
            if taken[cell] <= count:  # rows no length holds count against --samples too, per operation
                key = f"graphwalks|openai|{row.index}|{sample_id(row.prompt)}"
                out.append(GraphwalksSample(sample_id(key), ctx or longest, row.operation, row.depth, row.index, 0,
                                            seed, fits=ctx is not None, row=row))  # fmt: skip
        return out
    samples = []
    for ctx, span in prepared.items():
        for operation, depth in options.cells():
            for index in range(count):
                key = data.graph_key(seed, ctx, operation, depth, index)
                graph = data.make_graph(key, operation, depth, options.nodes, options.degree, span)
                identity = f"{key}|nodes={options.nodes}|degree={options.degree}|span={span}"
                samples.append(GraphwalksSample(sample_id(identity), ctx, operation, depth, index, span, seed,
                                                graph=graph))  # fmt: skip
    return samples


def user_message(sample: GraphwalksSample, renderer: Renderer, budget: int) -> tuple[str, list[data.Edge] | None]:
    """The sample's user message on this model (its edges: as many as fit, for a generated graph)."""
    if sample.row is not None:
        return sample.row.prompt, None
    graph = sample.graph
    assert graph is not None
    edges = graph.edges(max(most_edges(graph, renderer, budget), 0))
    return data.prompt_text(edges, graph.operation, graph.node, graph.depth), edges


def evaluate(batch: list[GraphwalksSample], backend, context: RunContext[GraphwalksOptions]) -> list[Record]:
    start = time.perf_counter()
    renderer, answer = Renderer(backend, context.chat_template), answer_budget(context)
    ready, records = [], []
    for sample in batch:
        if not sample.fits:  # a published row too long for every length: recorded, never generated
            records.append(_record(sample, backend, [], 0, None, {"outcome": report.TOO_LONG, "score": None}))
            continue
        user, edges = user_message(sample, renderer, _budget(sample.ctx, context))
        text = renderer.text(user)
        ready.append((sample, edges, thinking.Ask(backend.encode(text).ids, text, "")))
    fitting = (time.perf_counter() - start) / max(len(batch), 1)
    outputs = thinking.generate(backend, context, [ask for *_, ask in ready], answer, []) if ready else []
    for (sample, edges, ask), out in zip(ready, outputs):
        graph, row = sample.graph, sample.row
        node = graph.node if graph else row.node if row else ""
        published = list(row.answer) if row else []
        nodes = data.answer_of(edges or [], graph.operation, graph.node, graph.depth) if graph else published
        scored = report.scored_fields(out.text, nodes) if thinking.answered(out) else {"score": None}
        fields = {"output": out.text, "operation_text": data.operation_text(sample.operation, node, sample.depth),
                  **scored, **thinking.thinking_fields(out, outcome=False)}  # fmt: skip
        if not thinking.answered(out):
            fields["outcome"] = thinking.UNCLOSED
        seconds = fitting + out.seconds
        records.append(_record(sample, backend, edges, len(ask.ids), out, fields, nodes, seconds))
    return records


def _record(sample: GraphwalksSample, backend, edges, prompt_tokens: int, out, fields: dict,
            answer: list[str] | None = None, seconds: float = 0.0) -> Record:  # fmt: skip
    row, graph = sample.row, sample.graph
    seen = edges if graph is not None else []
    node = graph.node if graph is not None else row.node if row is not None else ""
    described = {
        "ctx": sample.ctx, "operation": sample.operation, "depth": sample.depth, "index": sample.index,
        "source": "generated" if graph is not None else "openai", "node": node, "span": sample.span,
        "answer_nodes": answer if answer is not None else list(row.answer if row else []),
        "edges": len(seen) if graph is not None else row.edges if row else 0,
        "nodes": len({n for edge in seen for n in edge}) if graph is not None else row.nodes if row else 0, **fields,
    }  # fmt: skip
    if graph is not None:
        described["seed"] = sample.seed
    new_tokens = thinking.generated_tokens(out) if out is not None else 0
    return Record("graphwalks", backend.info.name, sample.sample_id, prompt_tokens, new_tokens, seconds, described)


def budget(context: RunContext[GraphwalksOptions]) -> ContextBudget:
    return ContextBudget(context.lengths, answer_budget(context), MIN_PROMPT_TOKENS, thinking=thinking.reserve(context))


def check_inputs(context: RunContext[GraphwalksOptions]) -> None:
    if context.options.source == "openai":
        data.load_rows(context.options.data_dir)


def sizing(samples: list[GraphwalksSample], tokenizer, context: RunContext[GraphwalksOptions]) -> tuple[int, int]:
    """A generated prompt fills its budget; a published row is its own length."""
    renderer = Renderer(tokenizer, context.chat_template)  # a PromptTokenizer: a backend's render_prompt
    prompt = sum(len(renderer.ids(s.row.prompt)) if s.row else _budget(s.ctx, context) for s in samples if s.fits)
    per_sample = answer_budget(context) + (thinking.budget(context) or 0)
    return prompt, per_sample * sum(1 for s in samples if s.fits)


RECORD_SCHEMA = {
    "ctx": int, "operation": str, "depth": int, "index": int, "source": str, "node": str, "span": int,
    "answer_nodes": list[str], "edges": int, "nodes": int, "score": float | None,
    "output": MayBeAbsent(str), "predicted": MayBeAbsent(list[str] | None), "parse_error": MayBeAbsent(bool | None),
    "precision": MayBeAbsent(float | None), "recall": MayBeAbsent(float | None), "seed": MayBeAbsent(int),
    "operation_text": MayBeAbsent(str), **thinking.THINKING_SCHEMA,
}  # fmt: skip
FLOOR = 0.05  # a cell where every model's mean F1 is at most this reads no difference

TASK = Task(
    name="graphwalks",
    help="GraphWalks (OpenAI): BFS depth or parents over a long list of directed edges, set F1.",
    options=GraphwalksOptions,
    run_options=("chat_template", "max_new_tokens", *thinking.RUN_OPTIONS),
    running=Running(
        make_samples=make_samples,
        evaluate=evaluate,
        budget=budget,
        check_inputs=check_inputs,
        prepare=prepare,
        sizing=sizing,
    ),  # fmt: skip
    reporting=Reporting(
        tables=report.tables,
        titles=report.TITLES,
        note=report.NOTE,
        summary_keys=["model", "ctx", "operation", "depth"],
        pair_keys=["ctx", "operation", "depth"],
        metrics={"f1": "score", "precision": "precision", "recall": "recall"},
        decimals={"parse_errors": 0, "samples": 0, report.TOO_LONG: 0, thinking.UNCLOSED: 0},
        floor=FLOOR,
    ),
    viewing=Viewing(
        sample_view=report.sample_view, listing=Listing(answer="predicted", expected="answer_nodes", outcome=None)
    ),  # fmt: skip
    scoring=Scoring(record_schema=RECORD_SCHEMA, rules=report.RULES, rescore=report.rescore),
)
