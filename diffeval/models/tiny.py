"""Tiny Llama / DiffLlama / DiffLlama2 (DIFF V2) / Motif checkpoints and byte-level BPE tokenizers built offline (tests,
benchmarks, toy pair)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import DiffLlamaConfig, DiffLlamaForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from diffeval.models.variants.diffllama2.modeling import DiffLlama2Config, DiffLlama2ForCausalLM
from diffeval.models.variants.motif.modeling import MotifConfig, MotifForCausalLM
from diffeval.models.variants.registry import register

SPECIAL_TOKENS = ["<s>", "</s>", "<pad>"]
# kind → (config class, model class); any other kind builds the Llama baseline
KINDS = {
    "diff": (DiffLlamaConfig, DiffLlamaForCausalLM),
    "diff2": (DiffLlama2Config, DiffLlama2ForCausalLM),
    "diff-motif": (MotifConfig, MotifForCausalLM),
    "base": (LlamaConfig, LlamaForCausalLM),
}


def train_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: str | Path) -> PreTrainedTokenizerFast:
    """A byte-level BPE (no unknown tokens) with digits split one per token, saved as a transformers tokenizer."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    bos = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)]),
        ]
    )
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    wrapped.save_pretrained(out_dir)
    return wrapped


def tiny_config(
    kind: str,
    vocab_size: int,
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int | None = None,
    ffn: int = 128,
    max_positions: int = 8192,
    rope_theta: float = 10000.0,
    **config_keys,
):
    """Matched configs: same heads and head_dim for all kinds. "diff" (V1) pairs two maps per head over a double-width
    V; "diff2" (V2) keeps `heads` differential heads, each from two of its 2 × `heads` query heads. `config_keys` set
    any other config key (tie_word_embeddings, initializer_range, a variant's own such as Motif's num_noise_heads)."""
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim or hidden // heads,
        max_position_embeddings=max_positions,
        rope_theta=rope_theta,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=True,
    )
    return KINDS.get(kind, KINDS["base"])[0](**{**common, **config_keys})


def build_tiny_model(
    kind: str, tokenizer_dir: str | Path, out_dir: str | Path, seed: int = 0, spread: float = 0.0, **sizes
):
    """A randomly initialised tiny model saved with its tokenizer: a real checkpoint for plumbing tests. `spread` adds
    Gaussian noise of that standard deviation to every one-dimensional parameter (norm weights, λ vectors, PolyNorm's
    weights and bias), which initialisation leaves at constants: then no check passes on code that ignores one."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    register()  # the classes transformers does not ship build from what it registers (Motif's PolyNorm activation)
    torch.manual_seed(seed)
    config = tiny_config(kind, len(tokenizer), **sizes)
    model = KINDS.get(kind, KINDS["base"])[1](config)
    if spread:
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.dim() == 1:
                    parameter.add_(spread * torch.randn_like(parameter))
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return model


def build_variant_fixture(kind: str, sizes: dict, tokenizer_dir: str | Path, out_dir: str | Path) -> Path:
    """A DIFF variant's parity checkpoint (its record's `fixture`): a tiny model of `kind` with `sizes` (its seed among
    them) around the tokenizer in `tokenizer_dir`, every weight drawn wide (std 0.1, norms and λ included) so that
    attention maps are far from uniform and a misread weight shows in the logits."""
    build_tiny_model(kind, tokenizer_dir, out_dir, spread=0.1, initializer_range=0.1, **sizes)
    return Path(out_dir)
