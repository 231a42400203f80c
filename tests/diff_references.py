"""Reference forward passes written for the tests from the source files' own equations and tensor layouts, sharing
nothing with diffeval's conversion code:

- the paper's V1 modules (microsoft/unilm Diff-Transformer/multihead_diffattn.py, multihead_flashdiff_1.py,
  multihead_flashdiff_2.py) and its V2 module (Diff-Transformer-V2/multihead_flashdiffv2.py), each inside a Llama
  block (pre-norm RMSNorm with weight, residuals, SwiGLU MLP, final norm, lm_head), rotary interleaved as the files'
  `apply_rotary_emb(..., interleaved=True)`;
- transformers' DiffLlama attention as axolotl's converter (axolotl-ai-cloud/diff-transformer, plugin/convert.py)
  leaves it: with `sublayer_norm: false` its `groupnorm` is `nn.Identity()` and the (1 − λ_init) factor stays.

Every function takes a plain state dict (name → tensor) and a config dict and runs in fp32, one head at a time;
`diffllama_logits` and `diffllama2_logits` read a checkpoint folder of transformers' DiffLlama (V1) and of diffeval's
DiffLlama2 (V2), the parity suite's references for the two (tests/test_parity.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file


def lambda_init(depth: int) -> float:
    return 0.8 - 0.6 * math.exp(-0.3 * depth)


def rms(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return out if weight is None else out * weight


def angles(length: int, dim: int, theta: float) -> torch.Tensor:
    """(T, d/2): position · θ^(−2j/d)."""
    return torch.arange(length).float()[:, None] * theta ** (-torch.arange(0, dim, 2).float() / dim)


def rope_interleaved(x: torch.Tensor, theta: float) -> torch.Tensor:
    """flash-attn's interleaved rotary on (B, T, heads, d): features 2j and 2j + 1 turn together."""
    a = angles(x.shape[1], x.shape[-1], theta)[None, :, None]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x0 * a.cos() - x1 * a.sin()
    out[..., 1::2] = x0 * a.sin() + x1 * a.cos()
    return out


def rope_rotate_half(x: torch.Tensor, theta: float) -> torch.Tensor:
    """transformers' rotary on (B, T, heads, d): feature j turns with j + d/2."""
    a = angles(x.shape[1], x.shape[-1], theta)[None, :, None]
    half = x.shape[-1] // 2
    x0, x1 = x[..., :half], x[..., half:]
    return torch.cat([x0 * a.cos() - x1 * a.sin(), x0 * a.sin() + x1 * a.cos()], dim=-1)


def softmax_map(q: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q kᵀ / √d) for one head: q, k (B, T, d) → (B, T, T); causal, or over the keys `allowed` (B, T, T)
    lets each query see (a padded batch)."""
    length = q.shape[1]
    logits = q @ k.transpose(1, 2) * q.shape[-1] ** -0.5
    if allowed is None:
        allowed = torch.ones(length, length, dtype=torch.bool).tril()
    return torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)


def _lambda(p: dict, prefix: str, depth: int) -> torch.Tensor:
    lambda_1 = torch.exp(torch.sum(p[prefix + "lambda_q1"] * p[prefix + "lambda_k1"], dim=-1))
    lambda_2 = torch.exp(torch.sum(p[prefix + "lambda_q2"] * p[prefix + "lambda_k2"], dim=-1))
    return lambda_1 - lambda_2 + lambda_init(depth)


def _paper_v1_projections(p: dict, prefix: str, x: torch.Tensor, theta: float):
    """The three V1 files' common start: q (B, T, 2h, d), k (B, T, 2h_kv, d), v (B, T, h_kv, 2d), rotary applied."""
    d = p[prefix + "lambda_q1"].shape[0]
    batch, length, _ = x.shape
    q = (x @ p[prefix + "q_proj.weight"].T).view(batch, length, -1, d)
    k = (x @ p[prefix + "k_proj.weight"].T).view(batch, length, -1, d)
    v = (x @ p[prefix + "v_proj.weight"].T).view(batch, length, -1, 2 * d)
    return rope_interleaved(q, theta), rope_interleaved(k, theta), v


def _paper_v1_output(p: dict, prefix: str, heads: list[torch.Tensor], depth: int) -> torch.Tensor:
    """subln (RMSNorm over 2d, eps 1e-5, learnable weight), × (1 − λ_init), concatenated heads, out_proj."""
    normed = [rms(head, p[prefix + "subln.weight"], 1e-5) * (1 - lambda_init(depth)) for head in heads]
    return torch.cat(normed, dim=-1) @ p[prefix + "out_proj.weight"].T


def multihead_diffattn(p: dict, prefix: str, x: torch.Tensor, depth: int, theta: float) -> torch.Tensor:
    """multihead_diffattn.py: repeat_kv turns 2h_kv key heads into 2h (query head j reads key head j // n_rep), the
    2h softmax maps are viewed as (h, 2), and head i is (A_2i − λ·A_2i+1) · V[i // n_rep]."""
    q, k, v = _paper_v1_projections(p, prefix, x, theta)
    h, h_kv = q.shape[2] // 2, v.shape[2]
    n_rep = h // h_kv
    lam = _lambda(p, prefix, depth)
    maps = [softmax_map(q[:, :, j], k[:, :, j // n_rep]) for j in range(2 * h)]
    heads = [(maps[2 * i] - lam * maps[2 * i + 1]) @ v[:, :, i // n_rep] for i in range(h)]
    return _paper_v1_output(p, prefix, heads, depth)


def multihead_flashdiff_1(p: dict, prefix: str, x: torch.Tensor, depth: int, theta: float) -> torch.Tensor:
    """multihead_flashdiff_1.py: q as (h, 2, d) and k as (h_kv, 2, d); flash attention's GQA sends query head i of
    each half to key head i // n_rep of that half; both calls use the 2d-wide value head i // n_rep."""
    q, k, v = _paper_v1_projections(p, prefix, x, theta)
    h, h_kv = q.shape[2] // 2, v.shape[2]
    n_rep = h // h_kv
    q1, q2 = q[:, :, 0::2], q[:, :, 1::2]
    k1, k2 = k[:, :, 0::2], k[:, :, 1::2]
    lam = _lambda(p, prefix, depth)
    heads = []
    for i in range(h):
        g = i // n_rep
        attn1 = softmax_map(q1[:, :, i], k1[:, :, g]) @ v[:, :, g]
        attn2 = softmax_map(q2[:, :, i], k2[:, :, g]) @ v[:, :, g]
        heads.append(attn1 - lam * attn2)
    return _paper_v1_output(p, prefix, heads, depth)


def multihead_flashdiff_2(p: dict, prefix: str, x: torch.Tensor, depth: int, theta: float) -> torch.Tensor:
    """multihead_flashdiff_2.py: as flashdiff_1, with v viewed as (h_kv, 2, d) and four calls (A1·v1, A1·v2, A2·v1,
    A2·v2), each pair concatenated."""
    q, k, v = _paper_v1_projections(p, prefix, x, theta)
    d = q.shape[-1]
    h, h_kv = q.shape[2] // 2, v.shape[2]
    n_rep = h // h_kv
    v1, v2 = v[..., :d], v[..., d:]
    lam = _lambda(p, prefix, depth)
    heads = []
    for i in range(h):
        g = i // n_rep
        map1 = softmax_map(q[:, :, 2 * i], k[:, :, 2 * g])
        map2 = softmax_map(q[:, :, 2 * i + 1], k[:, :, 2 * g + 1])
        attn1 = torch.cat([map1 @ v1[:, :, g], map1 @ v2[:, :, g]], dim=-1)
        attn2 = torch.cat([map2 @ v1[:, :, g], map2 @ v2[:, :, g]], dim=-1)
        heads.append(attn1 - lam * attn2)
    return _paper_v1_output(p, prefix, heads, depth)


def multihead_flashdiffv2(
    p: dict, prefix: str, x: torch.Tensor, depth: int, theta: float, rope=rope_interleaved, allowed=None
) -> torch.Tensor:
    """multihead_flashdiffv2.py: one flash attention with 2h query heads over h_kv KV heads (query head j reads KV head
    j // (2h / h_kv)), then out[0::2] − sigmoid(lambda_proj(x)) · out[1::2], o_proj. `rope` is the file's interleaved
    rotary unless given (diffeval's DiffLlama2 rotates halves, as transformers does); `allowed` as in `softmax_map`."""
    h = p[prefix + "lambda_proj.weight"].shape[0]
    batch, length, _ = x.shape
    q = (x @ p[prefix + "q_proj.weight"].T).view(batch, length, 2 * h, -1)
    d = q.shape[-1]
    k = (x @ p[prefix + "k_proj.weight"].T).view(batch, length, -1, d)
    v = (x @ p[prefix + "v_proj.weight"].T).view(batch, length, -1, d)
    q, k = rope(q, theta), rope(k, theta)
    per_kv = 2 * h // k.shape[2]
    out = [softmax_map(q[:, :, j], k[:, :, j // per_kv], allowed) @ v[:, :, j // per_kv] for j in range(2 * h)]
    lam = torch.sigmoid(x @ p[prefix + "lambda_proj.weight"].T)  # (B, T, h)
    heads = [out[2 * i] - lam[:, :, i : i + 1] * out[2 * i + 1] for i in range(h)]
    return torch.cat(heads, dim=-1) @ p[prefix + "o_proj.weight"].T


def axolotl_diffllama(norm: bool):
    """transformers' DiffLlama attention as axolotl's converter leaves it: H heads over Hkv KV heads (head a reads KV
    head a // (H / Hkv)), the values' two halves of KV heads each repeated to Hkv, heads [0, H/2) minus λ times heads
    [H/2, H) over the concatenated value, `groupnorm` (weightless RMSNorm over 2d, eps rms_norm_eps) or, with
    `sublayer_norm: false`, nn.Identity(); then × (1 − λ_init) and o_proj."""

    def attention(p: dict, prefix: str, x: torch.Tensor, depth: int, theta: float, eps: float) -> torch.Tensor:
        d = p[prefix + "lambda_q1"].shape[0]
        batch, length, _ = x.shape
        q = rope_rotate_half((x @ p[prefix + "q_proj.weight"].T).view(batch, length, -1, d), theta)
        k = rope_rotate_half((x @ p[prefix + "k_proj.weight"].T).view(batch, length, -1, d), theta)
        v = (x @ p[prefix + "v_proj.weight"].T).view(batch, length, -1, d)
        heads, kv_heads = q.shape[2], k.shape[2]
        value1 = torch.cat([v[:, :, : kv_heads // 2]] * 2, dim=2)
        value2 = torch.cat([v[:, :, kv_heads // 2 :]] * 2, dim=2)
        group = heads // kv_heads
        out = []
        for a in range(heads):
            weights = softmax_map(q[:, :, a], k[:, :, a // group])
            out.append(torch.cat([weights @ value1[:, :, a // group], weights @ value2[:, :, a // group]], dim=-1))
        lam = _lambda(p, prefix, depth)
        diff = [out[i] - lam * out[i + heads // 2] for i in range(heads // 2)]
        diff = [rms(head, None, eps) if norm else head for head in diff]
        return torch.cat([(1 - lambda_init(depth)) * head for head in diff], dim=-1) @ p[prefix + "o_proj.weight"].T

    return attention


def llama_logits(p: dict, config: dict, attention, ids: torch.Tensor, **attention_kwargs) -> torch.Tensor:
    """A Llama around `attention(p, "model.layers.N.self_attn.", x, N, rope_theta, ...)`: (B, T) ids → logits."""
    eps = config.get("rms_norm_eps", 1e-6)
    theta = (config.get("rope_parameters") or {}).get("rope_theta", config.get("rope_theta", 10000.0))
    x = p["model.embed_tokens.weight"][ids]
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        normed = rms(x, p[prefix + "input_layernorm.weight"], eps)
        x = x + attention(p, prefix + "self_attn.", normed, layer, theta, **attention_kwargs)
        normed = rms(x, p[prefix + "post_attention_layernorm.weight"], eps)
        gate, up = normed @ p[prefix + "mlp.gate_proj.weight"].T, normed @ p[prefix + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ p[prefix + "mlp.down_proj.weight"].T
    x = rms(x, p["model.norm.weight"], eps)
    return x @ p.get("lm_head.weight", p["model.embed_tokens.weight"]).T


PAPER_MODULES = {
    "diffattn": multihead_diffattn,
    "flashdiff1": multihead_flashdiff_1,
    "flashdiff2": multihead_flashdiff_2,
    "v2": multihead_flashdiffv2,
}


def checkpoint(folder: Path | str) -> tuple[dict, dict]:
    """A checkpoint folder's state dict (model.safetensors) and config (config.json)."""
    folder = Path(folder)
    return load_file(folder / "model.safetensors"), json.loads((folder / "config.json").read_text())


@torch.no_grad()
def diffllama_logits(folder: Path | str, ids: torch.Tensor, norm: bool = True) -> torch.Tensor:
    """A transformers DiffLlama checkpoint (DIFF V1) through `axolotl_diffllama`: (B, T) ids → logits; `norm=False`
    is axolotl's `sublayer_norm: false`."""
    p, config = checkpoint(folder)
    return llama_logits(p, config, axolotl_diffllama(norm), ids, eps=config["rms_norm_eps"])


@torch.no_grad()
def diffllama2_logits(folder: Path | str, ids: torch.Tensor) -> torch.Tensor:
    """A DiffLlama2 checkpoint (DIFF V2 in diffeval's layout: the paper's tensor names, transformers' rotate-half
    rotary) through `multihead_flashdiffv2`: (B, T) ids → logits."""
    p, config = checkpoint(folder)
    return llama_logits(p, config, multihead_flashdiffv2, ids, rope=rope_rotate_half)
