"""The Phi-4-mini-flash record: Microsoft's SambaY decoder-hybrid-decoder, DIFF V1 attention in every attention layer.

The layer rule, from the config (`num_hidden_layers` L, `mb_per_layer` m; vLLM v0.10.2's `phi4flash.py` and the ports
of the checkpoint's remote code, docs/engines/phi4flash.md):

- layer i is a Mamba layer where m > 0 and i % m == 0, an attention layer otherwise;
- the self-decoder, i < L/2: Mamba layers and DIFF attention over a sliding window;
- layer L/2 (a Mamba layer): its scan output, before the gate, is the memory the cross-decoder's gated units read;
- layer L/2 + 1 (an attention layer): full DIFF attention whose KV cache every cross-decoder attention layer reads;
- the cross-decoder, i ≥ L/2 + 2: Mamba positions become Gated Memory Units (no state), attention positions cross
  DIFF attention over layer L/2 + 1's keys and values (queries only, no KV of their own).
"""

from __future__ import annotations

import math

from diffeval.models.variants.base import (
    DIFF_ATTENTION,
    DIFF_V1_FORM,
    GATED_MEMORY,
    PER_LAYER,
    STATE_SPACE,
    Layer,
    Variant,
)

PHI4FLASH = Variant(
    name="phi4flash",
    title="DIFF V1 (Phi-4-mini-flash, SambaY)",
    architectures=("Phi4FlashForCausalLM",),
    model_types=("phi4flash",),
    head_layout="N query heads over N_kv KV heads (N_kv even): adjacent heads (2i, 2i + 1) pair into map 1 and map 2 "
    "over their KV pair's double-width value, as Motif's; cross-decoder layers read layer L/2 + 1's keys and values",
    lambda_form=PER_LAYER,
    norm="subln: RMSNorm over 2·head_dim with a learned weight (eps 1e-5), × (1 − λ_init); λ_init from the 0-based "
    "layer index",
    layers="diffeval.models.variants.phi4flash.record:layers",
    split_maps="diffeval.models.diff:split_differential",
    fixture="diffeval.models.variants.phi4flash.fixture:build",
    fixture_shapes=("8-layers", "12-layers"),
    vllm_model="diffeval.models.variants.phi4flash.vllm:Phi4FlashForCausalLM",
    vllm_eager=True,  # its Mamba layers branch in Python on the batch's metadata, which a CUDA graph would freeze
    register_hf="diffeval.models.variants.phi4flash.modeling:register",
    check_config="diffeval.models.variants.phi4flash.checks:check_phi4flash_config",
    inspect_lambdas="diffeval.models.variants.phi4flash.modeling:layer_lambdas",
)


def is_mamba(config, index: int) -> bool:
    return config.mb_per_layer > 0 and index % config.mb_per_layer == 0


def memory_layer(config) -> int:
    """The Mamba layer whose scan output the cross-decoder's Gated Memory Units read: L/2."""
    return config.num_hidden_layers // 2


def kv_layer(config) -> int:
    """The full DIFF attention layer whose KV cache the cross-decoder's attention layers read: L/2 + 1."""
    return config.num_hidden_layers // 2 + 1


def windows(config) -> list[int | None]:
    """Each layer's sliding window (None: full). `sliding_window` is one width for the self-decoder's attention layers
    (the published config), or a list with one entry per layer (what the remote config class saves); `layer_types`,
    where given, says which of them slide. From L/2 on every layer is full whatever the config says: every source
    turns the window off there (the KV layer's cache is what the cross-decoder reads)."""
    width, kinds = config.sliding_window, getattr(config, "layer_types", None)
    found = []
    for i in range(config.num_hidden_layers):
        if isinstance(width, list):
            found.append(width[i])
        elif kinds:
            found.append(width if kinds[i] == "sliding_attention" else None)
        else:
            found.append(width)
    return [w if i < memory_layer(config) and not is_mamba(config, i) else None for i, w in enumerate(found)]


def mamba_state_elements(config) -> int:
    """One sequence's Mamba state: the convolution's last d_conv − 1 inputs and the d_state-wide SSM state, over
    d_inner = expand · hidden channels."""
    inner = config.mamba_expand * config.hidden_size
    return inner * (config.mamba_d_conv - 1) + inner * config.mamba_d_state


def layers(config) -> tuple[Layer, ...]:
    """Every layer's kind by the rule above. On vLLM a DIFF layer keeps its K and V twice (two attentions of N_kv KV
    heads, one carrying the pairs' even value heads and one their odd ones: vllm.py)."""
    memory, shared, window = memory_layer(config), kv_layer(config), windows(config)
    kinds = []
    for i in range(config.num_hidden_layers):
        if i >= shared + 1:
            kinds.append(
                Layer(GATED_MEMORY, memory_from=memory)
                if is_mamba(config, i)
                else Layer(DIFF_ATTENTION, diff_form=DIFF_V1_FORM, kv_from=shared, kv_caches=2)
            )
        elif is_mamba(config, i):
            kinds.append(Layer(STATE_SPACE, state_elements=mamba_state_elements(config)))
        else:
            kinds.append(Layer(DIFF_ATTENTION, diff_form=DIFF_V1_FORM, window=window[i], kv_caches=2))
    return tuple(kinds)


def dt_rank(config) -> int:
    rank = config.mamba_dt_rank
    return math.ceil(config.hidden_size / 16) if rank == "auto" else int(rank)
