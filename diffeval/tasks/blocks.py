"""What `diffeval view` shows of one sample: typed, generic blocks, each with one JSON form (`to_json`).

A task's `sample_view` returns a `Document`, a list of these blocks; the page (view/static/viewer.js) renders blocks
and knows no task, so a task from another package gets a real view by returning blocks too. `Listing` declares which
record columns the page's sample list shows. Numbers are formatted here, once (`number`): the page shows text.

    Text      text in pieces: strings, `Mark` (a highlighted span, nestable) and `Elided` (a long stretch shown as
              its two ends, expandable in place, or, when the payload holds only the ends, fetched whole on request)
    Fields    a key–value table
    Outputs   each model's output, whether it is right (right, wrong, neither) and a few fields
    Bars      one horizontal bar per labelled value (label scores, with the chosen one emphasised)
    Chart     grouped vertical bars: categories × series (shares per layer and segment)
    Labels    a sequence of coloured labels with a legend (demonstration labels in their order)
    Notice    one line: a warning or a note
    Section   a titled group of blocks (one model's part of the view)

Every block may name its `model` (the page marks it with data-model) and carry a `title`. Colours are an index into
the page's categorical palette (the same index, the same colour in every block) or a "#rrggbb" string.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

DECIMALS = 3  # scores, accuracies and shares, their differences and intervals: in every table, view and listing
TONES = ("highlight", "strong", "faint", "muted")  # how a Mark or an elided stretch looks
TEXT_STYLES = ("prompt", "document", "paragraph", "mono")  # monospace box, prose box, plain paragraph, monospace line
NOTICE_LEVELS = ("warning", "note")
_KIND = re.compile(r"[a-z][a-z0-9-]{0,31}( [a-z][a-z0-9-]{0,31}){0,3}")  # CSS class names
_HEX = re.compile(r"#[0-9a-fA-F]{6}")

Colour = int | str


def number(value, decimals: int = DECIMALS) -> str:
    """A metric's text: fixed decimals, whatever the value (1 shows as 1.000 beside 0.900); "" for a missing value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{float(value):.{decimals}f}" if decimals > 0 else f"{round(float(value)):d}"


def value_text(value, decimals: int = DECIMALS) -> str:
    """Any record value as text: floats as metrics (`number`), integers as counts, lists joined, others as str."""
    if isinstance(value, float) or value is None or isinstance(value, bool):
        return number(value, decimals)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, tuple)):
        return ", ".join(value_text(v, decimals) for v in value)
    return str(value)


def _check_colour(colour: Colour | None) -> None:
    if colour is None or (isinstance(colour, int) and not isinstance(colour, bool) and colour >= 0):
        return
    if not (isinstance(colour, str) and _HEX.fullmatch(colour)):
        raise ValueError(f"colour {colour!r}: give a palette index (int >= 0) or '#rrggbb'")


def _check_choice(name: str, value: str | None, choices: tuple[str, ...]) -> None:
    if value is not None and value not in choices:
        raise ValueError(f"{name} {value!r}: use one of {', '.join(choices)}")


# ---- pieces of a Text block -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Mark:
    """A highlighted span. `kind` names it for the page (one or a few CSS class names, for tests and style sheets),
    `tone` says how it looks, `note` is its tooltip; pieces may hold further marks (a number inside its sentence)."""

    pieces: list
    tone: str = "highlight"
    kind: str | None = None
    note: str | None = None

    def __post_init__(self) -> None:
        _check_choice("tone", self.tone, TONES)
        if self.kind is not None and not _KIND.fullmatch(self.kind):
            raise ValueError(f"mark kind {self.kind!r}: use up to 4 words of lowercase letters, digits and '-'")

    def to_json(self) -> dict:
        out = {"mark": [_piece_json(p) for p in self.pieces], "tone": self.tone}
        return out | {k: v for k, v in (("kind", self.kind), ("note", self.note)) if v is not None}


@dataclass(frozen=True)
class Elided:
    """A long stretch: its `head` and `tail` with a button labelled `hidden` between them. With `text` (the whole
    stretch) the button shows it in place; without, the page asks for the sample again with whole texts."""

    head: str
    tail: str
    hidden: str  # the button's label, e.g. "… 812 haystack tokens …"
    text: str | None = None
    tone: str | None = None

    def __post_init__(self) -> None:
        _check_choice("tone", self.tone, TONES)

    def to_json(self) -> dict:
        out = {"head": self.head, "tail": self.tail, "hidden": self.hidden}
        return out | {k: v for k, v in (("text", self.text), ("tone", self.tone)) if v is not None}


@dataclass(frozen=True)
class Span:
    """Plain text in a tone (a haystack in grey), without a highlight."""

    text: str
    tone: str = "muted"

    def __post_init__(self) -> None:
        _check_choice("tone", self.tone, TONES)

    def to_json(self) -> dict:
        return {"span": self.text, "tone": self.tone}


def _piece_json(piece) -> str | dict:
    if isinstance(piece, str):
        return piece
    if isinstance(piece, (Mark, Elided, Span)):
        return piece.to_json()
    raise TypeError(f"a Text piece is a str, Mark, Elided or Span, not {type(piece).__name__}")


# ---- blocks ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Field:
    """One row of a Fields block or of an output's details: a label and a value (numbers as `value_text`)."""

    label: str
    value: object
    decimals: int = DECIMALS

    def to_json(self) -> dict:
        return {"label": self.label, "text": value_text(self.value, self.decimals)}


@dataclass(frozen=True)
class Bar:
    """One labelled value of a Bars block; `emphasis` draws it in the accent colour (the chosen label)."""

    label: str
    value: float
    colour: Colour | None = None
    emphasis: bool = False
    note: str | None = None  # beside the label, e.g. "(gold)"

    def __post_init__(self) -> None:
        _check_colour(self.colour)


@dataclass(frozen=True)
class Series:
    """One series of a Chart: a value per category, in one colour."""

    name: str
    values: list[float]
    colour: Colour


@dataclass(frozen=True)
class Output:
    """One model's output in an Outputs block: its text, whether it is right (True, False, or None: neither) with a
    label saying so, and details."""

    model: str
    text: str | None
    right: bool | None = None
    label: str | None = None  # the outcome in words, e.g. "hallucination-free"
    fields: list[Field] = field(default_factory=list)


@dataclass(frozen=True)
class Block:
    title: str | None = field(default=None, kw_only=True)
    model: str | None = field(default=None, kw_only=True)

    kind = ""  # the JSON `type`

    def to_json(self) -> dict:
        head = {"type": self.kind}
        return head | {k: v for k, v in (("title", self.title), ("model", self.model)) if v is not None}


@dataclass(frozen=True)
class Text(Block):
    pieces: list
    style: str = "prompt"
    kind = "text"

    def __post_init__(self) -> None:
        _check_choice("style", self.style, TEXT_STYLES)

    def to_json(self) -> dict:
        return super().to_json() | {"style": self.style, "pieces": [_piece_json(p) for p in self.pieces]}


@dataclass(frozen=True)
class Fields(Block):
    rows: list[Field]
    kind = "fields"

    def to_json(self) -> dict:
        return super().to_json() | {"rows": [r.to_json() for r in self.rows]}


@dataclass(frozen=True)
class Outputs(Block):
    rows: list[Output]
    kind = "outputs"

    def to_json(self) -> dict:
        rows = [
            {"model": r.model, "text": r.text, "right": r.right, "label": r.label,
             "fields": [f.to_json() for f in r.fields]}
            for r in self.rows
        ]  # fmt: skip
        return super().to_json() | {"rows": rows}


@dataclass(frozen=True)
class Bars(Block):
    bars: list[Bar]
    decimals: int = DECIMALS
    kind = "bars"

    def to_json(self) -> dict:
        bars = [
            {"label": b.label, "value": b.value, "text": number(b.value, self.decimals), "colour": b.colour,
             "emphasis": b.emphasis, "note": b.note}
            for b in self.bars
        ]  # fmt: skip
        return super().to_json() | {"bars": bars}


@dataclass(frozen=True)
class Chart(Block):
    categories: list[str]
    series: list[Series]
    decimals: int = DECIMALS
    kind = "chart"

    def __post_init__(self) -> None:
        for s in self.series:
            _check_colour(s.colour)
            if len(s.values) != len(self.categories):
                raise ValueError(f"series {s.name!r} has {len(s.values)} values for {len(self.categories)} categories")

    def to_json(self) -> dict:
        series = [
            {"name": s.name, "colour": s.colour, "values": [float(v) for v in s.values],
             "texts": [number(v, self.decimals) for v in s.values]}
            for s in self.series
        ]  # fmt: skip
        return super().to_json() | {"categories": list(self.categories), "series": series}


@dataclass(frozen=True)
class Labels(Block):
    sequence: list[int]  # indexes into names, in order
    names: list[str]
    kind = "labels"

    def __post_init__(self) -> None:
        if any(not 0 <= i < len(self.names) for i in self.sequence):
            raise ValueError(f"a label index is outside the {len(self.names)} names")

    def to_json(self) -> dict:
        return super().to_json() | {"sequence": list(self.sequence), "names": list(self.names)}


@dataclass(frozen=True)
class Notice(Block):
    text: str
    level: str = "warning"
    kind = "notice"

    def __post_init__(self) -> None:
        _check_choice("level", self.level, NOTICE_LEVELS)

    def to_json(self) -> dict:
        return super().to_json() | {"text": self.text, "level": self.level}


@dataclass(frozen=True)
class Section(Block):
    blocks: list[Block]
    right: bool | None = None  # a mark after the title: right (True), wrong (False), or none
    kind = "section"

    def to_json(self) -> dict:
        return super().to_json() | {"right": self.right, "blocks": [b.to_json() for b in self.blocks]}


@dataclass(frozen=True)
class Document:
    """One sample's view: blocks shown in order below the page's own comparison of the models' records."""

    blocks: list[Block]

    def to_json(self) -> dict:
        return {"blocks": [b.to_json() for b in self.blocks]}


@dataclass(frozen=True)
class Listing:
    """Which record columns the viewer's sample list and comparison table show for each record: the model's
    `answer`, what was `expected`, and the `outcome` column (True right, False wrong). None: the task has no such
    column (the list then shows the task's summary value)."""

    answer: str | None = "output"
    expected: str | None = "expected"
    outcome: str | None = "correct"
