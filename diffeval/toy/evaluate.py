"""In-process needle check during training: the real needle prompts and scoring, on held-out training places.

The places (`VALIDATION_PLACES`) never appear in training documents and are disjoint from the evaluation's
cities, and the seed differs from the CLI's default, so tracking this never tunes on the evaluation itself.
"""

from __future__ import annotations

from diffeval.longctx.scoring import score
from diffeval.models.checkpoints.loading import LoadedModel, describe
from diffeval.models.engines.hf import HFBackend
from diffeval.models.spec import ModelSpec
from diffeval.tasks.haystack.needle import build_prompt, make_sample
from diffeval.tasks.haystack.recipe import STOP
from diffeval.toy.corpus import VALIDATION_PLACES

VALIDATION_SEED = 7919
DEPTHS = (0, 25, 50, 75, 100)
MAX_NEW_TOKENS = 32


def needle_accuracy(
    model, tokenizer, ctx: int, samples_per_depth: int, needles: int = 1, queries: int = 1, haystack: str = "noise"
) -> float:
    """Mean needle score over DEPTHS × samples_per_depth greedy answers at context length ctx."""
    was_training = model.training
    model.eval()
    tokenizer.padding_side = "left"
    info = describe(ModelSpec("toy", "in-training"), model.config, model)
    backend = HFBackend(LoadedModel(model, tokenizer, info))
    total, count = 0.0, 0
    for depth in DEPTHS:
        samples = [
            make_sample(VALIDATION_SEED, ctx, depth, needles, queries, i, haystack, cities=VALIDATION_PLACES)
            for i in range(samples_per_depth)
        ]
        prompts = [build_prompt(s, backend, ctx - MAX_NEW_TOKENS, chat_template=False) for s in samples]
        outputs = backend.generate([p.ids for p in prompts], MAX_NEW_TOKENS, STOP)
        for sample, output in zip(samples, outputs, strict=True):
            total += score(output.text, sample.expected)[0]
            count += 1
    model.train(was_training)
    return total / count
