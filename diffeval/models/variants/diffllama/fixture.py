"""DIFF V1's parity checkpoints (the record's `fixture`): random DiffLlamas in the head layouts vLLM's model must
pair right, head_dim 32 (vLLM's CPU attention takes 32, 64, 80, …) and an even number of KV heads (its map halves)."""

from __future__ import annotations

from pathlib import Path

from diffeval.models.tiny import build_variant_fixture

SHAPES = {
    "gqa": dict(seed=6, hidden=128, heads=8, kv_heads=4, head_dim=32),  # H = 8 over Hkv = 4
    "mha": dict(seed=7, hidden=128, heads=4, kv_heads=4, head_dim=32),
}


def build(shape: str, tokenizer_dir: str | Path, out_dir: str | Path) -> Path:
    return build_variant_fixture("diff", SHAPES[shape], tokenizer_dir, out_dir)
