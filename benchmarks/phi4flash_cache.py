"""What one sequence keeps while it is generated, Phi-4-mini-flash against Phi-4-mini, at 4K–64K tokens.

Part 1, from the configs: the published configs' values (below; the hub cannot be reached here, so they are those
the sources quote, docs/engines/phi4flash-sources.md, and Phi-4-mini's model card), through diffeval's layer kinds
(`registry.layers_of`) and these rules:

- hf: each attention layer with its own KV keeps K and V of N_kv heads (a sliding layer its last w − 1 tokens), a
  cross-decoder layer none; each Mamba layer its convolution inputs (d_conv − 1 per channel, bf16) and its SSM state
  (d_state per channel, fp32, as `Phi4FlashCache` holds it);
- vLLM: a DIFF layer keeps two K,V sets (diffeval's two attentions of N_kv heads, one per value half), a sliding
  layer about w tokens of them, a cross layer none, a Mamba layer its state in the model's dtype.

Part 2, measured: the tensors `Phi4FlashCache` and transformers' cache hold after one prompt on the tiny pair of the
tests (fixture shapes), against what part 1's rule gives for those configs, so the rule is the code's.

Run: python benchmarks/phi4flash_cache.py [--tokens 4096,16384,65536]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

BF16, FP32 = 2, 4
# the published configs (Phi-4-mini-flash-reasoning: the values mobius's test pins at hub revision 1dff8163; the
# Mamba keys are absent there, so the configuration class's defaults apply), and Phi-4-mini's (model card)
FLASH = dict(hidden_size=2560, intermediate_size=10240, num_hidden_layers=32, num_attention_heads=40,
             num_key_value_heads=20, sliding_window=512, vocab_size=200064)  # fmt: skip
MINI = dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=24,
            num_key_value_heads=8, vocab_size=200064)  # fmt: skip


def flash_bytes(config, tokens: int, engine: str, width: int = BF16) -> int:
    """One sequence's cache of a Phi-4-mini-flash config on `engine` (the rules in the module's docstring), with KV
    and convolution inputs of `width` bytes (the model's dtype)."""
    from diffeval.models.variants import registry

    total, per_head = 0, config.head_dim * width
    for layer in registry.layers_of(config):
        if layer.state_elements:
            inner = config.mamba_expand * config.hidden_size
            conv, ssm = inner * (config.mamba_d_conv - 1), inner * config.mamba_d_state
            total += conv * width + ssm * (FP32 if engine == "hf" else width)
        elif layer.cached_kv:
            kept = tokens if layer.window is None else min(tokens, layer.window - (1 if engine == "hf" else 0))
            sets = 1 if engine == "hf" else layer.cached_kv
            total += sets * 2 * config.num_key_value_heads * per_head * kept
    return total


def mini_bytes(config, tokens: int, width: int = BF16) -> int:
    """A Phi3ForCausalLM's: every layer K and V of N_kv heads for every token (the same on both engines)."""
    head_dim = config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * width * tokens


def measured(tokens: int) -> None:
    """The tiny pair's caches after a `tokens`-token prompt, in bytes of their tensors (fp32 models)."""
    import torch
    from transformers import AutoModelForCausalLM

    from diffeval.models.tiny import train_tokenizer
    from diffeval.models.variants.phi4flash.fixture import build, build_phi4_mini
    from diffeval.models.variants.registry import register

    register()
    with tempfile.TemporaryDirectory() as root:
        tokenizer = train_tokenizer(["a b c d e f g h i j k l m n o p " * 8], 300, Path(root) / "tok")
        ids = torch.randint(3, len(tokenizer), (1, tokens), generator=torch.Generator().manual_seed(0))
        for name, folder in (("flash", build("8-layers", Path(root) / "tok", Path(root) / "flash")),
                             ("mini", build_phi4_mini(Path(root) / "tok", Path(root) / "mini"))):  # fmt: skip
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
            with torch.inference_mode():
                out = model(input_ids=ids, use_cache=True)
            cache = getattr(out, "cache", None) or out.past_key_values
            if name == "flash":
                held = [*cache.keys.values(), *cache.values.values(), *cache.conv.values(), *cache.ssm.values()]
                rule = flash_bytes(model.config, tokens, "hf", FP32)
            else:
                held = [t for layer in cache.layers for t in (layer.keys, layer.values)]
                rule = mini_bytes(model.config, tokens, FP32)
            got = sum(t.numel() * t.element_size() for t in held)
            print(f"tiny {name}, {tokens:,} tokens: cache holds {got:,} bytes; the rule gives {rule:,}")
            assert got == rule, (name, got, rule)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="4096,16384,32768,65536")
    args = parser.parse_args()
    from transformers import Phi3Config

    from diffeval.models.variants.phi4flash.modeling import Phi4FlashConfig

    flash = Phi4FlashConfig(**FLASH)
    flash.architectures = ["Phi4FlashForCausalLM"]
    mini = Phi3Config(**MINI)
    print("tokens | Phi-4-mini (both engines) | Phi-4-mini-flash hf | ratio | Phi-4-mini-flash vLLM | ratio")
    for tokens in (int(t) for t in args.tokens.split(",")):
        base, hf, vllm = mini_bytes(mini, tokens), flash_bytes(flash, tokens, "hf"), flash_bytes(flash, tokens, "vllm")
        print(f"{tokens:,} | {base / 2**20:,.1f} MiB | {hf / 2**20:,.1f} MiB | {base / hf:.1f}x | "
              f"{vllm / 2**20:,.1f} MiB | {base / vllm:.1f}x")  # fmt: skip
    measured(600)


if __name__ == "__main__":
    main()
