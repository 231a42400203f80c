"""DiffLlama2 on vLLM: diffeval's Differential Transformer V2 (`modeling.py` beside this file) as a vLLM model, with
exactly its math (the equations live in diffeval/models/diff.py):

    λ_t = sigmoid(W_λ · x_t)                                                           (V2 λ, lambda_proj, no bias)
    head_i(t) = softmax(Q_2i Kᵀ / √d)_t · V − λ_t,i · softmax(Q_2i+1 Kᵀ / √d)_t · V       (V2 head)

Each layer is vLLM's Llama layer (norms, residuals, SwiGLU MLP) around one ordinary vLLM `Attention` with 2h query
heads of head_dim over h_kv KV heads (h = `num_attention_heads`), rotate-half RoPE as vLLM's Llama. The attention
output, (tokens, 2h · head_dim), is read as (tokens, 2h, head_dim); `diff.v2_combine` subtracts λ times query head
2i + 1 from query head 2i, and the h heads go to o_proj as they are. The KV cache is a Llama's with h_kv heads: one
attention call per layer, on every attention backend, with prefix caching and chunked prefill.

Weights load under the checkpoint's names as for Llama: q/k/v fused into qkv_proj (q_proj's 2h heads are the query
shard), gate/up into gate_up_proj, tied embeddings when the config ties them; `self_attn.lambda_proj.weight` (h,
d_model) loads as it is.

Tensor parallelism would split the query heads over ranks but not λ's heads, so this model refuses
tensor_parallel_size > 1.
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.linear import QKVParallelLinear, RowParallelLinear
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.models.llama import LlamaDecoderLayer, LlamaForCausalLM

from diffeval.models.diff import v2_combine, v2_lambda


class DiffLlama2Attention(nn.Module):
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
                "DiffLlama2 on vLLM runs with tensor_parallel_size 1: a differential head's two query heads and its "
                "λ must stay on one rank"
            )
        if (2 * num_heads) % num_kv_heads:
            raise ValueError(f"DiffLlama2's 2 × {num_heads} query heads do not split over {num_kv_heads} KV heads")
        self.num_heads, self.num_query_heads, self.num_kv_heads = num_heads, 2 * num_heads, num_kv_heads
        self.head_dim = getattr(config, "head_dim", None) or hidden_size // num_heads
        self.q_size, self.kv_size = self.num_query_heads * self.head_dim, num_kv_heads * self.head_dim
        self.qkv_proj = QKVParallelLinear(
            hidden_size, self.head_dim, self.num_query_heads, num_kv_heads, bias=bias, quant_config=quant_config,
            prefix=f"{prefix}.qkv_proj",
        )  # fmt: skip
        self.o_proj = RowParallelLinear(
            num_heads * self.head_dim, hidden_size, bias=bias_o_proj, quant_config=quant_config,
            prefix=f"{prefix}.o_proj",
        )  # fmt: skip
        # a plain nn.Linear, not vLLM's ReplicatedLinear: on CPU vLLM repacks its linear layers' weights for its GEMM
        # kernels and drops `.weight`, which `diff.v2_lambda` reads
        self.lambda_proj = nn.Linear(hidden_size, num_heads, bias=False)
        self.rotary_emb = get_rope(
            self.head_dim,
            max_position=max_position_embeddings,
            rope_parameters=getattr(config, "rope_parameters", None),
            is_neox_style=True,
        )
        self.attn = Attention(
            self.num_query_heads,
            self.head_dim,
            self.head_dim**-0.5,
            num_kv_heads=num_kv_heads,
            cache_config=cache_config,
            quant_config=quant_config,
            prefix=f"{prefix}.attn",
        )

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        out = self.attn(q, k, v).view(-1, self.num_query_heads, self.head_dim)  # (tokens, 2h, head_dim)
        lam = v2_lambda(hidden_states, self.lambda_proj.weight)  # (tokens, h)
        heads = v2_combine(out, lam.to(out.dtype))  # (tokens, h, head_dim)
        output, _ = self.o_proj(heads.reshape(-1, self.num_heads * self.head_dim))
        return output


class DiffLlama2DecoderLayer(LlamaDecoderLayer):
    """vLLM's Llama layer (norms, residuals, SwiGLU MLP) around the V2 differential attention."""

    def __init__(self, vllm_config, prefix: str = "", config=None) -> None:
        super().__init__(vllm_config, prefix=prefix, config=config, attn_layer_type=DiffLlama2Attention)


class DiffLlama2ForCausalLM(LlamaForCausalLM):
    """Weights map from the checkpoint's Llama names: q/k/v fused into qkv_proj, gate/up into gate_up_proj, tied
    embeddings when the config ties them; lambda_proj loads as it is."""

    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, layer_type=DiffLlama2DecoderLayer)
