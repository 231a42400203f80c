"""An independent test reference for Motif-2.6B (`MotifForCausalLM`, plain "V1" differential attention with a
PolyNorm-gated MLP): a writer of tiny random checkpoints laid out as the published ones, and a float64 forward pass
that reads such a folder with nothing but json and safetensors.

It was written from a technical note on the architecture and that note's sources only:

- vLLM v0.10.2, commit 9bd831f5 (PR #23414): `vllm/model_executor/models/motif.py` (block, tensor names, λ_init with
  the 0-based layer index minus one) and `vllm/attention/backends/differential_flash_attn.py` (adjacent-pair
  "stripe" split of the heads, both value halves read by each map, subln over 2·head_dim, × (1 − λ_init));
- vLLM's `vllm/model_executor/layers/layernorm.py` PolyNorm (weight[0] on the cube term, scalar bias, eps 1e-6);
- mlx-motif's parity fixture `tests/fixtures/motif_parity_cases.json` (the PolyNorm test vector below).

It shares no code with diffeval's own Motif implementation and imports nothing from diffeval.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

# mlx-motif tests/fixtures/motif_parity_cases.json: PolyNorm on two rows of width 3
POLYNORM_CASE = {
    "weight": [0.2, 0.3, 0.5],
    "bias": 0.125,
    "eps": 1e-6,
    "input": [[0.5, 1.0, 2.0], [-1.5, -0.5, 0.0]],
    "expected": [[0.350801, 0.671720, 1.727799], [-0.526319, -0.104300, 0.125]],
}


def write_tiny_motif(
    out: Path,
    tokenizer_dir: Path | str,
    *,
    heads: int = 4,
    kv_heads: int = 4,
    head_dim: int = 32,
    hidden: int = 64,
    layers: int = 2,
    ffn: int = 96,
    tied: bool = True,
    seed: int = 0,
    model_type: str = "Motif",
    max_positions: int = 4096,
    rope_theta: float = 10000.0,
    eos_token_id: int | None = None,
) -> Path:
    """A Motif-2.6B-shaped checkpoint folder with random fp32 weights around a real tokenizer (its whole vocabulary):
    config.json, model.safetensors (no lm_head.weight when tied) and the tokenizer files."""
    from transformers import AutoTokenizer

    if heads % 2 or kv_heads % 2 or heads % kv_heads:
        raise ValueError(f"Motif needs even head counts with kv_heads dividing heads, got {heads}/{kv_heads}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.save_pretrained(out)
    vocab = len(tokenizer)

    generator = torch.Generator().manual_seed(seed)

    def normal(*shape: int, std: float = 0.1) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float32) * std

    def norm_weight(size: int) -> torch.Tensor:
        return 1.0 + normal(size)

    tensors = {"model.embed_tokens.weight": normal(vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors[p + "self_attn.q_proj.weight"] = normal(heads * head_dim, hidden)
        tensors[p + "self_attn.k_proj.weight"] = normal(kv_heads * head_dim, hidden)
        tensors[p + "self_attn.v_proj.weight"] = normal(kv_heads * head_dim, hidden)
        tensors[p + "self_attn.o_proj.weight"] = normal(hidden, heads * head_dim)
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            tensors[p + f"self_attn.{name}"] = normal(head_dim)
        tensors[p + "self_attn.subln.weight"] = norm_weight(2 * head_dim)
        tensors[p + "mlp.gate_proj.weight"] = normal(ffn, hidden)
        tensors[p + "mlp.up_proj.weight"] = normal(ffn, hidden)
        tensors[p + "mlp.down_proj.weight"] = normal(hidden, ffn)
        tensors[p + "mlp.act_fn.weight"] = torch.tensor([0.2, 0.3, 0.5]) + normal(3, std=0.05)
        tensors[p + "mlp.act_fn.bias"] = 0.05 + normal(1, std=0.01)
        tensors[p + "input_layernorm.weight"] = norm_weight(hidden)
        tensors[p + "post_attention_layernorm.weight"] = norm_weight(hidden)
    tensors["model.norm.weight"] = norm_weight(hidden)
    if not tied:
        tensors["lm_head.weight"] = normal(vocab, hidden)
    save_file(
        {k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"), metadata={"format": "pt"}
    )

    config = {
        "architectures": ["MotifForCausalLM"],
        "model_type": model_type,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "poly_norm",
        "max_position_embeddings": max_positions,
        "rms_norm_eps": 1e-6,
        "attn_rms_norm_eps": 1e-5,
        "rope_theta": rope_theta,
        "tie_word_embeddings": tied,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id if eos_token_id is None else eos_token_id,
        "initializer_range": 0.1,
        "torch_dtype": "float32",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def poly_norm_reference(u: torch.Tensor, weight, bias, eps: float = 1e-6) -> torch.Tensor:
    """PolyNorm(u) = w0·n(u³) + w1·n(u²) + w2·n(u) + b, with n(z) = z / sqrt(mean(z²) + eps) over the last dim and no
    per-channel scale inside n; `bias` is a scalar (or a one-element tensor, as in the checkpoint)."""
    w = torch.as_tensor(weight, dtype=u.dtype).reshape(3)
    b = torch.as_tensor(bias, dtype=u.dtype).reshape(())

    def n(z: torch.Tensor) -> torch.Tensor:
        return z / torch.sqrt(z.pow(2).mean(-1, keepdim=True) + eps)

    return w[0] * n(u**3) + w[1] * n(u**2) + w[2] * n(u) + b


def reference_logits(folder: Path, input_ids: torch.Tensor) -> torch.Tensor:
    """The causal LM forward of a Motif-2.6B checkpoint folder in float64, for input_ids (batch, T) at positions
    0..T-1: logits (batch, T, vocab), float64. Heads are looped over one at a time."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    if config.get("rope_scaling"):
        raise NotImplementedError("this reference has plain RoPE only")
    if config.get("num_noise_heads") is not None:
        raise NotImplementedError("grouped differential attention (Motif-2-12.7B) is not covered")
    w = {name: t.to(torch.float64) for name, t in load_file(str(folder / "model.safetensors")).items()}

    hidden = config["hidden_size"]
    n_heads = config["num_attention_heads"]
    n_kv = config["num_key_value_heads"]
    d = config.get("head_dim") or hidden // n_heads
    eps = config["rms_norm_eps"]
    attn_eps = config["attn_rms_norm_eps"]
    theta = float(config.get("rope_theta", 10000.0))
    group = n_heads // n_kv  # effective query head j reads effective KV head j // group
    scale = d**-0.5

    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    input_ids = torch.as_tensor(input_ids, dtype=torch.long)
    batch, length = input_ids.shape

    # rotate-half (NeoX) RoPE over the whole head_dim: feature i turns with feature i + d/2
    inv_freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    freqs = torch.arange(length, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (T, d/2)
    cos = torch.cat([freqs.cos(), freqs.cos()], dim=-1)[None, :, None, :]  # (1, T, 1, d)
    sin = torch.cat([freqs.sin(), freqs.sin()], dim=-1)[None, :, None, :]

    def rope(x: torch.Tensor) -> torch.Tensor:  # (B, T, heads, d)
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    future = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)  # key after query

    def attend(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:  # (B, T, d) each -> softmax weights (B, T, T)
        scores = torch.einsum("bqd,bkd->bqk", q, k) * scale
        return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)

    x = w["model.embed_tokens.weight"][input_ids]  # (B, T, H)
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        lambda_init = 0.8 - 0.6 * math.exp(-0.3 * (layer - 1))  # 0-based index minus one, as Motif does
        lam = (
            torch.exp(torch.dot(w[p + "self_attn.lambda_q1"], w[p + "self_attn.lambda_k1"]))
            - torch.exp(torch.dot(w[p + "self_attn.lambda_q2"], w[p + "self_attn.lambda_k2"]))
            + lambda_init
        )

        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(batch, length, n_heads, d)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(batch, length, n_kv, d)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(batch, length, n_kv, d)
        q, k = rope(q), rope(k)  # all N query and Nkv key heads, before the split

        heads_out = []
        for j in range(n_heads // 2):  # effective head j: query heads 2j (map 1) and 2j + 1 (map 2)
            e = j // group  # effective KV head: key/value heads 2e (k1, v1) and 2e + 1 (k2, v2)
            q1, q2 = q[:, :, 2 * j], q[:, :, 2 * j + 1]
            k1, k2 = k[:, :, 2 * e], k[:, :, 2 * e + 1]
            v1, v2 = v[:, :, 2 * e], v[:, :, 2 * e + 1]
            a1, a2 = attend(q1, k1), attend(q2, k2)
            o1 = torch.cat([a1 @ v1, a1 @ v2], dim=-1)  # (B, T, 2d): [v1 part | v2 part]
            o2 = torch.cat([a2 @ v1, a2 @ v2], dim=-1)
            o = o1 - lam * o2
            o = rms_norm(o, w[p + "self_attn.subln.weight"], attn_eps) * (1.0 - lambda_init)
            heads_out.append(o)
        attn = torch.cat(heads_out, dim=-1)  # effective head j at columns [j·2d, (j+1)·2d)
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T

        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        act = poly_norm_reference(gate, w[p + "mlp.act_fn.weight"], w[p + "mlp.act_fn.bias"], eps=1e-6)
        x = x + (act * up) @ w[p + "mlp.down_proj.weight"].T

    x = rms_norm(x, w["model.norm.weight"], eps)
    if config.get("tie_word_embeddings", True):
        head = w["model.embed_tokens.weight"]
    else:
        head = w["lm_head.weight"]
    return x @ head.T
