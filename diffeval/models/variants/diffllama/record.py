"""The DIFF V1 record: transformers' DiffLlama, the paper's model."""

from __future__ import annotations

from diffeval.models.variants.base import DIFF_ATTENTION, DIFF_V1_FORM, PER_LAYER, Layer, Variant

DIFF_V1 = Variant(
    name="v1",
    title="DIFF V1 (DiffLlama)",
    architectures=("DiffLlamaForCausalLM",),
    model_types=("diffllama",),
    head_layout="H heads: head i pairs map i with map i + H/2 over a double-width value (transformers' DiffLlama)",
    lambda_form=PER_LAYER,
    norm="RMSNorm over 2·head_dim per head, × (1 − λ_init); axolotl's sublayer_norm: false drops the norm",
    layers="diffeval.models.variants.diffllama.record:layers",
    split_maps="diffeval.models.diff:split_differential",
    fixture="diffeval.models.variants.diffllama.fixture:build",
    fixture_shapes=("gqa", "mha"),
    vllm_model="diffeval.models.variants.diffllama.vllm:DiffLlamaForCausalLM",
    check_folder="diffeval.models.variants.diffllama.checks:refuse_older_axolotl",
    check_config="diffeval.models.variants.diffllama.checks:check_diff_keys",
    layout_hint="diffeval.models.variants.diffllama.checks:layout_hint",
    after_load="diffeval.models.variants.diffllama.checks:honour_sublayer_norm",
    inspect_lambdas="diffeval.models.diff:layer_lambdas",
)


def layers(config) -> tuple[Layer, ...]:
    """Every layer DIFF attention over the full context; the vLLM model keeps K and V twice (one attention per map)."""
    layer = Layer(DIFF_ATTENTION, diff_form=DIFF_V1_FORM, kv_caches=2)
    return (layer,) * config.num_hidden_layers
