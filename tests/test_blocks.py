"""The sample viewer's blocks (diffeval/tasks/blocks.py): their JSON forms, their checks, and the one number format."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from diffeval.report.format import NumberFormats, display_table, markdown_table, p_value_text
from diffeval.tasks import blocks
from diffeval.tasks.blocks import (
    Bar,
    Bars,
    Chart,
    Document,
    Elided,
    Field,
    Fields,
    Labels,
    Mark,
    Notice,
    Output,
    Outputs,
    Section,
    Series,
    Span,
    Text,
)


def test_a_document_has_one_json_form():
    document = Document([
        Section([
            Notice("rebuilt differently", model="m"),
            Text(["head ", Elided("ab", "yz", "… 22 characters …", "ab" + "c" * 22 + "yz", tone="muted"),
                  Mark(["the ", Mark(["42"], tone="strong", kind="number", note="tokens 3-4")], kind="needle other"),
                  Span("tail")], model="m"),
        ], title="Prompt", model="m", right=False),
        Fields([Field("accuracy", 1.0), Field("count", 3), Field("flag", True), Field("none", None)]),
        Outputs([Output("m", "out", True, "fine", [Field("seconds", 0.25)])]),
        Bars([Bar("a", -1.5, colour=0, emphasis=True, note="(gold)"), Bar("b", -2.0, colour="#00ff00")]),
        Chart(["L0", "L1"], [Series("answer", [0.5, 0.25], "#d62728")], title="A1"),
        Labels([1, 0, 1], ["x", "y"]),
    ])  # fmt: skip
    payload = document.to_json()
    assert json.loads(json.dumps(payload)) == payload  # plain JSON, nothing else
    section, fields, outputs, bars, chart, labels = payload["blocks"]
    assert section == {
        "type": "section", "title": "Prompt", "model": "m", "right": False, "blocks": [
            {"type": "notice", "model": "m", "text": "rebuilt differently", "level": "warning"},
            {"type": "text", "model": "m", "style": "prompt", "pieces": [
                "head ",
                {"head": "ab", "tail": "yz", "hidden": "… 22 characters …", "text": "ab" + "c" * 22 + "yz",
                 "tone": "muted"},
                {"mark": ["the ", {"mark": ["42"], "tone": "strong", "kind": "number", "note": "tokens 3-4"}],
                 "tone": "highlight", "kind": "needle other"},
                {"span": "tail", "tone": "muted"},
            ]},
        ],
    }  # fmt: skip
    assert [r["text"] for r in fields["rows"]] == ["1.000", "3", "yes", ""]  # 1.0 is a metric: 1.000, never 1
    assert outputs["rows"] == [
        {"model": "m", "text": "out", "right": True, "label": "fine", "fields": [{"label": "seconds", "text": "0.250"}]}
    ]
    shown = [(b["text"], b["emphasis"], b["colour"]) for b in bars["bars"]]
    assert shown == [("-1.500", True, 0), ("-2.000", False, "#00ff00")]
    [series] = chart["series"]
    assert series == {"name": "answer", "colour": "#d62728", "values": [0.5, 0.25], "texts": ["0.500", "0.250"]}
    assert labels == {"type": "labels", "sequence": [1, 0, 1], "names": ["x", "y"]}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Mark(["x"], tone="loud"), "tone 'loud'"),
        (lambda: Mark(["x"], kind="Needle!"), "mark kind 'Needle!'"),
        (lambda: Text(["x"], style="poster"), "style 'poster'"),
        (lambda: Bar("a", 1.0, colour="red"), "colour 'red'"),
        (lambda: Chart(["L0", "L1"], [Series("s", [1.0], 0)]), "1 values for 2 categories"),
        (lambda: Labels([2], ["x", "y"]), "outside the 2 names"),
        (lambda: Notice("x", level="shout"), "level 'shout'"),
    ],
)
def test_blocks_refuse_what_the_page_cannot_show(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_a_text_piece_must_be_a_piece():
    with pytest.raises(TypeError, match="not int"):
        Text(["x", 3]).to_json()


def test_numbers_keep_their_format_whatever_the_value():
    assert [blocks.number(v) for v in (1, 1.0, 0.9, 0, None, math.nan)] == ["1.000", "1.000", "0.900", "0.000", "", ""]
    assert blocks.number(56.26, 1) == "56.3" and blocks.number(12.0, 0) == "12"
    p_values = (1.0, 0.0213, 0.001, 0.00042, math.nan)
    assert [p_value_text(p) for p in p_values] == ["1.000", "0.021", "0.001", "4.2e-04", ""]


def test_a_tables_cells_follow_their_columns_format():
    table = pd.DataFrame(
        {"acc": [1.0, 0.9], "n": [10, 12], "count": [3.0, float("nan")], "p_value": [0.5, 1e-5], "test": ["a", "b"]},
        index=pd.MultiIndex.from_tuples(
            [("diff", "base", "all"), ("diff", "base", 1024)], names=["diff", "base", "ctx"]
        ),
    )
    formats = NumberFormats({"count": 0, "table1": 1}, "acc")
    shown, numeric = display_table("paired", table, formats)
    assert list(shown.columns) == ["diff", "base", "ctx", "acc", "n", "count", "p_value", "test"]  # labels as columns
    assert shown.values.tolist() == [
        ["diff", "base", "all", "1.000", "10", "3", "0.500", "a"],
        ["diff", "base", "1024", "0.900", "12", "", "1.0e-05", "b"],
    ]
    assert numeric == [False, False, False, True, True, True, True, False]
    assert display_table("table1", table, formats)[0]["acc"].tolist() == ["1.0", "0.9"]  # the table's declared decimals
    text = markdown_table("paired", table, formats)
    assert "('diff'" not in text and "| diff   | base   | all   |" in text


def test_the_blocks_module_imports_only_the_standard_library():
    """Plugins and the CLI import it: nothing heavy, nothing of diffeval's."""
    tree = ast.parse(Path(blocks.__file__).read_text())
    nodes = list(ast.walk(tree))
    imported = {alias.name.split(".")[0] for node in nodes if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in nodes if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "math", "re", "dataclasses"}, imported
