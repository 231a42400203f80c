"""The DIFF-variant registry: one record per Differential Transformer variant diffeval runs, and the one public
registration of them all with transformers (`register`) and with vLLM (`register_vllm`).

Every question of the form "which DIFF variant is this, and what does that mean here" reads a record (models/variants/
base.py says what a record holds): how a config is recognised, how its heads pair, its λ, its norm, every layer's kind,
how the attention analysis splits its maps, its checkpoint rules and what `models inspect` shows. Nothing outside the
variants' packages compares a variant's name, architecture or model type.

Adding a variant is one package under models/variants/ and one line in VARIANTS (see docs/contributing.md).
"""

from __future__ import annotations

from diffeval.models.variants.base import ATTENTION, STATE_SPACE, Layer, Variant
from diffeval.models.variants.diffllama.record import DIFF_V1
from diffeval.models.variants.diffllama2.record import DIFF_V2
from diffeval.models.variants.motif.record import MOTIF
from diffeval.models.variants.phi4flash.record import PHI4FLASH

VARIANTS: tuple[Variant, ...] = (DIFF_V1, DIFF_V2, MOTIF, PHI4FLASH)

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


def model_types() -> tuple[str, ...]:
    return tuple(t for v in VARIANTS for t in v.model_types)


# a recurrent (state-space) layer's name in a config's layer list: transformers' `layer_types` calls Mamba, Mamba-2 and
# other recurrent mixers "linear_attention" (Jamba's, Bamba's, Zamba2's); older `layers_block_type` lists say "mamba"
RECURRENT_KINDS = ("linear_attention", "mamba", "mamba2")


def layers_of(config) -> tuple[Layer, ...]:
    """Every decoder layer's kind: the variant's record, or for a baseline what its config declares (transformers'
    `layer_types`: sliding and full attention, and a hybrid's recurrent layers; else an older `layers_block_type`)."""
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    variant = variant_of(config)
    if variant is not None:
        return variant.code(variant.layers)(text_config)
    count = getattr(text_config, "num_hidden_layers", None) or 0
    window = getattr(text_config, "sliding_window", None)
    kinds = getattr(text_config, "layer_types", None) or getattr(text_config, "layers_block_type", None)
    if not kinds:  # one kind for every layer (Mistral's sliding_window applies to all of them)
        return (Layer(ATTENTION, window=window),) * count
    layers = []
    for kind in kinds:
        if kind in RECURRENT_KINDS:
            layers.append(Layer(STATE_SPACE, state_elements=_mamba_state(text_config)))
        else:
            layers.append(Layer(ATTENTION, window=window if kind == "sliding_attention" else None))
    return tuple(layers)


def _mamba_state(config) -> int:
    """One sequence's Mamba state in elements: the convolution's last d_conv − 1 inputs and the d_state-wide SSM state,
    over d_inner = expand · hidden channels (Jamba's `mamba_*` keys)."""
    inner = getattr(config, "mamba_expand", 2) * config.hidden_size
    return inner * (getattr(config, "mamba_d_conv", 4) - 1) + inner * getattr(config, "mamba_d_state", 16)


def register() -> None:
    """Teach transformers' Auto classes every variant that is not transformers' own (idempotent): a checkpoint of any
    registered variant then loads with `AutoModelForCausalLM.from_pretrained`, no `trust_remote_code`."""
    global _REGISTERED
    if _REGISTERED:
        return
    for variant in VARIANTS:
        register_hf = variant.code(variant.register_hf)
        if register_hf is not None:
            register_hf()
    _REGISTERED = True


_REGISTERED = False  # the registration imports transformers' modeling code: it waits for the first load


def vllm_architectures() -> dict[str, str]:
    """architecture → "module:Class" of every variant diffeval's vLLM plugin registers."""
    return {v.architectures[0]: v.vllm_model for v in VARIANTS if v.vllm_model}


def register_vllm() -> None:
    """vLLM's entry point into diffeval (`vllm.general_plugins` in pyproject.toml): every vLLM process, `LLM(...)`,
    `vllm serve` and diffeval's `--backend vllm` alike, and each of its engine and worker processes, runs it.

    Each variant's vLLM model is registered under its string path, so nothing heavy is imported (and no CUDA starts)
    until vLLM builds one, and explicitly, so vLLM never falls back to its transformers backend for them: for DiffLlama
    (V1) that backend would call attention twice per layer over one KV cache. Variants transformers does not ship are
    also taught to transformers' AutoConfig, which vLLM reads the checkpoint's config through."""
    from vllm import ModelRegistry

    register()
    for architecture, target in vllm_architectures().items():
        ModelRegistry.register_model(architecture, target)
