"""The Differential-Transformer math, in one place, beside the paper's equations (Ye et al., ICLR 2025).

    DiffAttn(X) = (softmax(Q1 K1ᵀ / √d) − λ · softmax(Q2 K2ᵀ / √d)) · V                      (Eq. 1)
    λ = exp(λq1 · λk1) − exp(λq2 · λk2) + λ_init                                           (Eq. 2)
    λ_init = 0.8 − 0.6 · exp(−0.3 · (l − 1)),  l = 1 … L                                    (Eq. 3)
    head_i = (1 − λ_init) · RMSNorm(DiffAttn_i(X))                                          (Eq. 4)

In transformers' DiffLlama (`modeling_diffllama.py`) a layer with H attention heads runs standard attention
twice: heads [0, H/2) of the outputs are map 1 and heads [H/2, H) are map 2, and differential head i pairs
head i with head i + H/2 over a double-width value. Layers are 0-indexed there, so `λ_init(layer_idx)` below
takes the 0-based index (l − 1 in the paper). Rows of the differential map sum to 1 − λ and single weights
may be negative.

Differential Transformer V2 (microsoft/unilm, `Diff-Transformer/Diff-Transformer-V2/multihead_flashdiffv2.py`) keeps
one standard causal attention with 2h query heads of head_dim over h_kv key/value heads (GQA) and subtracts adjacent
query heads of its output, with a λ per token and head projected from the attention's input x:

    λ_t = sigmoid(W_λ · x_t)                       W_λ: lambda_proj, (h, d_model), no bias           (V2 λ)
    head_i(t) = softmax(Q_2i Kᵀ / √d)_t · V − λ_t,i · softmax(Q_2i+1 Kᵀ / √d)_t · V               (V2 head)

No λ_init, no (1 − λ_init) factor and no per-head RMSNorm; the h heads go to o_proj as they are. Query heads 2i and
2i + 1 read the same KV head whenever h_kv divides h (GQA groups 2h / h_kv consecutive query heads per KV head), so
the KV cache is a baseline's with h_kv heads. diffeval's V2 is `models/variants/diffllama2/modeling.py`.

Motif-2.6B (Motif Technologies; vLLM's `models/motif.py` at v0.10.2, the reference diffeval follows, see
docs/engines/motif.md) is DIFF V1 with three differences: query, key and value heads pair as adjacent heads (2i, 2i + 1)
rather than halves, the per-head RMSNorm (`subln`) has a learned weight, and λ_init takes the 0-based layer index minus
one, so its first layer starts at 0.8 − 0.6·e^0.3 ≈ −0.0099:

    λ_init = 0.8 − 0.6 · exp(−0.3 · (layer_idx − 1)),  layer_idx = 0 … L − 1                    (Motif λ_init)

Its MLP is down(PolyNorm(gate(x)) ⊙ up(x)), with one PolyNorm per layer (3 weights and a bias, no per-channel scale):

    PolyNorm(u) = w0 · n(u³) + w1 · n(u²) + w2 · n(u) + b,   n(z) = z / √(mean(z²) + 1e-6)          (PolyNorm)

Which configs are which variant, and which function here each variant's engines and analyses call, is the registry's
(models/variants/registry.py).
"""

from __future__ import annotations

import math
from typing import Any

import torch


def lambda_init(layer_idx: int) -> float:
    """Eq. 3 with a 0-based layer index."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer_idx)


def motif_lambda_init(layer_idx: int) -> float:
    """Motif's λ_init, with the 0-based layer index as vLLM's `extract_layer_index` gives it."""
    return 0.8 - 0.6 * math.exp(-0.3 * (layer_idx - 1))


def motif_maps(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, noise_heads: int | None = None):
    """Motif's head groups in DiffLlama's layout, for one attention call over both maps (heads on dim 1).

    query (B, N, T, d), key and value (B, N_kv, T, d). The N query heads form G = `noise_heads` groups of R + 1
    consecutive heads, R = (N − G)/G signal heads then one noise head (grouped differential attention, Motif-2-12.7B);
    G = N/2 (R = 1, adjacent pairs: map 1 the even heads, map 2 the odd ones) is Motif-2.6B. The KV heads pair up,
    (2p, 2p + 1), and every head of group g reads pair p = g // (G / (N_kv/2)): signal heads the even key, the noise
    head the odd one, each map over the pair's double-width value [v_2p | v_2p+1].

    Returns 2S heads (S = N − G signal heads) of queries, keys and values, one key per query (no GQA grouping left):
    [0, S) is map 1, signal head j, and [S, 2S) map 2, the noise head of j's group repeated over its R signal heads,
    as a DIFF map splits in DiffLlama (`split_differential`). The repeat interleaves: signal head j meets noise head
    j // R, never j % G."""
    heads, kv_heads = query.shape[1], key.shape[1]
    groups = noise_heads or heads // 2
    per_group = (heads - groups) // groups  # R
    pairs_per_group = groups // (kv_heads // 2)  # groups that read one KV pair
    signal = [g * (per_group + 1) + s for g in range(groups) for s in range(per_group)]
    group_of = [j // per_group for j in range(len(signal))]
    noise = [g * (per_group + 1) + per_group for g in group_of]
    pair = [g // pairs_per_group for g in group_of]

    def pick(x: torch.Tensor, index: list[int]) -> torch.Tensor:
        return x.index_select(1, torch.tensor(index, device=x.device))

    pairs = torch.cat(
        [pick(value, [2 * p for p in range(kv_heads // 2)]), pick(value, [2 * p + 1 for p in range(kv_heads // 2)])], -1
    )
    return (
        pick(query, signal + noise),
        pick(key, [2 * p for p in pair] + [2 * p + 1 for p in pair]),
        pick(pairs, pair + pair),
    )


def poly_norm(u: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Motif's PolyNorm over the last dim, in fp32 and cast back; weight[0] scales the cube, weight[2] u itself."""
    x = u.float()

    def n(z: torch.Tensor) -> torch.Tensor:
        return z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + eps)

    w = weight.float()
    return (w[0] * n(x**3) + w[1] * n(x**2) + w[2] * n(x) + bias.float()).to(u.dtype)


@torch.no_grad()
def learned_lambda(attention: Any) -> float:  # a DiffLlama attention module: its λ parameters are attributes
    """Eq. 2 for one DiffLlama attention module: its current, learned λ."""
    lambda_1 = torch.exp(torch.sum(attention.lambda_q1.float() * attention.lambda_k1.float()))
    lambda_2 = torch.exp(torch.sum(attention.lambda_q2.float() * attention.lambda_k2.float()))
    return float(lambda_1 - lambda_2 + attention.lambda_init)


def layer_lambdas(model: Any) -> list[dict[str, float]]:  # a transformers DiffLlama model
    """λ_init and learned λ of every layer of a DiffLlama model."""
    layers = model.get_decoder().layers
    return [
        {"layer": i, "lambda_init": float(layer.self_attn.lambda_init), "lambda": learned_lambda(layer.self_attn)}
        for i, layer in enumerate(layers)
    ]


def differential_map(
    q1: torch.Tensor,
    k1: torch.Tensor,
    q2: torch.Tensor,
    k2: torch.Tensor,
    lam: float | torch.Tensor,
    scaling: float | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Eq. 1 without V: softmax(Q1K1ᵀ·s) − λ·softmax(Q2K2ᵀ·s), s = 1/√d unless given.

    Shapes: q (..., rows, d), k (..., keys, d); `mask` is boolean (True = may attend), broadcastable to
    (..., rows, keys). Returns the (..., rows, keys) differential weights.
    """
    scaling = q1.shape[-1] ** -0.5 if scaling is None else scaling
    return attention_map(q1, k1, scaling, mask) - lam * attention_map(q2, k2, scaling, mask)


def attention_map(q: torch.Tensor, k: torch.Tensor, scaling: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(QKᵀ·s) over the keys, masked positions excluded."""
    logits = (q @ k.transpose(-1, -2)) * scaling
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    return torch.softmax(logits.float(), dim=-1)


def lambda_full(
    lambda_q1: torch.Tensor, lambda_k1: torch.Tensor, lambda_q2: torch.Tensor, lambda_k2: torch.Tensor, lam_init: float
) -> torch.Tensor:
    """Eq. 2 as transformers' DiffLlama computes it in a forward pass: products in the parameters' dtype, sums and exp
    in fp32, the result cast back."""
    lambda_1 = torch.exp(torch.sum(lambda_q1 * lambda_k1, dim=-1, dtype=torch.float32)).to(lambda_q1.dtype)
    lambda_2 = torch.exp(torch.sum(lambda_q2 * lambda_k2, dim=-1, dtype=torch.float32)).to(lambda_q1.dtype)
    return lambda_1 - lambda_2 + lam_init


def differential_heads(
    map1: torch.Tensor,
    map2: torch.Tensor,
    lam: torch.Tensor,
    lam_init: float,
    eps: float | None,  # the norm's eps; None: torch's default (a norm module's unset eps)
    norm: bool = True,
    norm_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Eq. 1 and Eq. 4 on attention outputs: (1 − λ_init) · RMSNorm(A1·V − λ · A2·V).

    `map1` and `map2` are (..., H/2, 2·head_dim): differential head i's two softmax maps applied to its double-width
    value. The RMSNorm runs over the 2·head_dim features of each head, without a weight (DiffLlama) or with
    `norm_weight` (Motif's subln, in fp32 as vLLM's RMSNorm computes it). `norm=False` is axolotl's
    `sublayer_norm: false`: the norm becomes the identity and the (1 − λ_init) factor stays.
    """
    heads = map1 - lam * map2
    if norm_weight is not None:
        normed = torch.nn.functional.rms_norm(heads.float(), (heads.shape[-1],), eps=eps)
        heads = (normed * norm_weight.float()).to(heads.dtype)
    elif norm:
        heads = torch.nn.functional.rms_norm(heads, (map1.shape[-1],), eps=eps)
    return (1 - lam_init) * heads


# Config keys that change a DiffLlama's per-head norm (Eq. 4), read by both engines:
#   sublayer_norm      axolotl's converter (axolotl-ai-cloud/diff-transformer, plugin/convert.py) writes it; false
#                      replaces the norm by the identity. Stock transformers ignores the key and keeps the norm.
#   sublayer_norm_eps  diffeval's converter writes it where the trained norm's eps (the paper's subln: 1e-5) is not
#                      the config's rms_norm_eps, which transformers' DiffLlama uses for that norm.
# axolotl's other keys (split_heads, zero_init, mirror_weights) only choose how the converted weights were initialised.
AXOLOTL_INIT_KEYS = ("split_heads", "zero_init", "mirror_weights")


def sublayer_norm(config) -> tuple[bool, float]:
    """Whether a DiffLlama config's layers normalise each differential head (Eq. 4), and with which eps."""
    eps = getattr(config, "sublayer_norm_eps", None)
    return bool(getattr(config, "sublayer_norm", True)), float(config.rms_norm_eps if eps is None else eps)


def split_differential(head_shares: torch.Tensor, lam: float) -> dict[str, torch.Tensor]:
    """Per-head attention quantities of one DiffLlama layer → map 1, map 2 and the differential map.

    `head_shares` has the H attention heads first (any trailing shape: rows, segments, ...). Heads [0, H/2) are map 1
    and [H/2, H) map 2; differential head i is A1_i − λ·A2_i. Sums over key segments are linear in the weights, so
    the differential share of a segment is the map-1 share minus λ times the map-2 share.
    """
    half = head_shares.shape[0] // 2
    map1, map2 = head_shares[:half], head_shares[half:]
    return {"A1": map1, "A2": map2, "diff": map1 - lam * map2}


def v2_lambda(x: torch.Tensor, lambda_proj_weight: torch.Tensor) -> torch.Tensor:
    """V2 λ: sigmoid(x · W_λᵀ), per token and differential head. x (..., d_model), W_λ (h, d_model) → (..., h)."""
    return torch.sigmoid(torch.nn.functional.linear(x, lambda_proj_weight))


def v2_combine(attn_output: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """V2 head: the output of query head 2i minus λ times that of query head 2i + 1 (adjacent heads pair up).

    `attn_output` is the attention output laid out as transformers' attention interface returns it,
    (batch, seq, 2h, head_dim); `lam` is (batch, seq, h) from `v2_lambda`. Returns (batch, seq, h, head_dim).
    """
    return attn_output[..., 0::2, :] - lam.unsqueeze(-1) * attn_output[..., 1::2, :]


def split_differential_v2(head_shares: torch.Tensor, row_lambdas: torch.Tensor) -> dict[str, torch.Tensor]:
    """V2's maps from per-query-head shares (2h, rows, ...): A1 = query heads 2i, A2 = query heads 2i + 1, and
    A1 − λ·A2 with each differential head's λ at each row, `row_lambdas` (h, rows)."""
    map1, map2 = head_shares[0::2], head_shares[1::2]
    lam = row_lambdas.reshape(row_lambdas.shape + (1,) * (map2.ndim - row_lambdas.ndim))
    return {"A1": map1, "A2": map2, "diff": map1 - lam * map2}


def v2_layer_lambdas(model: Any, input_ids: torch.Tensor) -> list[dict[str, float]]:  # a transformers V2 model
    """V2's λ = sigmoid(W_λ · x) per layer over a probe text: mean, standard deviation, min and max over its tokens
    and heads. x is what each layer's attention receives, caught by a forward pre-hook during one forward pass."""
    layers = model.get_decoder().layers
    caught: dict[int, torch.Tensor] = {}

    def catch(index: int):
        def hook(module, args, kwargs):
            x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            caught[index] = v2_lambda(x.float(), module.lambda_proj.weight.float())

        return hook

    handles = [layer.self_attn.register_forward_pre_hook(catch(i), with_kwargs=True) for i, layer in enumerate(layers)]
    try:
        with torch.inference_mode():
            model.get_decoder()(input_ids=input_ids, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return [
        {"layer": i, **{stat: float(getattr(lam, stat)()) for stat in ("mean", "std", "min", "max")}}
        for i, lam in sorted(caught.items())
    ]
