"""Every plot a task draws, and the toy pair's loss curves, stay legible from 1 to 12 columns and from 1 to 4 models:
drawn at their saved size, no two texts (titles, tick labels, axis labels, legend and colorbar labels, cell values)
overlap, none runs into another panel's plotting area and none runs outside the figure.

The records are synthetic, in each task's record schema (checked with `record_problem`): a deterministic fixture
with the shape of a run, not a model result. "Columns" is the axis a task's table or figure grows along: context
lengths (needle and the probes), depths (attention), dataset × shot columns (icl), datasets (hallucination),
positions (nll), bit widths (quantize).
"""

from __future__ import annotations

import types
from itertools import product
from pathlib import Path
from typing import Any, get_args, get_origin

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text

from diffeval.records import ENVELOPE_SCHEMA, MayBeAbsent, Sized, record_problem
from diffeval.tasks import TASKS
from diffeval.toy.plot import plot_losses

MODELS = ["diff", "base", "toy-diff2", "SmolLM2-135M-Instruct"]
DEPTHS = [0, 25, 50, 75, 100]
PLOTTED = [name for name, task in TASKS.items() if task.reporting.plots is not None]


def _filled(kind: Any) -> Any:
    """A value of a record-schema kind, for the fields a fixture does not vary."""
    if isinstance(kind, Sized):  # a fixed length is filled; a length the run sets, VARIED's builder gives
        return [_filled(get_args(kind.kind)[0])] * kind.length if isinstance(kind.length, int) else []
    if isinstance(kind, dict):
        return {key: _filled(inner) for key, inner in kind.items() if not isinstance(inner, MayBeAbsent)}
    if isinstance(kind, types.UnionType):
        return _filled(next(k for k in get_args(kind) if k is not type(None)))
    origin = get_origin(kind) or kind
    return {str: "x", int: 1, float: 0.5, bool: True, list: [], dict: {}}[origin]


def _rows(task: str, models: int, columns: int) -> list[dict]:
    """Records of `models` models over `columns` columns, each row completed to the task's schema and checked."""
    schema = {**ENVELOPE_SCHEMA, **TASKS[task].scoring.record_schema}
    base = {name: _filled(kind) for name, kind in schema.items() if not isinstance(kind, MayBeAbsent)}
    assert task in VARIED, f"{task} draws plots: give tests/test_plots.py a builder of its records in VARIED"
    rows = []
    for m, model in enumerate(MODELS[:models]):
        for i, fields in enumerate(VARIED[task](m, columns)):
            own = {k: v for k, v in fields.items() if k in schema}  # needle and the probes share one builder
            row = {**base, "model": model, "sample_id": f"{task}-{i}", **own}
            assert record_problem(row, schema) is None, record_problem(row, schema)
            rows.append(row)
    return rows


def _score(*keys: int) -> float:
    """A deterministic score in [0, 1] that differs from cell to cell."""
    return (sum((k + 1) * p for k, p in zip(keys, (7, 13, 29, 31))) % 11) / 10


def _haystack(m: int, columns: int) -> list[dict]:
    """needle and the probes: lengths 1K, 2K, 4K, … by depth, two settings (N/R), two samples a cell."""
    return [
        {"ctx": 1024 * 2**c, "depth": depth, "needles": n, "queries": n, "setting": f"N/R={n}/{n}",
         "score": float(_score(m, c, d, n, s) > 0.45), "correct": _score(m, c, d, n, s) > 0.45}
        for c, (d, depth), n, s in product(range(columns), enumerate(DEPTHS), (1, 2), range(2))
    ]  # fmt: skip


def _attention(m: int, columns: int) -> list[dict]:
    layers = 6
    shares = {
        part: [_score(m, layer, k) / 4 for layer in range(layers)]
        for k, part in enumerate(("answer", "needles", "noise", "scaffold", "sink", "row_sum"))
    }
    return [
        {"is_diff": m % 2 == 0, "depth": depth, "answer_share": _score(m, c) / 10, "noise_share": _score(m, c, 1) / 4,
         "shares": {"diff": shares, "softmax": shares}}
        for c, depth in enumerate(np.linspace(0, 100, columns).round().astype(int).tolist())
    ]  # fmt: skip


def _icl(m: int, columns: int) -> list[dict]:
    settings = list(product(("trec", "banking77"), (4, 16, 64, 256, 1024, 4096)))[:columns]
    return [
        {"dataset": dataset, "shots": shots, "order": order, "order_seed": seed, "status": "ok",
         "score": _score(m, c, o, seed), "correct": _score(m, c, o, seed) > 0.5}
        for c, (dataset, shots) in enumerate(settings)
        for (o, order), seed in product(enumerate(("random", "grouped")), range(3))
    ]  # fmt: skip


def _hallucination(m: int, columns: int) -> list[dict]:
    return [
        {"dataset": f"dataset-{c}", "score": _score(m, c, s), "verdict": _score(m, c, s) > 0.5, "judge_kind": "proxy"}
        for c, s in product(range(columns), range(2))
    ]


def _nll(m: int, columns: int) -> list[dict]:
    """Two books of two 4K windows, each cut into `columns` position buckets."""
    return [
        {"group": f"book-{doc}", "ctx": 4096, "bytes": 16_000, "ids_sha": f"{doc}-{window}",
         "token_nll": [1000 * (1 + _score(m, c, doc)) for c in range(columns)],
         "token_counts": [4096 // columns] * columns,
         "byte_nll": [3000 * (1 + _score(m, c, doc)) for c in range(columns)],
         "bucket_bytes": [16_000 // columns] * columns}
        for doc, window in product(range(2), range(2))
    ]  # fmt: skip


def _quantize(m: int, columns: int) -> list[dict]:
    bits = [16, 14, 12, 10, 8, 7, 6, 5, 4, 3, 2, 1][:columns]
    return [
        {"lm_task": lm_task, "bits": b, "acc": _score(m, c, t), "acc_norm": _score(m, c, t, 1)}
        for (t, lm_task), (c, b) in product(enumerate(("hellaswag", "arc_easy")), enumerate(bits))
    ]


VARIED = {  # task → (model number, columns) → the fields each of that model's records varies
    **dict.fromkeys(("needle", "mk-niah", "mv-niah", "vt", "cwe", "nolima"), _haystack),
    "attention": _attention,
    "icl": _icl,
    "hallucination": _hallucination,
    "nll": _nll,
    "quantize": _quantize,
}


def _illegible(fig: Figure) -> list[str]:
    """Draw the figure and name every text that overlaps another text, runs into a panel not its own or leaves the
    figure."""
    drawn: list[Text] = []
    original = Text.draw

    def draw(self, renderer):
        if self.get_visible() and self.get_text().strip():
            drawn.append(self)
        return original(self, renderer)

    Text.draw = draw
    try:
        fig.canvas.draw()
    finally:
        Text.draw = original
    renderer = fig.canvas.get_renderer()
    boxes = [text.get_window_extent(renderer).padded(-0.5) for text in drawn]  # touching is not overlapping
    page = fig.bbox.padded(1)
    problems = [f"{text.get_text()!r} runs outside the figure" for text, box in zip(drawn, boxes)
                if not (page.contains(box.x0, box.y0) and page.contains(box.x1, box.y1))]  # fmt: skip
    for i, j in zip(*np.triu_indices(len(drawn), 1)):
        if boxes[i].overlaps(boxes[j]):
            problems.append(f"{drawn[i].get_text()!r} overlaps {drawn[j].get_text()!r}")
    for text, box in zip(drawn, boxes):  # a panel's labels stay out of its neighbours' plotting areas
        problems.extend(
            f"{text.get_text()!r} runs into panel {k} ({ax.get_title()!r})"
            for k, ax in enumerate(fig.axes)
            if ax is not text.axes and box.overlaps(ax.bbox)
        )
    return problems


@pytest.fixture
def checked_figures(monkeypatch):
    """Each figure saved, checked as drawn at its saved size: (file name, what is illegible in it)."""
    checked: list[tuple[str, list[str]]] = []
    savefig = Figure.savefig

    def check_then_save(fig, path, *args, **kwargs):
        assert "bbox_inches" not in kwargs, f"{path}: a cropped figure is not the one checked here"
        checked.append((Path(path).name, _illegible(fig)))
        return savefig(fig, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", check_then_save)
    return checked


def _quick_start(task: str, models: int, columns: int) -> bool:
    """The quick start's shape (one length, the built-in pair) stays in the fast tier; the rest of the grid is slow."""
    return task == "needle" and models == 2 and columns == 1


@pytest.mark.parametrize(
    ("task", "models", "columns"),
    [
        pytest.param(task, models, columns, marks=() if _quick_start(task, models, columns) else pytest.mark.slow)
        # the corners of 1–4 models × 1–12 columns, and the quick start's shape (CI time: the middle adds little)
        for task, models, columns in sorted({*product(PLOTTED, (1, 4), (1, 12)), ("needle", 2, 1)})
    ],
)
def test_every_plot_stays_legible(task, models, columns, checked_figures, tmp_path):
    frame = pd.DataFrame.from_records(_rows(task, models, columns))
    written = TASKS[task].reporting.plots(frame, tmp_path)
    assert [path.name for path in written] == [name for name, _ in checked_figures]
    assert all(path.stat().st_size > 0 for path in written)
    illegible = {name: problems for name, problems in checked_figures if problems}
    assert not illegible, illegible


@pytest.mark.slow  # the fast tier keeps the quick start's heatmap
@pytest.mark.parametrize("models", [1, 2, 4])
def test_the_loss_curves_stay_legible(models, checked_figures, tmp_path):
    logs = {}
    for m, model in enumerate(MODELS[:models]):
        steps = np.arange(0, 3000, 10)
        frame = pd.DataFrame({"step": steps, "length": 256 * 2 ** (steps // 1000), "loss": 3 / (1 + steps / 500 + m),
                              "answer_loss": 5 / (1 + steps / 300 + m)})  # fmt: skip
        logs[model] = str(tmp_path / f"{model}.csv")
        frame.to_csv(logs[model], index=False)
    plot_losses(logs, tmp_path / "loss_curves.png")
    assert checked_figures and not checked_figures[0][1], checked_figures
