"""Phi-4-mini-flash's checkpoint rules, asked by the check stage (models/checkpoints/check.py). The layer pattern,
head counts and sliding windows are the config class's (`Phi4FlashConfig.validate_architecture`, refused in one line
when the config is read); the weights are checked against the architecture built from it."""

from __future__ import annotations

from diffeval.errors import InputError
from diffeval.models.spec import ModelSpec
from diffeval.models.variants.phi4flash.record import PHI4FLASH

# the Auto classes whose `auto_map` entry diffeval's classes stand in for, and the class each must name
IMPLEMENTED = {"AutoConfig": "Phi4FlashConfig", "AutoModelForCausalLM": PHI4FLASH.architectures[0]}
LAYER_TYPES = ("full_attention", "sliding_attention", "mamba", "linear_attention")


def check_phi4flash_config(spec: ModelSpec, config, given: set[str]) -> None:
    """`auto_map` may name the remote code's classes (the published config does); one that names another class for
    a causal LM describes a model diffeval's Phi4FlashForCausalLM is not. `mamba_dt_rank` is a number or "auto"."""
    for auto, expected in IMPLEMENTED.items():
        named = (getattr(config, "auto_map", None) or {}).get(auto)
        if named is not None and str(named).rpartition(".")[2] != expected:
            raise InputError(
                f"model {spec.name}: config.json's auto_map has {auto} = {named!r}, an architecture diffeval does "
                f"not implement (its Phi-4-mini-flash is {expected}); run the checkpoint's own code with "
                "--trust-remote-code, or fix auto_map"
            )
    rank = config.mamba_dt_rank
    if isinstance(rank, str) and rank != "auto":
        raise InputError(f'model {spec.name}: mamba_dt_rank is {rank!r}: give a number or "auto"')
    unknown = sorted({kind for kind in config.layer_types or () if kind not in LAYER_TYPES})
    if unknown:
        raise InputError(
            f"model {spec.name}: layer_types has {', '.join(map(repr, unknown))}: Phi-4-mini-flash's layers are "
            f"{', '.join(LAYER_TYPES)}"
        )
