"""diff.py's Differential-Transformer math against transformers' DiffLlama, the reference implementation.

The main test runs a real `DiffLlamaAttention` (eager, fp32, random weights and random λ vectors) and assembles the
same layer output from diff.py alone: per-head maps (`attention_map`), the head pairing (`split_differential`), λ
(`lambda_full`, `lambda_init`) and the normalised differential heads (`differential_heads`). Only the projections and
RoPE come from the module; the test lays out the GQA keys and the double-width values. No expected value below
depends on the random draw.
"""

import pytest
import torch
from transformers import DiffLlamaConfig
from transformers.models.diffllama.modeling_diffllama import (
    DiffLlamaAttention,
    DiffLlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from diffeval.models.checkpoints.loading import load_model
from diffeval.models.diff import (
    attention_map,
    differential_heads,
    differential_map,
    lambda_full,
    lambda_init,
    layer_lambdas,
    learned_lambda,
    split_differential,
)
from diffeval.models.spec import ModelSpec

# every test here touches transformers' internals: .ci/run runs them again at the low end of its range
pytestmark = pytest.mark.transformers_floor

# fp32 throughout: both sides do the same operations in a different order, so they differ by rounding only
FP32 = {"atol": 1e-5, "rtol": 1e-5}


def _attention(heads: int, kv_heads: int, head_dim: int, layer_idx: int) -> DiffLlamaAttention:
    config = DiffLlamaConfig(
        hidden_size=64,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
    )
    config._attn_implementation = "eager"
    attention = DiffLlamaAttention(config, layer_idx=layer_idx).eval()
    with torch.no_grad():  # λ away from its initialisation: each product sum is O(1), not O(0.01)
        for vector in (attention.lambda_q1, attention.lambda_k1, attention.lambda_q2, attention.lambda_k2):
            vector.copy_(0.4 * torch.randn(head_dim))
    return attention


def _masks(batch: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal, plus right padding of the last 3 keys in batch row 1 (no query row is left without a key).

    Returns the boolean mask diff.py takes (True = may attend) and transformers' additive one, both (B, 1, T, T)."""
    allowed = torch.ones(batch, 1, length, length, dtype=torch.bool).tril()
    allowed[1, :, :, length - 3 :] = False
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    return allowed, additive


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim"),
    [(4, 4, 16), (8, 2, 16), (8, 4, 32)],
    ids=["mha", "gqa-4-per-kv", "gqa-2-per-kv"],
)
@pytest.mark.parametrize("layer_idx", [0, 3, 11])
def test_diff_functions_reproduce_diffllama_attention_forward(heads, kv_heads, head_dim, layer_idx):
    torch.manual_seed(1000 * heads + 100 * kv_heads + layer_idx)
    attention = _attention(heads, kv_heads, head_dim, layer_idx)
    batch, length = 2, 9
    hidden = torch.randn(batch, length, attention.config.hidden_size)
    position_ids = torch.arange(length).expand(batch, length)
    cos, sin = DiffLlamaRotaryEmbedding(attention.config)(hidden, position_ids)
    allowed, additive = _masks(batch, length)

    with torch.no_grad():
        expected, expected_maps = attention(hidden, (cos, sin), attention_mask=additive)

        # inputs from the module: projections, RoPE, (B, heads, T, head_dim) layout
        q = attention.q_proj(hidden).view(batch, length, heads, head_dim).transpose(1, 2)
        k = attention.k_proj(hidden).view(batch, length, kv_heads, head_dim).transpose(1, 2)
        v = attention.v_proj(hidden).view(batch, length, kv_heads, head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        group = heads // kv_heads
        k = k.repeat_interleave(group, dim=1)  # GQA: attention head h reads KV head h // group
        # DiffLlama's double-width value: KV head j beside KV head j + kv_heads/2 (B, kv_heads/2, T, 2·head_dim),
        # then one per differential head, which reads it through its map-1 head i (< heads/2): pair i // group
        value = torch.cat(v.chunk(2, dim=1), dim=-1).repeat_interleave(group, dim=1)

        # everything else from diff.py
        maps = attention_map(q, k, head_dim**-0.5, allowed)  # (B, H, T, T)
        lam_init = lambda_init(layer_idx)
        lam = lambda_full(attention.lambda_q1, attention.lambda_k1, attention.lambda_q2, attention.lambda_k2, lam_init)
        pairs = split_differential(maps.transpose(0, 1), lam)  # heads first: (H/2, B, T, T) each
        map1 = (pairs["A1"].transpose(0, 1) @ value).transpose(1, 2)  # (B, T, H/2, 2·head_dim)
        map2 = (pairs["A2"].transpose(0, 1) @ value).transpose(1, 2)
        heads_out = differential_heads(map1, map2, lam, lam_init, attention.config.rms_norm_eps)
        actual = attention.o_proj(heads_out.reshape(batch, length, heads * head_dim))

        # the differential map of paired queries/keys is transformers' map of head i minus λ · that of head i + H/2
        half = heads // 2
        diff = differential_map(q[:, :half], k[:, :half], q[:, half:], k[:, half:], lam, mask=allowed)
        reference_diff = split_differential(expected_maps.transpose(0, 1), lam)["diff"].transpose(0, 1)

    assert lam_init == pytest.approx(attention.lambda_init, abs=1e-12)
    assert learned_lambda(attention) == pytest.approx(float(lam), abs=1e-6)
    torch.testing.assert_close(maps, expected_maps, **FP32)
    torch.testing.assert_close(diff, reference_diff, **FP32)
    torch.testing.assert_close(actual, expected, **FP32)


def test_rows_of_the_differential_map_sum_to_one_minus_lambda():
    torch.manual_seed(0)
    q1, k1, q2, k2 = torch.randn(4, 3, 6, 8)
    allowed = torch.ones(6, 6, dtype=torch.bool).tril()
    for lam in (0.8, 0.35, -0.2):
        weights = differential_map(q1, k1, q2, k2, lam, mask=allowed)
        torch.testing.assert_close(weights.sum(-1), torch.full((3, 6), 1 - lam), **FP32)
        assert torch.all(weights.masked_select(~allowed) == 0)


def test_single_differential_weights_can_be_negative():
    """Map 1 uniform over 5 keys, map 2 all on key 0 (logit gap 64 → weight 1 to fp32): key 0 gets 1/5 − λ."""
    q1, k1 = torch.zeros(1, 4), torch.zeros(5, 4)
    q2 = torch.tensor([[8.0, 0.0, 0.0, 0.0]])
    k2 = torch.zeros(5, 4)
    k2[0, 0] = 16.0  # logit 8 · 16 · 4^-0.5 = 64
    weights = differential_map(q1, k1, q2, k2, 0.8)
    torch.testing.assert_close(weights, torch.tensor([[0.2 - 0.8, 0.2, 0.2, 0.2, 0.2]]), **FP32)


def test_layer_lambdas_are_the_lambdas_each_layers_forward_uses(tiny_models):
    loaded = load_model(ModelSpec("diff", str(tiny_models["diff"])), "cpu")
    rows = layer_lambdas(loaded.model)
    layers = loaded.model.model.layers
    assert [r["layer"] for r in rows] == list(range(len(layers))) == [0, 1]
    for row, layer in zip(rows, layers, strict=True):
        attention = layer.self_attn
        # lambda_full and lambda_init are the ones checked against DiffLlamaAttention.forward above
        forward_lambda = lambda_full(
            attention.lambda_q1, attention.lambda_k1, attention.lambda_q2, attention.lambda_k2, attention.lambda_init
        )
        assert row["lambda"] == pytest.approx(float(forward_lambda.detach()), abs=1e-6)
        assert row["lambda_init"] == pytest.approx(lambda_init(row["layer"]), abs=1e-12)
    assert loaded.info.is_diff and loaded.info.lambdas == rows
