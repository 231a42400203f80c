"""Motif's checkpoint rules, asked by the check stage (models/checkpoints/check.py): the Motif layouts diffeval
computes exactly, and those it does not run yet."""

from __future__ import annotations

from diffeval.errors import InputError
from diffeval.models.spec import ModelSpec

# keys that mark the Motif checkpoints diffeval does not run yet (they share the architecture `MotifForCausalLM`):
# Motif-3's latent attention, experts and hyper-connections (its configs carry `num_noise_heads` too)
MOTIF_3_KEYS = ("kv_lora_rank", "q_lora_rank", "num_experts", "moe_intermediate_size", "mhc_enabled")


def check_motif_keys(spec: ModelSpec, config, given: set[str]) -> None:
    """A Motif config diffeval computes exactly: Motif-2.6B's dense DIFF attention or Motif-2-12.7B's grouped one, with
    PolyNorm (the head counts are checked by the config class, models/variants/motif/modeling.py). `given`: the keys
    config.json holds; transformers fills a missing head_dim with hidden_size // num_attention_heads, which grouped
    attention's heads do not follow (Motif-2-12.7B: 40 heads of 128 over a width of 4096)."""
    if config.num_noise_heads is not None and "head_dim" not in given:
        raise InputError(
            f"model {spec.name}: num_noise_heads (grouped differential attention) needs head_dim in the config: "
            "config.json has none, and the default (hidden_size // num_attention_heads = "
            f"{config.hidden_size // config.num_attention_heads}) is not grouped attention's; add the head_dim the "
            "weights were saved with (Motif-2-12.7B: 128)"
        )
    found = [key for key in MOTIF_3_KEYS if getattr(config, key, None) is not None]
    if found:
        raise InputError(
            f"model {spec.name}: config.json has {', '.join(found)}: not supported yet: Motif-3 (latent attention, "
            "experts); diffeval runs Motif-2.6B's and Motif-2-12.7B's layouts"
        )
    if config.hidden_act != "poly_norm":
        raise InputError(
            f"model {spec.name}: config.json has hidden_act = {config.hidden_act!r}; Motif's MLP is PolyNorm: set "
            '"poly_norm"'
        )
