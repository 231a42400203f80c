"""What a DIFF-variant record is: the `Variant` fields every "which variant" question reads, and the `Layer` kinds a
record describes a model's layers with.

A record names its code by "module:attribute" strings, imported only when used, so reading a record imports no torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

PER_LAYER = "per layer"  # λ = exp(λq1·λk1) − exp(λq2·λk2) + λ_init, one value per layer
PER_TOKEN = "per token"  # λ = sigmoid(W_λ·x), one value per token and differential head

# what a layer mixes tokens with (vLLM's hybrid models declare their per-layer state the same way)
ATTENTION = "attention"  # softmax attention
DIFF_ATTENTION = "DIFF attention"  # two softmax maps subtracted
STATE_SPACE = "state-space mixer"  # Mamba: a fixed-size state per sequence, no KV cache
GATED_MEMORY = "gated memory"  # a gated unit that reads another layer's memory instead of attending
MIXERS = (ATTENTION, DIFF_ATTENTION, STATE_SPACE, GATED_MEMORY)

# the forms of DIFF attention
DIFF_V1_FORM = "V1"  # λ per layer, two maps per head over a double-width value, a per-head norm
DIFF_V2_FORM = "V2"  # λ per token, adjacent query heads subtracted, no norm
GROUPED_FORM = "grouped"  # V1 with groups of signal heads sharing one noise head (grouped differential attention)
DIFF_FORMS = (DIFF_V1_FORM, DIFF_V2_FORM, GROUPED_FORM)


@dataclass(frozen=True)
class Layer:
    """What one decoder layer is, as far as attention analyses and cache sizes care."""

    mixer: str  # one of MIXERS
    diff_form: str | None = None  # one of DIFF_FORMS, for DIFF attention only
    window: int | None = None  # a sliding window's width in tokens; None: full attention
    kv_from: int | None = None  # the layer whose KV cache this one reads (it keeps none of its own)
    kv_caches: int = 1  # K and V sets per token on vLLM against a softmax layer with the same KV heads and head_dim
    state_elements: int = 0  # a state-space layer's state per sequence (conv + SSM), in elements
    memory_from: int | None = None  # a gated memory layer: the layer whose output it gates (SambaY's memory)

    @property
    def attends(self) -> bool:
        """Whether the layer has attention maps the analyses read (its own or over a reused cache)."""
        return self.mixer in (ATTENTION, DIFF_ATTENTION)

    @property
    def cached_kv(self) -> int:
        """K and V sets this layer adds to the KV cache per token (0: none, or another layer's)."""
        return self.kv_caches if self.attends and self.kv_from is None else 0

    def describe(self) -> str:
        """How `models inspect` and the analyses' tables name the layer: "DIFF attention (V1), full"."""
        what = f"{self.mixer} ({self.diff_form})" if self.diff_form else self.mixer
        if self.attends:
            what += f", sliding {self.window}" if self.window else ", full"
        if self.kv_from is not None:
            what += f", reuses layer {self.kv_from}'s KV"
        if self.memory_from is not None:
            what += f", gates layer {self.memory_from}'s output"
        return what


@dataclass(frozen=True)
class Variant:
    name: str  # as run.json and records store it ("v1", "v2")
    title: str  # as `models inspect` and the docs show it
    architectures: tuple[str, ...]  # config.json `architectures` entries that select it
    model_types: tuple[str, ...]  # config.json `model_type` values that select it
    head_layout: str  # how query heads pair into differential heads, and what the KV heads hold
    lambda_form: str  # PER_LAYER or PER_TOKEN
    norm: str  # what follows the subtraction
    layers: str  # "module:function(config) → tuple[Layer, ...]": every decoder layer's kind, in order
    split_maps: str  # "module:function" (head shares, λ of the layer or of the rows) → {"A1", "A2", "diff"}
    # the parity suites' checkpoints (tests/test_parity.py, tests/test_vllm.py): "module:function(shape, tokenizer_dir,
    # out_dir) → Path" saves a random checkpoint of the named shape around the tokenizer in tokenizer_dir, the same one
    # on every call (each shape carries its seed), with head_dim 32 or 64 (vLLM's CPU attention) and every weight
    # random, norms and λ included; fixture_shapes names the shapes the suites run (each a head layout worth
    # checking, the first also through the command line), so a registered variant gets every suite
    fixture: str | None = None
    fixture_shapes: tuple[str, ...] = ()
    vllm_model: str | None = None  # "module:Class" diffeval's vLLM plugin registers for `architectures[0]`
    vllm_eager: bool = False  # its vLLM model runs without CUDA graphs: it has not run under them on a GPU
    register_hf: str | None = None  # "module:function" teaching transformers' Auto classes the architecture
    check_folder: str | None = None  # "module:function(spec)": refuse, before the config is read, a layout never run
    # "module:function(spec, config, given)": config keys that must hold honourable values (`given`: the keys
    # config.json holds, before transformers fills in its defaults)
    check_config: str | None = None
    layout_hint: str | None = None  # "module:function(missing, unexpected) → str | None": what mismatched weights are
    after_load: str | None = None  # "module:function(model, config)": what transformers' class leaves undone
    inspect_lambdas: str | None = None  # "module:function(model[, ids])": the λ table `models inspect` prints
    paired_with: tuple[str, ...] = ()  # variants a run pairs it with, beside the baselines (V2 against V1)

    def code(self, target: str | None) -> Any:
        """The object a "module:attribute" field names (None for an unset field)."""
        return load(target)


def load(target: str | None) -> Any:
    """The object a "module:attribute" string names (None for None)."""
    if target is None:
        return None
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)
