"""The parity suite's hf half, for every registered DIFF variant and every shape its record declares (`Variant.fixture`
and `fixture_shapes`, built by conftest's `variant_checkpoint` around tokenizer A): diffeval's transformers model
against the variant's independent reference, and greedy decoding through the KV cache against full forwards. The vLLM
half (prompt log-probs, token_nll, greedy outputs, choice scores, the prefix cache, chunked prefill, the planned KV
cache, the needle through the command line) runs on the same checkpoints in tests/test_vllm.py.

A new variant gets both halves by registering: its record declares its fixture, and its reference joins REFERENCES
below (the first test fails until both are there).
"""

from __future__ import annotations

import pytest
import torch
from phi4flash_reference import reference_logits as phi4flash_logits

from conftest import PARITY_SHAPES
from diff_references import diffllama2_logits, diffllama_logits
from diffeval.models.checkpoints.loading import load_model
from diffeval.models.engines.hf import HFBackend
from diffeval.models.spec import ModelSpec
from diffeval.models.variants import registry
from motif_reference import reference_logits as motif_logits

# every test here runs a model's forward or its cache: .ci/run runs them again at the low end of transformers' range
pytestmark = pytest.mark.transformers_floor

# variant name → (checkpoint folder, ids (B, T)) → logits: each written from the variant's own published sources,
# sharing no code with diffeval
REFERENCES = {
    "v1": diffllama_logits,  # transformers' DiffLlama attention written out (tests/diff_references.py)
    "v2": diffllama2_logits,  # the paper's V2 module, rotated as transformers rotates (tests/diff_references.py)
    "motif": motif_logits,  # Motif-2 and its grouped attention, by another author (tests/motif_reference.py)
    "phi4flash": phi4flash_logits,  # SambaY in float64 with a sequential scan, by another author (its module)
}
MAX_LOGIT_GAP = 1e-5  # fp32 against the references' fp32 (V1, V2) and float64 (Motif): measured up to 6e-6
# Phi-4-mini-flash: 12 layers of fp32 Mamba scans and LayerNorms against a float64 reference, measured up to 3.4e-5
# (6e-7 with diffeval's model in float64, whose subln and λ stay fp32 as vLLM's); issue 50's bound
MAX_LOGIT_GAPS = {"phi4flash": 1e-4}


@pytest.mark.parametrize("variant", registry.VARIANTS, ids=lambda v: v.name)
def test_every_variant_declares_a_fixture_and_has_an_independent_reference(variant):
    assert variant.fixture and variant.fixture_shapes, (
        f"variant {variant.name}: its record declares no fixture (Variant.fixture, fixture_shapes), so no parity "
        "suite runs on it"
    )
    assert variant.name in REFERENCES, (
        f"variant {variant.name}: add its independent reference to REFERENCES in tests/test_parity.py"
    )


@pytest.fixture(scope="module", params=list(PARITY_SHAPES))
def loaded(request, variant_checkpoint):
    """(variant, checkpoint folder, diffeval's loaded model) for one parity shape."""
    folder = variant_checkpoint(request.param)
    return PARITY_SHAPES[request.param][0], folder, load_model(ModelSpec("m", str(folder)), "cpu", "float32")


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_logits_match_the_independent_reference(loaded, impl):
    variant, folder, model = loaded
    assert model.info.is_diff and model.info.diff_variant == variant.name
    assert registry.variant_of(model.model.config) is variant
    model.model.set_attn_implementation(impl)
    ids = torch.randint(3, model.model.config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ours = model.model(input_ids=ids).logits.double()
    gap = (ours - REFERENCES[variant.name](folder, ids).double()).abs().max().item()
    print(f"{variant.name} {folder.name} {impl}: max |Δ logit| = {gap:.2e}")
    assert gap <= MAX_LOGIT_GAPS.get(variant.name, MAX_LOGIT_GAP)


def test_greedy_decoding_through_the_kv_cache_equals_full_forwards(loaded):
    """hf's generate (left-padded batch, KV cache) gives the argmax of full forwards without a cache; and logits one
    token at a time through the cache are a full forward's at every position, over a cache of num_key_value_heads keys
    and values in every layer that keeps its own (a sliding layer: its window)."""
    _, _, model = loaded
    model.model.set_attn_implementation("sdpa")  # the engine's default; the reference test may have left eager
    backend = HFBackend(model)
    prompts = [backend.encode(text).ids for text in ("Lisbon has the magic number", "A city and a number: 12, 3")]
    assert len(prompts[0]) != len(prompts[1])  # so the batch is padded
    for prompt, generation in zip(prompts, backend.generate(prompts, 8, [])):
        ids = list(prompt)
        with torch.inference_mode():
            for _ in range(generation.new_tokens):
                ids.append(int(model.model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
        assert generation.new_tokens > 0 and generation.text == backend.decode(ids[len(prompt) :])

    ids, split = torch.tensor([prompts[0] + prompts[1]]), len(prompts[0])
    cache_argument = backend._cache  # transformers 5.24 calls it `cache`, earlier versions `past_key_values`
    with torch.inference_mode():
        full = model.model(input_ids=ids).logits[0, split:]
        out = model.model(input_ids=ids[:, :split], use_cache=True)
        steps = []
        for position in range(split, ids.shape[1]):
            cache = getattr(out, cache_argument)
            out = model.model(input_ids=ids[:, position : position + 1], **{cache_argument: cache}, use_cache=True)
            steps.append(out.logits[0, -1])
    torch.testing.assert_close(torch.stack(steps), full, atol=1e-4, rtol=1e-4)
    cache, config = getattr(out, cache_argument), model.model.config
    assert cache.get_seq_length() == ids.shape[1]
    length = ids.shape[1]
    for index, layer in enumerate(registry.layers_of(config)):  # the layers that keep KV, as the record says
        if layer.cached_kv:
            # transformers' caches hold a list of layers; Phi-4-mini-flash's its KV layers' keys by index
            keys = cache.keys[index] if isinstance(getattr(cache, "keys", None), dict) else cache.layers[index].keys
            kept = length if layer.window is None else min(length, layer.window - 1)
            assert tuple(keys.shape) == (1, config.num_key_value_heads, kept, config.head_dim)
