"""Phi-4-mini-flash's parity checkpoints (the record's `fixture`), and a Phi-4-mini baseline beside them (the public
pair's layout in small). The fixture is the SambaY layer rule at two depths, so that the memory layer (L/2), the KV
layer (L/2 + 1) and the cross-decoder all move (8 layers: memory 4, KV 5, cross 6–7; 12 layers: memory 6, KV 7,
cross 8–11). head_dim 32 (vLLM's CPU attention), 4 query heads over 2 KV heads, a sliding window of 8 tokens (shorter
than the test prompts, so that ignoring it shows), every weight random."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast

SHAPES = {
    "8-layers": dict(seed=11, num_hidden_layers=8),
    "12-layers": dict(seed=12, num_hidden_layers=12, tie_word_embeddings=False),
}
COMMON = dict(
    hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, sliding_window=8,
    mb_per_layer=2, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, initializer_range=0.1,
    max_position_embeddings=65536,
)  # fmt: skip


def build(shape: str, tokenizer_dir: str | Path, out_dir: str | Path) -> Path:
    return build_phi4flash(tokenizer_dir, out_dir, **SHAPES[shape])


def build_phi4flash(tokenizer_dir: str | Path, out_dir: str | Path, seed: int = 0, spread: float = 0.1, **keys):
    """A random Phi-4-mini-flash around the tokenizer in `tokenizer_dir`: `keys` over the fixture's sizes; `spread`
    adds noise to every one-dimensional weight (norms, biases, λ, D), which initialisation leaves at constants."""
    from diffeval.models.variants.phi4flash.modeling import Phi4FlashConfig, Phi4FlashForCausalLM

    tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    torch.manual_seed(seed)
    config = Phi4FlashConfig(
        **{**COMMON, "vocab_size": len(tokenizer), "bos_token_id": tokenizer.bos_token_id,
           "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id, **keys}
    )  # fmt: skip
    config.architectures = ["Phi4FlashForCausalLM"]
    model = Phi4FlashForCausalLM(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() == 1:
                parameter.add_(spread * torch.randn_like(parameter))
            elif name.endswith("A_log"):
                parameter.add_(spread * torch.randn_like(parameter))
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return Path(out_dir)


def build_phi4_mini(tokenizer_dir: str | Path, out_dir: str | Path, seed: int = 13, **keys) -> Path:
    """The pair's baseline for tests: a random Phi-4-mini layout (transformers' Phi3ForCausalLM: RoPE, fused qkv and
    gate-up projections, RMSNorm), of the fixture's width and heads, 4 layers, around the same tokenizer."""
    from transformers import Phi3Config, Phi3ForCausalLM

    tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    torch.manual_seed(seed)
    config = Phi3Config(
        **{"vocab_size": len(tokenizer), "hidden_size": COMMON["hidden_size"], "num_hidden_layers": 4,
           "intermediate_size": COMMON["intermediate_size"], "num_attention_heads": COMMON["num_attention_heads"],
           "num_key_value_heads": COMMON["num_key_value_heads"], "max_position_embeddings": 65536,
           "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id, "tie_word_embeddings": True, "initializer_range": 0.1, **keys}
    )  # fmt: skip
    Phi3ForCausalLM(config).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return Path(out_dir)
