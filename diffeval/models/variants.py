"""The DIFF-variant registry: one record per Differential Transformer variant diffeval runs.

Every question of the form "which DIFF variant is this, and what does that mean here" reads a record: how a config is
recognised (architectures, model types), how its heads pair, the form of its λ, its norm, its KV cache on vLLM
against a baseline of the same KV heads, how the attention analysis splits its maps into A1 and A2, and what `models
inspect` shows. Nothing outside this module compares a variant's name, architecture or model type.

Code is named by "module:attribute" strings and imported only when used, so reading the registry imports no torch.
Adding a variant is one record here plus its engine modules (see docs/contributing.md).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

PER_LAYER = "per layer"  # λ = exp(λq1·λk1) − exp(λq2·λk2) + λ_init, one value per layer
PER_TOKEN = "per token"  # λ = sigmoid(W_λ·x), one value per token and differential head


@dataclass(frozen=True)
class Variant:
    name: str  # as run.json and records store it ("v1", "v2")
    title: str  # as `models inspect` and the docs show it
    architectures: tuple[str, ...]  # config.json `architectures` entries that select it
    model_types: tuple[str, ...]  # config.json `model_type` values that select it
    head_layout: str  # how query heads pair into differential heads, and what the KV heads hold
    lambda_form: str  # PER_LAYER or PER_TOKEN
    norm: str  # what follows the subtraction
    vllm_kv_factor: int  # KV cache bytes against a baseline with the same layers, KV heads and head_dim
    split_maps: str  # "module:function" (head shares, λ of the layer or of the rows) → {"A1", "A2", "diff"}
    vllm_model: str | None = None  # "module:Class" diffeval's vLLM plugin registers for `architectures[0]`
    register_hf: str | None = None  # "module:function" teaching transformers' Auto classes the architecture
    check_config: str | None = None  # "module:function(spec, config)": config keys that must hold honourable values
    after_load: str | None = None  # "module:function(model, config)": what transformers' class leaves undone
    inspect_lambdas: str | None = None  # "module:function(model[, ids])": the λ table `models inspect` prints
    paired_with: tuple[str, ...] = ()  # variants a run pairs it with, beside the baselines (V2 against V1)

    def code(self, target: str | None) -> Any:
        """The object a "module:attribute" field names (None for an unset field)."""
        if target is None:
            return None
        module, _, attribute = target.partition(":")
        return getattr(importlib.import_module(module), attribute)


DIFF_V1 = Variant(
    name="v1",
    title="DIFF V1 (DiffLlama)",
    architectures=("DiffLlamaForCausalLM",),
    model_types=("diffllama",),
    head_layout="H heads: head i pairs map i with map i + H/2 over a double-width value (transformers' DiffLlama)",
    lambda_form=PER_LAYER,
    norm="RMSNorm over 2·head_dim per head, × (1 − λ_init); axolotl's sublayer_norm: false drops the norm",
    vllm_kv_factor=2,  # models/vllm_diffllama.py keeps K and V twice (one attention per map)
    split_maps="diffeval.models.diff:split_differential",
    vllm_model="diffeval.models.vllm_diffllama:DiffLlamaForCausalLM",
    check_config="diffeval.models.loading:check_diff_keys",
    after_load="diffeval.models.loading:honour_sublayer_norm",
    inspect_lambdas="diffeval.models.diff:layer_lambdas",
)
DIFF_V2 = Variant(
    name="v2",
    title="DIFF V2 (DiffLlama2)",
    architectures=("DiffLlama2ForCausalLM",),
    model_types=("diffllama2",),
    head_layout="2h query heads over h_kv KV heads: differential head i is query head 2i minus query head 2i + 1",
    lambda_form=PER_TOKEN,
    norm="none: the h heads go to o_proj as they are",
    vllm_kv_factor=1,  # one attention with 2h query heads over a baseline's KV heads
    split_maps="diffeval.models.diff:split_differential_v2",
    vllm_model="diffeval.models.vllm_diffllama2:DiffLlama2ForCausalLM",
    register_hf="diffeval.models.diffllama2:register",
    inspect_lambdas="diffeval.models.diff:v2_layer_lambdas",
    paired_with=("v1",),
)
MOTIF = Variant(
    name="motif",
    title="DIFF V1 (Motif)",
    architectures=("MotifForCausalLM",),
    model_types=("Motif", "motif"),  # Motif's configuration module writes "Motif"; converted copies use "motif"
    head_layout="N heads: adjacent heads (2i, 2i + 1) pair into map 1 and map 2 over their KV pair's double-width "
    "value (Motif-2.6B); with num_noise_heads, groups of R signal heads then one noise head shared by them "
    "(grouped differential attention, Motif-2-12.7B)",
    lambda_form=PER_LAYER,
    norm="subln: RMSNorm over 2·head_dim with a learned weight, × (1 − λ_init); λ_init from layer index − 1",
    vllm_kv_factor=2,  # models/vllm_motif.py: 4 attentions (signal, noise × even, odd values) over N_kv/2 pairs
    split_maps="diffeval.models.diff:split_differential",  # the attention call sees DiffLlama's layout (motif_maps)
    vllm_model="diffeval.models.vllm_motif:MotifForCausalLM",
    register_hf="diffeval.models.motif:register",
    check_config="diffeval.models.loading:check_motif_keys",
    inspect_lambdas="diffeval.models.diff:layer_lambdas",
)
VARIANTS: tuple[Variant, ...] = (DIFF_V1, DIFF_V2, MOTIF)

UNRECORDED = DIFF_V1  # run folders written before run.json named a model's variant hold V1 models only


def variant_of(config) -> Variant | None:
    """The variant a transformers config builds (by its architectures, then its model type), or None: a baseline."""
    architectures = getattr(config, "architectures", None) or []
    for variant in VARIANTS:
        if any(arch in variant.architectures for arch in architectures):
            return variant
    model_type = getattr(config, "model_type", None)
    return next((v for v in VARIANTS if model_type in v.model_types), None)


def by_name(name: str | None) -> Variant | None:
    """The variant a run folder or ModelInfo names; None for a baseline, a declared `:diff` model or an unknown name."""
    return next((v for v in VARIANTS if v.name == name), None)


def of_architecture(architecture: str | None) -> Variant | None:
    """The variant whose model class this is, whatever the run declared it (`:base` on a DiffLlama still runs
    DiffLlama's attention and cache)."""
    return next((v for v in VARIANTS if architecture in v.architectures), None)


def vllm_architectures() -> dict[str, str]:
    """architecture → "module:Class" of every variant diffeval's vLLM plugin registers."""
    return {v.architectures[0]: v.vllm_model for v in VARIANTS if v.vllm_model}


def model_types() -> tuple[str, ...]:
    return tuple(t for v in VARIANTS for t in v.model_types)


def register_hf() -> None:
    """Teach transformers' Auto classes every variant that is not transformers' own (idempotent)."""
    for variant in VARIANTS:
        register = variant.code(variant.register_hf)
        if register is not None:
            register()
