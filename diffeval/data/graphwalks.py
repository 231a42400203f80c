"""GraphWalks (OpenAI, `openai/graphwalks`): directed graphs as edge lists, asked for the nodes at one BFS depth from
a node or for a node's parents.

The prompt is OpenAI's, as its published rows hold it (the dataset card's example and the rows' text, 2026 rows):
the instruction, four worked examples on a four-node graph, "Here is the graph to operate on:", the edge list one
`SOURCE -> TARGET` a line, the operation and the closing request for the answer on the last line. Node names are hex
hashes of 10 characters, as in OpenAI's rows (there `md5(str(i))[:10]`; here of a seeded key, so that every sample
has its own names).

Generated graphs are a stream of edges: the answer's subgraph (`--nodes` nodes with `--degree` out-edges each,
duplicates and self-loops allowed, as OpenAI's) placed at seeded positions among the stream's first `span` edges,
then filler edges between filler nodes and from filler nodes into the subgraph. A filler edge never leaves a filler
node for the subgraph's nodes' out-edges (the subgraph is closed under out-edges: a BFS from its start never leaves
it), and never enters the node whose parents are asked: a prompt cut anywhere after `span` edges has the answer the
subgraph gives. Each model's prompt holds as many edges of the same stream as fill its budget.

Published rows: the hub's `openai/graphwalks` (its `graphwalks_128k_and_shorter.parquet`), or a local folder holding
`graphwalks*.parquet` or `graphwalks*.jsonl` files in its schema: prompt, answer_nodes, problem_type, prompt_chars,
date_added.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from diffeval.data import read_utf8
from diffeval.errors import InputError

HUB_ID = "openai/graphwalks"
HUB_FILE = "graphwalks_128k_and_shorter.parquet"
COLUMNS = ("prompt", "answer_nodes", "problem_type")  # the columns read; prompt_chars and date_added are not needed
OPERATIONS = ("bfs", "parents")

# OpenAI's prompt (openai/graphwalks rows; the dataset card's example shows its start)
INSTRUCTION = (
    "You will be given a graph as a list of directed edges. All nodes are at least degree 1. You will also get a "
    "description of an operation to perform on the graph.\n"
    "Your job is to execute the operation on the graph and return the set of nodes that the operation results in. "
    "If asked for a breadth-first search (BFS), only return the nodes that are reachable at that depth, do not return "
    "the starting node. If asked for the parents of a node, only return the nodes that have an edge leading to the "
    "given node, do not return the given node itself.\n\n"
)
EXAMPLES = (
    "Here is an example:\n<begin example>\n\nThe graph has the following edges:\n"
    "uvwx -> alke\nabcd -> uvwx\nabcd -> efgh\nefgh -> uvwx\n\n"
    "Example 1:\nOperation:\nPerform a BFS from node abcd with depth 1.\nFinal Answer: [uvwx, efgh]\n\n"
    "Example 2:\nOperation:\nPerform a BFS from node alke with depth 1.\nFinal Answer: []\n\n"
    "Example 3:\nOperation:\nFind the parents of node uvwx.\nFinal Answer: [abcd, efgh]\n\n"
    "Example 4:\nOperation:\nFind the parents of node abcd.\nFinal Answer: []\n\n"
    "<end example>\n"
)
GRAPH_HEAD = "Here is the graph to operate on:\nThe graph has the following edges:\n"
CLOSING = (
    "You should immediately return the set of nodes that the operation results in, with no additional text. Return "
    "your final answer as a list of nodes in the very last line of your response. For example, if the operation "
    "returns the set of nodes [node1, node2, node3], your response should be:\nFinal Answer: [node1, node2, node3]\n"
    "If the operation returns the empty set, your response should be:\nFinal Answer: []\n"
)
HEAD = INSTRUCTION + EXAMPLES + GRAPH_HEAD
NAME_CHARS = 10  # OpenAI's node names: 10 hex characters
SPAN_SHARE = 0.9  # the answer's subgraph lies within this share of the fewest edges any model's prompt holds
ATTEMPTS = 200  # subgraphs drawn before a depth that none reaches is refused

Edge = tuple[str, str]


def operation_text(operation: str, node: str, depth: int) -> str:
    if operation == "bfs":
        return f"Perform a BFS from node {node} with depth {depth}."
    return f"Find the parents of node {node}."


def prompt_text(edges: Iterable[Edge], operation: str, node: str, depth: int) -> str:
    """OpenAI's prompt around an edge list: the user message (its last line asks for the answer)."""
    lines = "".join(f"{source} -> {target}\n" for source, target in edges)
    return f"{HEAD}{lines}\n\nOperation:\n{operation_text(operation, node, depth)}\n\n{CLOSING}"


def graph_key(seed: int, ctx: int, operation: str, depth: int, index: int) -> str:
    """The seed of a generated sample's graph."""
    return f"graphwalks|{seed}|{ctx}|{operation}|{depth}|{index}"


def node_name(key: str) -> str:
    return hashlib.md5(key.encode()).hexdigest()[:NAME_CHARS]


def bfs_layer(edges: Iterable[Edge], start: str, depth: int) -> list[str]:
    """The nodes whose shortest directed distance from `start` is exactly `depth` (sorted): a revisited node is not
    added again, as OpenAI's corrected rows (2026-02-27) ask."""
    children: dict[str, list[str]] = {}
    for source, target in edges:
        children.setdefault(source, []).append(target)
    distance, queue = {start: 0}, deque([start])
    while queue:
        node = queue.popleft()
        if distance[node] == depth:
            continue
        for child in children.get(node, []):
            if child not in distance:
                distance[child] = distance[node] + 1
                queue.append(child)
    return sorted(n for n, d in distance.items() if d == depth and n != start)


def parents(edges: Iterable[Edge], node: str) -> list[str]:
    """The nodes with an edge into `node`, itself excluded (sorted)."""
    return sorted({source for source, target in edges if target == node and source != node})


def answer_of(edges: Iterable[Edge], operation: str, node: str, depth: int) -> list[str]:
    return bfs_layer(edges, node, depth) if operation == "bfs" else parents(edges, node)


@dataclass(frozen=True)
class Graph:
    """One sample's edge stream: the answer's subgraph at `positions` among the first `span` edges, filler around."""

    key: str
    core: tuple[Edge, ...]
    positions: tuple[int, ...]  # stream index of each core edge, ascending
    operation: str
    node: str  # the start of the BFS, or the node whose parents are asked
    depth: int  # the BFS depth (0 for parents)
    answer: tuple[str, ...]  # on the core alone: the answer on any prefix of the stream that holds all of it
    degree: int

    def edges(self, count: int) -> list[Edge]:
        """The stream's first `count` edges."""
        placed = dict(zip(self.positions, self.core))
        filler = 0
        out = []
        for index in range(count):
            if index in placed:
                out.append(placed[index])
            else:
                out.append(self._filler(filler))
                filler += 1
        return out

    def _filler(self, index: int) -> Edge:
        """Filler edge `index`: from filler node index // degree to a filler node near it or into the subgraph
        (never into the node whose parents are asked)."""
        rng = random.Random(f"{self.key}|filler|{index}")
        source = index // self.degree
        if self._entries and rng.random() < 0.1:
            return self._filler_name(source), rng.choice(self._entries)
        return self._filler_name(source), self._filler_name(rng.randrange(source + 2 * self.degree + 1))

    @cached_property
    def _entries(self) -> list[str]:
        """The subgraph's nodes a filler edge may enter: all but the node whose parents are asked."""
        asked = {self.node} if self.operation == "parents" else set()
        return sorted({n for edge in self.core for n in edge} - asked)

    def _filler_name(self, index: int) -> str:
        return node_name(f"{self.key}|f{index}")


def make_graph(key: str, operation: str, depth: int, nodes: int, degree: int, span: int) -> Graph:
    """A seeded subgraph of `nodes` nodes with `degree` out-edges each and an asked node whose answer is non-empty,
    its edges at seeded positions among the first `span`; refused in one line when no draw reaches `depth`."""
    if nodes * degree > span:
        raise ValueError(f"{nodes * degree} subgraph edges cannot lie among the first {span}")
    for attempt in range(ATTEMPTS):
        rng = random.Random(f"{key}|core|{attempt}")
        names = [node_name(f"{key}|{attempt}|n{i}") for i in range(nodes)]
        core = [(source, rng.choice(names)) for source in names for _ in range(degree)]
        rng.shuffle(core)
        for node in rng.sample(names, len(names)):
            answer = answer_of(core, operation, node, depth)
            if answer:
                positions = tuple(sorted(rng.sample(range(span), len(core))))
                return Graph(key, tuple(core), positions, operation, node, depth, tuple(answer), degree)
    what = f"depth {depth}" if operation == "bfs" else "a node with a parent"
    raise InputError(f"no graph of --nodes {nodes} and --degree {degree} reached {what} in {ATTEMPTS} draws: give more "
                     "--nodes or a lower --degree, or smaller --depths")  # fmt: skip


# ---- published rows ---------------------------------------------------------------------------------------------

_BFS = re.compile(r"Perform a BFS from node (\S+) with depth (\d+)\.")
_PARENTS = re.compile(r"Find the parents of node (\S+?)\.")


@dataclass(frozen=True)
class Row:
    """One published row: its prompt, answer nodes, operation, and the asked node and depth read from the prompt."""

    index: int
    prompt: str
    answer: tuple[str, ...]
    operation: str
    node: str
    depth: int
    edges: int  # edge lines after "Here is the graph to operate on:"
    nodes: int  # distinct nodes of those lines


def row_from(index: int, record: dict, source: str) -> Row:
    try:
        prompt, answer, operation = record["prompt"], record["answer_nodes"], record["problem_type"]
    except (KeyError, TypeError):
        raise InputError(f"{source}: row {index} lacks prompt, answer_nodes or problem_type: give rows in "
                         f"the schema of {HUB_ID}") from None  # fmt: skip
    answer = list(answer) if not isinstance(answer, (str, bytes)) and hasattr(answer, "__iter__") else None
    if not isinstance(prompt, str) or answer is None or operation not in OPERATIONS:
        raise InputError(f"{source}: row {index} is not in the schema of {HUB_ID} (prompt text, answer_nodes a list, "
                         f"problem_type bfs or parents)")  # fmt: skip
    asked = operation_of(prompt)
    if asked is None or asked[0] != operation:
        raise InputError(f"{source}: row {index}'s prompt asks no {operation} operation OpenAI's prompt words")
    lines = [line.split(" -> ") for line in graph_of(prompt).splitlines() if " -> " in line]
    nodes = len({name.strip() for line in lines for name in line})
    return Row(index, prompt, tuple(str(a) for a in answer), operation, asked[1], asked[2], len(lines), nodes)


def graph_of(prompt: str) -> str:
    """The edge list of a prompt: after "Here is the graph to operate on:", before its operation."""
    return prompt.split(GRAPH_HEAD.split("\n")[0], 1)[-1].rsplit("Operation:", 1)[0]


def operation_of(prompt: str) -> tuple[str, str, int] | None:
    """(operation, node, depth) of the prompt's last operation (its examples come first)."""
    tail = prompt.rsplit("Operation:", 1)[-1]
    if match := _BFS.search(tail):
        return "bfs", match.group(1), int(match.group(2))
    if match := _PARENTS.search(tail):
        return "parents", match.group(1), 0
    return None


def data_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("graphwalks*") if p.suffix in (".parquet", ".jsonl"))


def load_rows(data_dir: str | None) -> list[Row]:
    """The published rows: from `data_dir` (graphwalks*.parquet / graphwalks*.jsonl), else from the hub."""
    if data_dir is None:
        return _hub_rows()
    folder = Path(data_dir).expanduser()
    files = data_files(folder) if folder.is_dir() else []
    if not files:
        raise InputError(f"--data-dir {data_dir}: no graphwalks*.parquet or graphwalks*.jsonl file there: give a "
                         f"folder holding {HUB_FILE} of {HUB_ID} or rows in its schema as JSONL")  # fmt: skip
    records: list[tuple[dict, str]] = []
    for path in files:
        records += [(r, str(path)) for r in (_parquet(path) if path.suffix == ".parquet" else _jsonl(path))]
    if not records:
        raise InputError(f"--data-dir {data_dir}: its graphwalks files hold no rows")
    return [row_from(i, record, source) for i, (record, source) in enumerate(records)]


def _jsonl(path: Path) -> list[dict]:
    rows = []
    for number, line in enumerate(read_utf8(path).splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}: line {number} is not JSON ({exc.msg}): give one row a line") from None
    return rows


def _parquet(path: Path) -> list[dict]:
    import pandas as pd

    try:
        frame = pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises its own error types for a damaged file
        raise InputError(f"{path}: not a readable parquet file ({type(exc).__name__}): give "
                         f"the file of {HUB_ID} or rows in its schema") from None  # fmt: skip
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise InputError(f"{path}: lacks column(s) {', '.join(missing)}: give rows in the schema of {HUB_ID}")
    return frame[list(COLUMNS)].to_dict("records")


def _hub_rows() -> list[Row]:  # pragma: no cover - the hub is not reachable where the tests run
    import datasets

    try:
        table = datasets.load_dataset(HUB_ID, data_files=HUB_FILE, split="train")
    except Exception as exc:  # no network, no access: say so in one line
        raise InputError(f"{HUB_ID} could not be loaded from the hub ({type(exc).__name__}): give --data-dir with "
                         f"its {HUB_FILE}") from None  # fmt: skip
    return [row_from(i, dict(record), HUB_ID) for i, record in enumerate(table)]
