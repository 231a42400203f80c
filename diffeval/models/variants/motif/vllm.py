"""Motif-2.6B on vLLM: diffeval's Motif (`modeling.py` beside this file; sources in docs/engines/motif.md) as a vLLM
model on today's engine, with prefix caching and chunked prefill. The math is diff.py's:

    λ = exp(λq1 · λk1) − exp(λq2 · λk2) + λ_init,  λ_init = 0.8 − 0.6 · exp(−0.3 · (layer − 1))   (Motif λ_init)
    head_i = (1 − λ_init) · subln(A1_i · [v_2g | v_2g+1] − λ · A2_i · [v_2g | v_2g+1])             (subln: weighted)
    MLP(x) = down(PolyNorm(gate(x)) ⊙ up(x))                                                     (PolyNorm)

where map 1 of differential head i reads query head 2i over key head 2g and map 2 query head 2i + 1 over key head
2g + 1 (g: head i's KV pair); with `num_noise_heads` (grouped differential attention, Motif-2-12.7B) map 1 is each
group's R signal heads and map 2 its one noise head, repeated over them. vLLM's Motif (until v0.10.2) ran Motif-2.6B
through a differential flash-attention backend on its V0 engine only. Here it runs on every attention backend as
four ordinary `Attention` layers per DIFF layer: the signal heads over the pairs' even keys and the noise heads over
their odd keys, each once with the pairs' even value heads and once with their odd ones, so a map applied to the
double-width value is its (even, odd) outputs side by side. It is exact; the KV cache is twice a Llama's of the same
shape, which vLLM's memory planning counts by itself.

vLLM 0.32 has no PolyNorm layer: `modeling.py`'s `PolyNorm` holds the checkpoint's `mlp.act_fn.weight` [3] and
`mlp.act_fn.bias` [1] and computes diff.poly_norm. Tensor parallelism is refused: a differential head's two maps are
neighbouring heads, and PolyNorm's moments run over the whole intermediate dimension.
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from vllm.model_executor.models.utils import extract_layer_index

from diffeval.models.diff import differential_heads, lambda_full, motif_lambda_init
from diffeval.models.variants.motif.modeling import PolyNorm  # the hf class's: the same parameters and diff.poly_norm


def _single_rank(what: str) -> None:
    if get_tensor_model_parallel_world_size() != 1:
        raise ValueError(f"Motif on vLLM runs with tensor_parallel_size 1: {what}")


class MotifMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, quant_config=None, prefix: str = "") -> None:
        super().__init__()
        _single_rank("PolyNorm's moments run over the whole intermediate dimension")
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size] * 2, bias=False, quant_config=quant_config, prefix=f"{prefix}.gate_up_proj"
        )
        self.down_proj = RowParallelLinear(
            intermediate_size, hidden_size, bias=False, quant_config=quant_config, prefix=f"{prefix}.down_proj"
        )
        self.act_fn = PolyNorm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up, _ = self.gate_up_proj(x)
        gate, up = gate_up.chunk(2, dim=-1)
        out, _ = self.down_proj(self.act_fn(gate) * up)
        return out


class MotifAttention(nn.Module):
    def __init__(
        self,
        config,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        max_position_embeddings: int = 8192,
        quant_config=None,
        cache_config=None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        _single_rank("a differential head's maps are neighbouring heads, which a split by heads would part")
        self.head_dim = getattr(config, "head_dim", None) or hidden_size // num_heads
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.noise_heads = getattr(config, "num_noise_heads", None) or num_heads // 2  # G groups
        self.per_group = (num_heads - self.noise_heads) // self.noise_heads  # R signal heads per group
        self.signal_heads = num_heads - self.noise_heads  # S
        self.q_size, self.kv_size = num_heads * self.head_dim, num_kv_heads * self.head_dim
        self.lambda_init = motif_lambda_init(extract_layer_index(prefix))
        self.qkv_proj = QKVParallelLinear(
            hidden_size, self.head_dim, num_heads, num_kv_heads, bias=False, quant_config=quant_config,
            prefix=f"{prefix}.qkv_proj",
        )  # fmt: skip
        self.o_proj = RowParallelLinear(
            2 * self.signal_heads * self.head_dim, hidden_size, bias=False, quant_config=quant_config,
            prefix=f"{prefix}.o_proj",
        )  # fmt: skip
        self.rotary_emb = get_rope(
            self.head_dim,
            max_position=max_position_embeddings,
            rope_parameters=getattr(config, "rope_parameters", None),
            is_neox_style=True,
        )
        # map 1: the S signal heads over the even key of each KV pair; map 2: the G noise heads over the odd key; each
        # once with the pair's even value head and once with its odd one (vLLM's GQA groups them by pair)
        pairs, scale = num_kv_heads // 2, self.head_dim**-0.5
        attention = dict(num_kv_heads=pairs, cache_config=cache_config, quant_config=quant_config)
        self.attn = nn.ModuleDict(
            {
                f"{m}_{v}": Attention(heads, self.head_dim, scale, prefix=f"{prefix}.attn.{m}_{v}", **attention)
                for m, heads in (("signal", self.signal_heads), ("noise", self.noise_heads))
                for v in ("even", "odd")
            }
        )
        self.lambda_q1 = nn.Parameter(torch.zeros(self.head_dim))
        self.lambda_k1 = nn.Parameter(torch.zeros(self.head_dim))
        self.lambda_q2 = nn.Parameter(torch.zeros(self.head_dim))
        self.lambda_k2 = nn.Parameter(torch.zeros(self.head_dim))
        self.subln = nn.RMSNorm(2 * self.head_dim, eps=config.attn_rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        d = self.head_dim
        groups = q.view(-1, self.noise_heads, self.per_group + 1, d)  # each group: R signal heads, then its noise head
        queries = {"signal": groups[:, :, :-1].reshape(-1, self.signal_heads * d), "noise": groups[:, :, -1]}
        keys = k.view(-1, self.num_kv_heads // 2, 2, d)
        values = v.view(-1, self.num_kv_heads // 2, 2, d)
        key_of = {
            "signal": keys[:, :, 0].reshape(-1, self.kv_size // 2),
            "noise": keys[:, :, 1].reshape(-1, self.kv_size // 2),
        }
        value_of = {
            "even": values[:, :, 0].reshape(-1, self.kv_size // 2),
            "odd": values[:, :, 1].reshape(-1, self.kv_size // 2),
        }
        maps = {}
        for name, heads in (("signal", self.signal_heads), ("noise", self.noise_heads)):
            halves = [
                self.attn[f"{name}_{half}"](queries[name].reshape(-1, heads * d), key_of[name], value_of[half])
                for half in ("even", "odd")
            ]
            maps[name] = torch.cat([h.view(-1, heads, d) for h in halves], dim=-1)  # (tokens, heads, 2d)
        noise = maps["noise"].repeat_interleave(self.per_group, dim=1)  # each signal head meets its group's noise head
        lam = lambda_full(self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2, self.lambda_init)
        heads = differential_heads(
            maps["signal"], noise, lam.to(q.dtype), self.lambda_init, self.subln.eps, norm_weight=self.subln.weight
        )
        output, _ = self.o_proj(heads.reshape(-1, 2 * self.signal_heads * d))
        return output


class MotifDecoderLayer(LlamaDecoderLayer):
    """vLLM's Llama layer (norms, residuals, its forward) around Motif's attention and PolyNorm MLP."""

    def __init__(self, vllm_config, prefix: str = "", config=None) -> None:
        nn.Module.__init__(self)  # Llama's constructor builds a SiLU MLP, which refuses poly_norm
        config = config or vllm_config.model_config.hf_config
        quant_config = self.get_quant_config(vllm_config)
        self.hidden_size = config.hidden_size
        self.self_attn = MotifAttention(
            config,
            config.hidden_size,
            config.num_attention_heads,
            getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            getattr(config, "max_position_embeddings", 8192),
            quant_config=quant_config,
            cache_config=vllm_config.cache_config,
            prefix=f"{prefix}.self_attn",
        )
        self.mlp = MotifMLP(config.hidden_size, config.intermediate_size, quant_config, prefix=f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class MotifForCausalLM(LlamaForCausalLM):
    """Weights map from Motif's checkpoint names as for Llama: q/k/v fused into qkv_proj, gate/up into gate_up_proj,
    tied embeddings when the config ties them; λ vectors, subln and PolyNorm load as they are."""

    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, layer_type=MotifDecoderLayer)
