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


# a chat template with thinking markers, for reasoning-model tests: `enable_thinking=false` closes the thinking in the
# prompt (as Qwen3's does)
THINK_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{% endif %}"
)
ROLE_TOKENS = ["<|user|>", "<|assistant|>", "<|end|>"]


def thinking_tokenizer(
    base_dir: str | Path, out_dir: str | Path, marker_tokens: bool = True
) -> PreTrainedTokenizerFast:
    """The tokenizer in `base_dir` with THINK_TEMPLATE as its chat template, its role markers as special tokens, and
    (with `marker_tokens`) <think> and </think> as added tokens that are not special, as Qwen3's are: decoded text keeps
    them. Without them the markers are plain text of several tokens each."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(base_dir)
    tokenizer.add_tokens(ROLE_TOKENS, special_tokens=True)
    if marker_tokens:
        tokenizer.add_tokens(["<think>", "</think>"])
    tokenizer.chat_template = THINK_TEMPLATE
    tokenizer.save_pretrained(out_dir)
    return tokenizer


def build_scripted_model(
    tokenizer_dir: str | Path, out_dir: str | Path, walks: list[list[int]], default: int = 1
) -> Path:
    """A tiny Llama whose greedy output follows a fixed script: attention and MLP write nothing (all their weights zero,
    so o_proj and down_proj add 0 to the residual), the embedding of token t is the one-hot e_t, the final RMSNorm makes
    it sqrt(H)·e_t, and the LM head's column t is one-hot at next[t]: the logits are sqrt(H)·one_hot(next[t]), so the
    next token depends on the current one alone. `walks` give next[]: each id is followed by the next id of its walk (an
    id with two successors raises); every other id is followed by `default` (EOS). The hidden size is the vocabulary
    rounded up to heads of 64 (vLLM's CPU kernels take 64)."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    vocab = len(tokenizer)
    hidden = 64 * -(-vocab // 64)
    successors: dict[int, int] = {}
    for walk in walks:
        for a, b in zip(walk, walk[1:]):
            if successors.setdefault(a, b) != b:
                raise ValueError(f"token {a} has two successors in the script: {successors[a]} and {b}")
    config = tiny_config(
        "base", vocab, hidden=hidden, layers=1, heads=hidden // 64, kv_heads=1, head_dim=64, ffn=64,
        tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.fill_(1.0 if name.endswith("norm.weight") else 0.0)  # input, post-attention and final RMSNorm
        tokens = torch.arange(vocab)
        model.model.embed_tokens.weight[tokens, tokens] = 1.0
        model.lm_head.weight[torch.tensor([successors.get(t, default) for t in range(vocab)]), tokens] = 1.0
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return Path(out_dir)
