"""An independent test reference for the Motif-2 family (`MotifForCausalLM`): Motif-2.6B with plain "V1"
differential attention, and Motif-2-12.7B with grouped differential attention (GDA), both with a PolyNorm-gated MLP.
It has a writer of tiny random checkpoints laid out as the published ones, and a float64 forward pass that reads such
a folder with nothing but json and safetensors.

It was written from two technical notes on the architecture and those notes' sources only:

- vLLM v0.10.2, commit 9bd831f5 (PR #23414): `vllm/model_executor/models/motif.py` (block, tensor names, λ_init with
  the 0-based layer index minus one) and `vllm/attention/backends/differential_flash_attn.py` (adjacent-pair
  "stripe" split of the heads, both value halves read by each map, subln over 2·head_dim, × (1 − λ_init));
- vLLM's `vllm/model_executor/layers/layernorm.py` PolyNorm (weight[0] on the cube term, scalar bias, eps 1e-6);
- for GDA, the MotifTechnologies/vllm fork, branch `motif` @ 477e4d79:
  `vllm/v1/attention/backends/grouped_diff_attn.py` (query groups of R + 1 heads with the last one noise, even/odd
  KV pairs, flash-attn GQA within each map, noise output repeat-interleaved over the group's R signal heads) and
  `vllm/model_executor/models/motif.py` (o_proj input width 2·(N − G)·head_dim, head_dim required);
- mlx-motif (junhoyeo/mlx-motif @ 04fb0f8f, `src/mlx_motif/model.py`): the grouped head topology checks and the
  k_ratio = 1 layout; its parity fixture `tests/fixtures/motif_parity_cases.json` (the PolyNorm test vector below).

GDA is chosen by `num_noise_heads` being present and not None in config.json; only k_ratio = 1 is covered.
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
    noise_heads: int | None = None,
    k_ratio: int | None = None,
    validate: bool = True,
) -> Path:
    """A Motif-2-shaped checkpoint folder with random fp32 weights around a real tokenizer (its whole vocabulary):
    config.json, model.safetensors (no lm_head.weight when tied) and the tokenizer files.

    Without `noise_heads` it is Motif-2.6B (V1): o_proj.weight is [hidden, heads·head_dim]. With `noise_heads` = G it
    is Motif-2-12.7B (GDA): config.json also holds `num_noise_heads` = G and `k_ratio` (1 unless given; a given value
    is written as is, so tests can write unsupported ones), `heads` counts all query heads (signal and noise) and
    o_proj.weight is [hidden, 2·(heads − G)·head_dim]; q/k/v are laid out as for k_ratio = 1 whatever k_ratio says.
    `validate=False` skips the head-count checks so that tests can write configs that a loader must refuse."""
    from transformers import AutoTokenizer

    if validate:
        if noise_heads is None:
            if k_ratio is not None:
                raise ValueError("k_ratio is a GDA key and needs noise_heads")
            if heads % 2 or kv_heads % 2 or heads % kv_heads:
                raise ValueError(f"Motif needs even head counts with kv_heads dividing heads, got {heads}/{kv_heads}")
        else:
            if noise_heads <= 0 or heads <= noise_heads or heads % noise_heads:
                raise ValueError(f"GDA needs 0 < noise_heads < heads dividing heads, got {noise_heads}/{heads}")
            if kv_heads % 2:
                raise ValueError(f"GDA needs an even kv_heads, got {kv_heads}")
            if noise_heads % (kv_heads // 2):
                raise ValueError(f"GDA needs noise_heads a multiple of kv_heads / 2, got {noise_heads}/{kv_heads}")
    o_proj_in = heads * head_dim if noise_heads is None else 2 * (heads - noise_heads) * head_dim
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
        tensors[p + "self_attn.o_proj.weight"] = normal(hidden, o_proj_in)
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
    if noise_heads is not None:
        config["num_noise_heads"] = noise_heads
    if noise_heads is not None or k_ratio is not None:
        config["k_ratio"] = 1 if k_ratio is None else k_ratio
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


def reference_logits(folder: Path, input_ids: torch.Tensor, *, noise_repeat: str = "interleave") -> torch.Tensor:
    """The causal LM forward of a Motif-2 checkpoint folder in float64, for input_ids (batch, T) at positions 0..T-1:
    logits (batch, T, vocab), float64. Heads are looped over one at a time.

    With `num_noise_heads` (not None) in config.json the attention is GDA (Motif-2-12.7B, k_ratio = 1 only), else V1
    (Motif-2.6B). `noise_repeat` is there for tests that must fail: "interleave" (the default) is the real model, in
    which signal head j subtracts the noise output of its own group ⌊j / R⌋; "tile" deliberately gives it noise
    output j mod G instead (a wrong repeat). It has no effect on V1, nor on GDA with R = 1 or G = 1."""
    if noise_repeat not in ("interleave", "tile"):
        raise ValueError(f"noise_repeat must be 'interleave' or 'tile', got {noise_repeat!r}")
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    if config.get("rope_scaling"):
        raise NotImplementedError("this reference has plain RoPE only")
    w = {name: t.to(torch.float64) for name, t in load_file(str(folder / "model.safetensors")).items()}

    hidden = config["hidden_size"]
    n_heads = config["num_attention_heads"]  # with GDA: all query heads, signal and noise
    n_kv = config["num_key_value_heads"]
    n_noise = config.get("num_noise_heads")
    grouped = n_noise is not None
    if grouped:
        k_ratio = config.get("k_ratio", 1)
        if k_ratio != 1:
            raise NotImplementedError(f"this reference covers GDA with k_ratio = 1 only, got {k_ratio!r}")
        if config.get("head_dim") is None:
            raise ValueError("GDA (num_noise_heads set) needs head_dim in the config")
        if not (0 < n_noise < n_heads and n_heads % n_noise == 0):
            raise ValueError(
                f"GDA needs 0 < num_noise_heads < num_attention_heads dividing it, got {n_noise}/{n_heads}"
            )
        if n_kv % 2 or n_noise % (n_kv // 2):
            raise ValueError(
                f"GDA needs an even num_key_value_heads with num_noise_heads a multiple of half of it, "
                f"got {n_kv}/{n_noise}"
            )
    d = config.get("head_dim") or hidden // n_heads
    eps = config["rms_norm_eps"]
    attn_eps = config["attn_rms_norm_eps"]
    theta = float(config.get("rope_theta", 10000.0))
    group = n_heads // n_kv  # V1: effective query head j reads effective KV head j // group
    if grouped:
        n_signal = n_heads - n_noise
        per_group = n_signal // n_noise  # R: signal heads per group; a group is R + 1 consecutive query heads
        groups_per_pair = n_noise // (n_kv // 2)  # c: all heads of group g read KV pair g // c
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
        if not grouped:
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
        else:
            # the noise map of each group g: query head g·(R+1) + R over key head 2·pair + 1, both value heads
            noise_out = []
            for g in range(n_noise):
                pair = g // groups_per_pair
                k2 = k[:, :, 2 * pair + 1]
                v1, v2 = v[:, :, 2 * pair], v[:, :, 2 * pair + 1]
                a2 = attend(q[:, :, g * (per_group + 1) + per_group], k2)
                noise_out.append(torch.cat([a2 @ v1, a2 @ v2], dim=-1))  # (B, T, 2d): [V[2p] part | V[2p+1] part]
            # signal head j = g·R + s (query head g·(R+1) + s) over key head 2·pair, minus λ × its group's noise
            for g in range(n_noise):
                pair = g // groups_per_pair
                k1 = k[:, :, 2 * pair]
                v1, v2 = v[:, :, 2 * pair], v[:, :, 2 * pair + 1]
                for s in range(per_group):
                    j = g * per_group + s
                    a1 = attend(q[:, :, g * (per_group + 1) + s], k1)
                    o1 = torch.cat([a1 @ v1, a1 @ v2], dim=-1)
                    source = g if noise_repeat == "interleave" else j % n_noise  # j // R == g; "tile" is wrong
                    o = o1 - lam * noise_out[source]
                    o = rms_norm(o, w[p + "self_attn.subln.weight"], attn_eps) * (1.0 - lambda_init)
                    heads_out.append(o)  # appended in j order
        attn = torch.cat(heads_out, dim=-1)  # effective / signal head j at columns [j·2d, (j+1)·2d)
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
