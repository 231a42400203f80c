"""The DIFF V2 record: diffeval's DiffLlama2 (the authors' January 2026 form)."""

from __future__ import annotations

from diffeval.models.variants.base import DIFF_ATTENTION, DIFF_V2_FORM, PER_TOKEN, Layer, Variant

DIFF_V2 = Variant(
    name="v2",
    title="DIFF V2 (DiffLlama2)",
    architectures=("DiffLlama2ForCausalLM",),
    model_types=("diffllama2",),
    head_layout="2h query heads over h_kv KV heads: differential head i is query head 2i minus query head 2i + 1",
    lambda_form=PER_TOKEN,
    norm="none: the h heads go to o_proj as they are",
    layers="diffeval.models.variants.diffllama2.record:layers",
    split_maps="diffeval.models.diff:split_differential_v2",
    fixture="diffeval.models.variants.diffllama2.fixture:build",
    fixture_shapes=("gqa", "mha"),
    vllm_model="diffeval.models.variants.diffllama2.vllm:DiffLlama2ForCausalLM",
    register_hf="diffeval.models.variants.diffllama2.modeling:register",
    layout_hint="diffeval.models.variants.diffllama2.checks:layout_hint",
    inspect_lambdas="diffeval.models.diff:v2_layer_lambdas",
    paired_with=("v1",),
)


def layers(config) -> tuple[Layer, ...]:
    """Every layer DIFF attention over the full context: one attention with 2h query heads over a baseline's KV."""
    return (Layer(DIFF_ATTENTION, diff_form=DIFF_V2_FORM),) * config.num_hidden_layers
