"""DIFF V2's parity checkpoints (the record's `fixture`): random DiffLlama2s with h = 4 differential heads (8 query
heads of head_dim 32, a size vLLM's CPU attention takes) over h_kv = 2 or 4 KV heads."""

from __future__ import annotations

from pathlib import Path

from diffeval.models.tiny import build_variant_fixture

SHAPES = {
    "gqa": dict(seed=8, hidden=128, heads=4, kv_heads=2, head_dim=32),
    "mha": dict(seed=9, hidden=128, heads=4, kv_heads=4, head_dim=32),
}


def build(shape: str, tokenizer_dir: str | Path, out_dir: str | Path) -> Path:
    return build_variant_fixture("diff2", SHAPES[shape], tokenizer_dir, out_dir)
