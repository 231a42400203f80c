"""GraphWalks' options (`GraphwalksOptions`: lengths, samples, operations, depths, the answer's subgraph, the source
of the graphs) and their checks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from diffeval.config import context_option, int_list, option, str_list
from diffeval.data import graphwalks as data
from diffeval.errors import InputError

SOURCES = ("generated", "openai")
ON_GENERATED = (lambda o: o.source == "generated", "with --source generated")


@dataclass(frozen=True)
class GraphwalksOptions:
    """GraphWalks (OpenAI): the nodes at one BFS depth, or a node's parents, over a long list of directed edges."""

    ctx: list[int] = context_option([2048, 4096], help="context lengths: 2k, 4K, 65536 or a comma list (k = 1024) "
                                    "[default: 2k,4k; OpenAI's instruction and examples take about 500 tokens]")
    samples: int = option(10, help="samples per length × operation (× depth for bfs) cell; with --source openai, "
                          "rows per length × operation at most", identity=False)  # fmt: skip
    operations: list[str] = option(list(data.OPERATIONS), help="bfs, parents or both", flag="--operations",
                                   parse=str_list("--operations"), applies=ON_GENERATED)  # fmt: skip
    depths: list[int] = option([1, 2], help="BFS depths asked", parse=int_list("--depths"), applies=ON_GENERATED)
    nodes: int = option(4, help="nodes of the answer's subgraph (the rest of the graph is filler edges that do not "
                        "change the answer)", applies=ON_GENERATED)  # fmt: skip
    degree: int = option(2, help="out-edges of each node (OpenAI's graphs: 4)", applies=ON_GENERATED)
    source: str = option("generated", help="generated: graphs built here, sized to each length; openai: "
                         f"rows of {data.HUB_ID} (the hub, or --data-dir)")  # fmt: skip
    data_dir: str | None = option(
        None,
        help=f"a folder of {data.HUB_ID} files (graphwalks*.parquet or graphwalks*.jsonl) instead of the hub",
        applies=(lambda o: o.source == "openai", "with --source openai"),
        reads=lambda o: data.data_files(Path(o.data_dir).expanduser()),
    )

    def validate(self) -> None:
        if self.source not in SOURCES:
            raise InputError(f"--source {self.source!r}: use one of {', '.join(SOURCES)}")
        if self.samples < 1:
            raise InputError(f"--samples {self.samples}: need at least 1 sample per cell")
        unknown = [o for o in self.operations if o not in data.OPERATIONS]
        if unknown or not self.operations:
            raise InputError(f"--operations {','.join(self.operations)}: use bfs, parents or bfs,parents")
        if any(d < 1 for d in self.depths) or not self.depths:
            raise InputError(f"--depths {','.join(map(str, self.depths))}: give BFS depths of at least 1, e.g. 1,2")
        if self.nodes < 2 or self.degree < 1:
            raise InputError(f"--nodes {self.nodes} --degree {self.degree}: need at least 2 nodes and 1 out-edge each")

    def cells(self) -> list[tuple[str, int]]:
        """(operation, depth) of each generated cell: one per BFS depth, one for parents (depth 0)."""
        return [(o, d) for o in self.operations for d in (self.depths if o == "bfs" else [0])]
