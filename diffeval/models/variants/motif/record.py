"""The Motif record: Motif-2.6B (DIFF V1 with PolyNorm) and Motif-2-12.7B (grouped differential attention)."""

from __future__ import annotations

from diffeval.models.variants.base import DIFF_ATTENTION, DIFF_V1_FORM, GROUPED_FORM, PER_LAYER, Layer, Variant

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
    layers="diffeval.models.variants.motif.record:layers",
    split_maps="diffeval.models.diff:split_differential",  # the attention call sees DiffLlama's layout (motif_maps)
    fixture="diffeval.models.variants.motif.fixture:build",
    fixture_shapes=("gqa", "mha", "gda", "gda-shared-pairs"),
    vllm_model="diffeval.models.variants.motif.vllm:MotifForCausalLM",
    register_hf="diffeval.models.variants.motif.modeling:register",
    check_config="diffeval.models.variants.motif.checks:check_motif_keys",
    inspect_lambdas="diffeval.models.diff:layer_lambdas",
)


def layers(config) -> tuple[Layer, ...]:
    """Every layer DIFF attention over the full context, grouped when the config has noise heads; the vLLM model keeps
    K and V twice (4 attentions over N_kv / 2 pairs)."""
    form = GROUPED_FORM if getattr(config, "num_noise_heads", None) else DIFF_V1_FORM
    return (Layer(DIFF_ATTENTION, diff_form=form, kv_caches=2),) * config.num_hidden_layers
