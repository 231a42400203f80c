"""What the layer kinds (models/variants/base.py `Layer`, one per decoder layer, in `ModelInfo.layer_kinds`) mean for
the code that reads them: which layers the attention instruments read, how a record and a table name those they skip,
the layer pattern `models inspect` prints, and what one sequence keeps in vLLM's cache.

Outliers' attention logits and quantize's quantized logits read every layer whose kind attends: a state-space (Mamba)
or gated-memory layer has no attention map. The attention analyses read the layers that attend over the whole context
(`analysis_layers`): a model that also has sliding-window layers (Phi-4-mini-flash's self-decoder) is read at its
full and cross-decoder layers, and its sliding layers are listed as skipped. Records stay as they were for a model
whose layers all attend; a hybrid's records add `skipped_layers`, {decoder index: kind}, and its tables a note.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from diffeval.errors import InputError
from diffeval.models.spec import ModelInfo
from diffeval.models.variants.base import Layer


def kinds(info: ModelInfo) -> tuple[Layer, ...]:
    """The model's layers as `Layer`s (empty for a ModelInfo that lists none)."""
    return tuple(Layer(**kind) for kind in info.layer_kinds)


def attention_layers(layers: Sequence[Layer]) -> list[int]:
    return [index for index, layer in enumerate(layers) if layer.attends]


def analysis_layers(layers: Sequence[Layer]) -> list[int]:
    """The layers the attention analyses read: those that attend over the whole context. Where every attending layer
    slides (a Mistral), all of them: its window is its context."""
    attending = attention_layers(layers)
    return [index for index in attending if layers[index].window is None] or attending


def skipped_layers(layers: Sequence[Layer], read: Sequence[int] | None = None) -> dict[str, str]:
    """{decoder index: what the layer is} of every layer an instrument does not read (by default: every layer without
    attention), as a record stores it."""
    read = attention_layers(layers) if read is None else read
    return {str(index): layer.describe() for index, layer in enumerate(layers) if index not in read}


def record_fields(info: ModelInfo, whole_context: bool = False) -> dict[str, Any]:
    """What an attention instrument's record adds: the layers it skipped, only where there are some. `whole_context`:
    the attention analyses', which skip sliding-window layers too (`analysis_layers`)."""
    layers = kinds(info)
    skipped = skipped_layers(layers, analysis_layers(layers) if whole_context else None)
    return {"skipped_layers": skipped} if skipped else {}


def analysed_layers(count: int, skipped: Mapping[str, str]) -> list[int]:
    """The decoder index of each of a record's `count` per-layer values: every layer but the skipped ones."""
    return [index for index in range(count + len(skipped)) if str(index) not in skipped]


def format_layers(indices: Iterable[int]) -> str:
    """ "layer 4", "layers 0, 2", "layers 0–3, 5–11": runs of consecutive layers joined by an en dash."""
    ordered = sorted(indices)
    runs: list[list[int]] = []
    for index in ordered:
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    text = ", ".join(f"{run[0]}–{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)
    return f"layer{'s' if len(ordered) > 1 else ''} {text}"


def skipped_text(skipped: Mapping[str, str]) -> str:
    """ "layers 0, 2 skipped: state-space mixer" for a record's `skipped_layers`, one clause per kind ("" for none)."""
    by_kind: dict[str, list[int]] = {}
    for index, kind in skipped.items():
        by_kind.setdefault(kind, []).append(int(index))
    return "; ".join(f"{format_layers(indices)} skipped: {kind}" for kind, indices in by_kind.items())


def skipped_note(by_model: Mapping[str, Mapping[str, str]]) -> str | None:
    """A table's note on the layers its models skipped, by kind: "model j: layers 0, 2 skipped: state-space mixer";
    None where no model skipped any."""
    parts = [f"model {model}: {skipped_text(skipped)}" for model, skipped in by_model.items() if skipped]
    return "; ".join(parts) or None


def check_attends(model: str, layers: Sequence[Layer], instrument: str) -> None:
    """Refuse, before any work, a model none of whose layers attends: `instrument` would have nothing to read."""
    if layers and not attention_layers(layers):
        pattern = "; ".join(f"{span}: {layer.describe()}" for span, layer in layer_runs(layers))
        raise InputError(
            f"model {model} has no attention layer ({pattern}): {instrument} reads attention layers only; run it on "
            "a model that has some"
        )


def check_captured(info: ModelInfo, seen: Iterable[int], instrument: str) -> None:
    """The layers an instrument saw through transformers' attention interface are those whose kind attends; where
    they differ the model attends some other way (or a kind is wrong), and its numbers would be false."""
    expected = attention_layers(kinds(info))
    found = sorted(set(seen))
    if info.layer_kinds and found != expected:
        saw = format_layers(found) if found else "no layer"
        raise InputError(
            f"model {info.name}: {instrument} saw attention in {saw} through transformers' attention interface, "
            f"but its layer kinds say {format_layers(expected)} attend: it cannot be measured truthfully, so run "
            "it on another model"
        )


def layer_runs(layers: Sequence[Layer]) -> list[tuple[str, Layer]]:
    """Runs of identical consecutive layers, as `models inspect` prints the layer pattern: ("layers 0–1", layer)."""
    runs: list[tuple[list[int], Layer]] = []
    for index, layer in enumerate(layers):
        if runs and runs[-1][1] == layer:
            runs[-1][0].append(index)
        else:
            runs.append(([index], layer))
    return [(format_layers(indices), layer) for indices, layer in runs]


def cache_text(layer: Layer) -> str:
    """What a layer keeps in vLLM's cache, as `models inspect` prints it."""
    if layer.state_elements:
        return f"state: {layer.state_elements:,} elements per sequence"
    if layer.kv_from is not None:
        return f"none: reads layer {layer.kv_from}'s"
    if layer.cached_kv:
        return f"{layer.cached_kv} K,V set{'s' if layer.cached_kv > 1 else ''} per token"
    return "none"


def sequence_cache_bytes(layers: Sequence[Layer], tokens: int, kv_heads: int, head_dim: int, width: int) -> int:
    """What one sequence of `tokens` tokens keeps in vLLM's cache: per token, K and V for each set a layer keeps (a
    DiffLlama layer's two, a softmax or V2 layer's one, none for a Mamba layer or one reading another layer's KV), of
    `kv_heads` × `head_dim` elements; and once per sequence, each state-space layer's state. `width`: bytes per
    element."""
    kv_sets = sum(layer.cached_kv for layer in layers)
    return kv_sets * 2 * kv_heads * head_dim * width * tokens + sum(layer.state_elements for layer in layers) * width
