"""Motif's parity checkpoints (the record's `fixture`), built from diffeval's own config and model classes, which save
Motif's published tensor names and config keys (tests/test_motif.py compares them with a checkpoint written from the
sources): Motif-2.6B's adjacent pairs with and without GQA, tied and untied, and grouped differential attention
(Motif-2-12.7B) with one and with two groups per KV pair. head_dim 32: a size vLLM's CPU attention takes."""

from __future__ import annotations

from pathlib import Path

from diffeval.models.tiny import build_variant_fixture

SHAPES = {
    "gqa": dict(seed=2, hidden=128, heads=8, kv_heads=2, head_dim=32, tie_word_embeddings=False),
    "mha": dict(seed=1, hidden=64, heads=4, kv_heads=4, head_dim=32),
    # R = 4 signal heads per noise head, one KV pair per group; N not a multiple of N_kv (as Motif-2-12.7B's 40 over 16)
    "gda": dict(
        seed=3, hidden=64, heads=10, kv_heads=4, head_dim=32, num_noise_heads=2, k_ratio=1, tie_word_embeddings=False
    ),
    # R = 2, two groups sharing each KV pair
    "gda-shared-pairs": dict(seed=4, hidden=64, heads=12, kv_heads=4, head_dim=32, num_noise_heads=4, k_ratio=1),
}


def build(shape: str, tokenizer_dir: str | Path, out_dir: str | Path) -> Path:
    return build_variant_fixture("diff-motif", SHAPES[shape], tokenizer_dir, out_dir)
