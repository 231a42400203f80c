"""Attention segments and per-map shares: what the attention analyses share.

A prompt's key positions are cut into SEGMENTS; the backend gives, per layer and head, the softmax weight each
segment receives in the query rows (never a T×T map). A baseline has one softmax map per head; a DIFF model's maps
split as its variant pairs heads into map 1, map 2 and the differential map A1 − λ·A2 (whose rows sum to 1 − λ).
The headline map is the differential one for DIFF models and the softmax one for baselines. Only layers that attend
over the whole context are read (`layer_kinds.analysis_layers`): a hybrid's record lists the layers it skipped, Mamba,
gated memory and sliding-window layers (`skipped_layers`, models/layer_kinds.py), its per-layer values are those of
the other layers, in order, and its tables name the skipped layers in a note.
"""

from __future__ import annotations

from collections.abc import Callable
from types import GenericAlias
from typing import TYPE_CHECKING, Any

from diffeval.errors import InputError
from diffeval.models.backend import Backend
from diffeval.models.layer_kinds import analysed_layers, analysis_layers, attention_layers, kinds, skipped_text
from diffeval.models.variants import registry as variants
from diffeval.models.variants.base import PER_TOKEN
from diffeval.records import Sized
from diffeval.tasks.base import RunContext
from diffeval.tasks.blocks import Block, Chart, Document, Section, Series

if TYPE_CHECKING:  # annotations only: heavy libraries load inside the functions that use them (a fast CLI)
    import pandas as pd

SEGMENTS = ("answer", "needles", "noise", "scaffold", "sink")
HEADLINE_MAP = {True: "diff", False: "softmax"}
# every map's per-layer shares of every segment, as the segment table, per-layer table and view read them
MAP_SHARES = {segment: Sized(list[float], "attending layers", "layer") for segment in (*SEGMENTS, "row_sum")}
MAPS_SCHEMA = GenericAlias(dict, (str, MAP_SHARES))  # a record's `shares`, {map: MAP_SHARES}, as its schema reads it
SEGMENT_COLOURS = {  # the viewer's chart colours
    "answer": "#d62728", "needles": "#ff7f0e", "noise": "#7f7f7f", "scaffold": "#1f77b4", "sink": "#9467bd",
}  # fmt: skip

MapShares = dict[str, dict[str, list[float]]]  # {map: {segment or row_sum: [per-layer mean over heads and rows]}}


def measure(backend: Backend, ids: list[int], rows: list[int], segment_ids: list[int]) -> tuple[MapShares, dict]:
    """Every map's per-layer shares of every segment in `rows`, and the headline map's."""
    shares, row_lambdas = backend.attention_rows(ids, rows, segment_ids, len(SEGMENTS))
    if backend.info.layer_kinds:  # the backend gives every attending layer; the analyses read the whole-context ones
        layers = kinds(backend.info)
        attending = attention_layers(layers)
        keep = [attending.index(index) for index in analysis_layers(layers)]
        shares = shares[keep]
        row_lambdas = None if row_lambdas is None else row_lambdas[keep]
    maps = per_map_shares(shares, backend.info, row_lambdas)
    return maps, maps[HEADLINE_MAP[backend.info.is_diff]]


def per_map_shares(shares: Any, info: Any, row_lambdas: Any = None) -> MapShares:
    """(layers, heads, rows, segments) array over the layers analysed → {map: {segment or row_sum: [per-layer
    mean over heads and rows]}}. A DIFF model's maps split as its variant pairs heads (its record, models/variants/),
    with the layer's λ (V1: heads i and i + H/2) or each row's (V2: adjacent query heads)."""
    variant = variants.by_name(info.diff_variant) if info.is_diff else None
    if info.is_diff and variant is None:
        raise InputError(
            f"model {info.name} is declared DIFF (:diff) but is no variant diffeval knows, so its maps cannot be split "
            "into A1 and A2: run the attention analysis on it as :base, or add its variant (docs/contributing.md)"
        )
    split = variant.code(variant.split_maps) if variant else None
    # the decoder index of each captured layer, by which a layer's λ is found (a ModelInfo that lists no kinds: all)
    layers = analysis_layers(kinds(info)) if info.layer_kinds else range(len(shares))
    # λ by decoder index: a hybrid's table lists its DIFF layers only
    layer_lambda = {row["layer"]: row["lambda"] for row in info.lambdas}
    per_layer_maps = []
    for position, (layer, layer_shares) in enumerate(zip(layers, shares, strict=True)):
        if variant is None or split is None:
            per_layer_maps.append({"softmax": layer_shares})
        elif variant.lambda_form == PER_TOKEN:
            per_layer_maps.append(split(layer_shares, row_lambdas[position]))
        else:
            per_layer_maps.append(split(layer_shares, layer_lambda[layer]))
    out: MapShares = {}
    for name in per_layer_maps[0]:
        means = [maps[name].mean(axis=(0, 1)) for maps in per_layer_maps]  # (segments,) per layer
        out[name] = {seg: [round(float(m[i]), 8) for m in means] for i, seg in enumerate(SEGMENTS)}
        out[name]["row_sum"] = [round(float(m.sum()), 8) for m in means]
    return out


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def segment_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean raw and normalised share of every segment, per model and map."""
    import pandas as pd

    rows = []
    for model, group in frame.groupby("model", sort=False):
        for name in group["shares"].iloc[0]:
            per_sample = [{k: mean(v) for k, v in shares[name].items()} for shares in group["shares"]]
            means = pd.DataFrame(per_sample).mean()
            row = {"model": model, "map": name, "row_sum": means["row_sum"]}
            row.update({f"{seg} raw": means[seg] for seg in SEGMENTS})
            row.update({f"{seg} normalised": means[seg] / means["row_sum"] for seg in SEGMENTS})
            rows.append(row)
    return pd.DataFrame(rows).set_index(["model", "map"]).round(4)


def segments_out(frame: pd.DataFrame) -> pd.DataFrame:
    """The segment table with each row's records (its model) marked for the viewer."""
    from diffeval.tasks.base import with_cells

    segments = segment_table(frame)
    return with_cells(segments, [{"model": m} for m, _ in segments.index], [{}] * segments.shape[1])


SEGMENTS_TITLE = "Share of every segment per map (raw and / row sum)"


def check_capturable(context: RunContext[Any], check_data: Callable[[], None] | None = None) -> None:
    """Before any work: the samples' data reads (`check_data`), and every model's architecture is one the analysis
    can capture."""
    from diffeval.models.capture import check_supported
    from diffeval.models.checkpoints.loading import load_config

    if check_data is not None:
        check_data()
    for spec in context.models:
        check_supported(load_config(spec, context.trust_remote_code).model_type)


def sample_view(context: RunContext[Any], records: dict[str, dict], tokenizer_for: Callable[[str], Any],
                full_text: bool | None) -> Document:  # fmt: skip
    """For `diffeval view`: per model, a chart per attention map of every segment's share, layer by layer, from the
    records alone."""
    sections: list[Block] = []
    for model, record in records.items():
        charts: list[Block] = []
        for name, shares in (record.get("shares") or {}).items():
            layers = analysed_layers(len(shares["answer"]), record.get("skipped_layers") or {})
            series = [Series(segment, shares[segment], SEGMENT_COLOURS[segment]) for segment in SEGMENTS]
            charts.append(Chart([f"L{i}" for i in layers], series, title=name, model=model))
        rows = ", ".join(str(r) for r in record.get("rows") or [])
        skipped = skipped_text(record.get("skipped_layers") or {})
        title = f"{model}: attention shares per layer, query rows {rows}" + (f"; {skipped}" if skipped else "")
        sections.append(Section(charts, title=title, model=model))
    return Document(sections)
