"""The λ of a DIFF variant whose λ is per token (V2: λ = sigmoid(W_λ·x)), as `models inspect` shows it.

Such a checkpoint holds no λ of its own: λ depends on each token's input. So the model runs once over a fixed probe
text, the noise haystack's sentences repeated to PROBE_TOKENS tokens, and each layer's λ is summarised over its tokens
and heads by the variant's `inspect_lambdas`.
"""

from __future__ import annotations

from dataclasses import dataclass

from diffeval.data.haystack import NOISE_SENTENCES
from diffeval.models.checkpoints.loading import LoadedModel
from diffeval.models.variants.registry import Variant

PROBE_TOKENS = 256


@dataclass(frozen=True)
class LambdaProbe:
    tokens: int  # the probe's length in the model's tokens
    layers: list[dict[str, float]]  # per layer: "layer", and λ's "mean", "std", "min" and "max"


def per_token_lambdas(loaded: LoadedModel, variant: Variant) -> LambdaProbe:
    """λ per layer over the probe text, from one forward pass of the loaded model."""
    sentences = list(NOISE_SENTENCES)
    while len(loaded.tokenizer(" ".join(sentences)).input_ids) < PROBE_TOKENS:  # the haystack's own repetition
        sentences += NOISE_SENTENCES
    ids = loaded.tokenizer(" ".join(sentences), return_tensors="pt").input_ids[:, :PROBE_TOKENS]
    layers = variant.code(variant.inspect_lambdas)(loaded.model, ids.to(loaded.model.device))
    return LambdaProbe(ids.shape[1], layers)
