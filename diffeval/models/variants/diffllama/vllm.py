"""DiffLlama on vLLM: transformers' `DiffLlamaForCausalLM` (Differential Transformer, Ye et al., ICLR 2025) as a vLLM
model, with exactly transformers' math (the equations live in diffeval/models/diff.py):

    DiffAttn(X) = (softmax(Q1 K1ᵀ / √d) − λ · softmax(Q2 K2ᵀ / √d)) · V                      (Eq. 1)
    λ = exp(λq1 · λk1) − exp(λq2 · λk2) + λ_init,  λ_init = 0.8 − 0.6 · exp(−0.3 · layer)    (Eq. 2, 3; fp32 sums)
    head_i = (1 − λ_init) · RMSNorm(DiffAttn_i(X)),  RMSNorm over 2·head_dim, no weight      (Eq. 4)

The config's `sublayer_norm: false` (axolotl) drops the RMSNorm and keeps the (1 − λ_init) factor; its
`sublayer_norm_eps` (diffeval's converter) sets the norm's eps instead of rms_norm_eps (`diff.sublayer_norm`).

Head pairing as in transformers: of the H attention heads, heads [0, H/2) are map 1 and [H/2, H) are map 2, and
differential head i pairs head i with head i + H/2 over a double-width value. That value is KV heads j and
j + Hkv/2 side by side, where j is head i's KV head (GQA groups as usual). Everything else is vLLM's Llama.

Attention over vLLM's paged KV cache: two ordinary `Attention` layers per DIFF layer see the same queries and keys.
The first gets the values as they are, the second the values with their two halves of KV heads swapped. For a head
whose KV head g is in the first half, the two outputs are A·V[g] and A·V[g + Hkv/2]: its double-width value, in
order. For a head in the second half they come the other way round. So map 1 is (first, second) output of heads
[0, H/2), and map 2 is (second, first) output of heads [H/2, H). This is exact and works on every attention backend,
with prefix caching and chunked prefill; it costs twice the KV cache of a Llama of the same shape (K is stored twice),
which vLLM's memory planning counts by itself. A one-call variant, with a value head twice the key head's width,
would need 1.5× the cache but exists only on some GPU backends.

Tensor parallelism would split heads across ranks, and a differential head's two maps must stay on one rank, so this
model refuses tensor_parallel_size > 1.
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.linear import QKVParallelLinear, RowParallelLinear
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from vllm.model_executor.models.utils import extract_layer_index

from diffeval.models.diff import differential_heads, lambda_full, lambda_init, sublayer_norm


class DiffLlamaAttention(nn.Module):
    def __init__(
        self,
        config,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        max_position_embeddings: int = 8192,
        quant_config=None,
        bias: bool = False,
        bias_o_proj: bool = False,
        cache_config=None,
        prefix: str = "",
        attn_type=None,
    ) -> None:
        super().__init__()
        if get_tensor_model_parallel_world_size() != 1:
            raise ValueError(
                "DiffLlama on vLLM runs with tensor_parallel_size 1: a differential head's two maps must stay on one "
                "rank (supporting more needs heads reordered at load time and Hkv divisible by 2 × tp)"
            )
        if num_kv_heads % 2:
            raise ValueError(f"DiffLlama needs an even number of KV heads, got {num_kv_heads}")
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = getattr(config, "head_dim", None) or hidden_size // num_heads
        self.q_size, self.kv_size = num_heads * self.head_dim, num_kv_heads * self.head_dim
        self.lambda_init = lambda_init(extract_layer_index(prefix))  # Eq. 3 with the 0-based layer index
        self.norm, self.eps = sublayer_norm(config)  # axolotl's `sublayer_norm: false` runs without the norm
        self.qkv_proj = QKVParallelLinear(
            hidden_size, self.head_dim, num_heads, num_kv_heads, bias=bias, quant_config=quant_config,
            prefix=f"{prefix}.qkv_proj",
        )  # fmt: skip
        self.o_proj = RowParallelLinear(
            self.q_size, hidden_size, bias=bias_o_proj, quant_config=quant_config, prefix=f"{prefix}.o_proj"
        )
        self.rotary_emb = get_rope(
            self.head_dim,
            max_position=max_position_embeddings,
            rope_parameters=getattr(config, "rope_parameters", None),
            is_neox_style=True,
        )
        attention = dict(num_kv_heads=num_kv_heads, cache_config=cache_config, quant_config=quant_config)
        self.attn = Attention(num_heads, self.head_dim, self.head_dim**-0.5, prefix=f"{prefix}.attn", **attention)
        self.attn_swapped = Attention(
            num_heads, self.head_dim, self.head_dim**-0.5, prefix=f"{prefix}.attn_swapped", **attention
        )
        # Eq. 2's vectors, loaded from the checkpoint under transformers' names
        self.lambda_q1 = nn.Parameter(torch.zeros(self.head_dim))
        self.lambda_k1 = nn.Parameter(torch.zeros(self.head_dim))
        self.lambda_q2 = nn.Parameter(torch.zeros(self.head_dim))
        self.lambda_k2 = nn.Parameter(torch.zeros(self.head_dim))

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        half_kv = self.kv_size // 2
        swapped = torch.cat([v[..., half_kv:], v[..., :half_kv]], dim=-1)
        direct = self.attn(q, k, v).view(-1, self.num_heads, self.head_dim)
        crossed = self.attn_swapped(q, k, swapped).view(-1, self.num_heads, self.head_dim)
        half = self.num_heads // 2
        map1 = torch.cat([direct[:, :half], crossed[:, :half]], dim=-1)  # A1_i · [V_j, V_j+Hkv/2]
        map2 = torch.cat([crossed[:, half:], direct[:, half:]], dim=-1)  # A2_i · [V_j, V_j+Hkv/2]
        lam = lambda_full(self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2, self.lambda_init)
        heads = differential_heads(map1, map2, lam.to(q.dtype), self.lambda_init, self.eps, self.norm)
        output, _ = self.o_proj(heads.reshape(-1, self.q_size))
        return output


class DiffLlamaDecoderLayer(LlamaDecoderLayer):
    """vLLM's Llama layer (norms, residuals, SwiGLU MLP) around the differential attention."""

    def __init__(self, vllm_config, prefix: str = "", config=None) -> None:
        super().__init__(vllm_config, prefix=prefix, config=config, attn_layer_type=DiffLlamaAttention)


class DiffLlamaForCausalLM(LlamaForCausalLM):
    """Weights map from transformers' checkpoint names as for Llama: q/k/v fused into qkv_proj, gate/up into
    gate_up_proj, tied embeddings when the config ties them; λ vectors load as they are."""

    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, layer_type=DiffLlamaDecoderLayer)
