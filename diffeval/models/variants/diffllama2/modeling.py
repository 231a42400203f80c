"""Differential Transformer V2 in transformers form: a Llama whose attention has 2h query heads and a λ projection.

The checkpoint is a Llama checkpoint (same tensor names) with two differences per layer: `self_attn.q_proj` makes
2h query heads (out features 2·h·head_dim) and `self_attn.lambda_proj.weight` is (h, d_model). `num_attention_heads`
in the config is h, the number of differential (output) heads; `num_key_value_heads` is h_kv as in Llama, and the KV
cache is a Llama's. Attention runs once through transformers' attention interface (eager, sdpa, flash_attention_2,
...) with the 2h query heads over the h_kv KV heads; `diff.v2_lambda` and `diff.v2_combine` then pair adjacent query
heads (2i, 2i + 1) into differential head i. RoPE is transformers' rotate-half (NeoX) layout, not the authors'
interleaved (GPT-J) one: weights trained with interleaved rotary load after permuting the rows of each q_proj and
k_proj head (new row i ← old row 2i, new row i + head_dim/2 ← old row 2i + 1).

`register()` makes `AutoConfig` and `AutoModelForCausalLM` know `model_type: "diffllama2"`; stock transformers does
not, so a V2 checkpoint loads through diffeval (models/checkpoints/loading.py registers it before any Auto* call).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig
from transformers.models.llama.modeling_llama import (
    ALL_ATTENTION_FUNCTIONS,
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
    LlamaPreTrainedModel,
    apply_rotary_pos_emb,
    eager_attention_forward,
)

from diffeval.models.diff import v2_combine, v2_lambda
from diffeval.models.variants.diffllama2.record import DIFF_V2

MODEL_TYPE = DIFF_V2.model_types[0]


@strict  # transformers' configs are strict dataclasses: validate_architecture runs on construction and load
class DiffLlama2Config(LlamaConfig):
    """A LlamaConfig whose `num_attention_heads` (h) counts differential heads: q_proj makes 2h query heads."""

    model_type = MODEL_TYPE
    # no tensor-parallel plan: Llama's would split q_proj's query heads over ranks but not lambda_proj's λ heads
    base_model_tp_plan = None  # type: ignore[assignment]  # transformers reads None as "no plan"

    @property
    def kv_heads(self) -> int:
        """h_kv: LlamaConfig fills an unset num_key_value_heads in with num_attention_heads."""
        return self.num_key_value_heads or self.num_attention_heads

    def validate_architecture(self):
        super().validate_architecture()
        if (2 * self.num_attention_heads) % self.kv_heads:
            raise ValueError(
                f"the 2 × {self.num_attention_heads} query heads of a DIFF V2 layer do not split evenly over "
                f"{self.num_key_value_heads} key/value heads"
            )


class DiffLlama2Attention(LlamaAttention):
    """One causal attention with 2h query heads over h_kv KV heads, then head_i = A_2i·V − λ_i · A_2i+1·V."""

    def __init__(self, config: DiffLlama2Config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.num_heads = config.num_attention_heads  # h differential (output) heads
        self.num_query_heads = 2 * self.num_heads
        # the attention interface (eager's repeat_kv, sdpa's GQA) reads the query heads per KV head from here
        self.num_key_value_groups = self.num_query_heads // config.kv_heads
        self.q_proj = nn.Linear(config.hidden_size, self.num_query_heads * self.head_dim, bias=config.attention_bias)
        self.lambda_proj = nn.Linear(config.hidden_size, self.num_heads, bias=False)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        cache=None,
        past_key_values=None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # transformers 5.24 hands the KV cache over as `cache`, 5.19-5.23 as `past_key_values`
        cache = cache if cache is not None else past_key_values
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)

        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # (B, 2h, T, d)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # (B, h_kv, T, d)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)

        if cache is not None:
            key_states, value_states = cache.update(key_states, value_states, self.layer_idx, kwargs=kwargs)

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        attn_output, attn_weights = attention_interface(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            **kwargs,
        )  # attn_output (B, T, 2h, d)

        lam = v2_lambda(hidden_states, self.lambda_proj.weight)  # (B, T, h)
        attn_output = v2_combine(attn_output, lam.to(attn_output.dtype))  # (B, T, h, d)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        attn_output = self.o_proj(attn_output)
        return attn_output, attn_weights


class DiffLlama2DecoderLayer(LlamaDecoderLayer):
    def __init__(self, config: DiffLlama2Config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.self_attn = DiffLlama2Attention(config=config, layer_idx=layer_idx)


class DiffLlama2PreTrainedModel(LlamaPreTrainedModel):
    config_class = DiffLlama2Config
    config: DiffLlama2Config
    _no_split_modules = ["DiffLlama2DecoderLayer"]
    _can_record_outputs = {
        "hidden_states": DiffLlama2DecoderLayer,
        "attentions": DiffLlama2Attention,
    }


class DiffLlama2Model(DiffLlama2PreTrainedModel, LlamaModel):
    def __init__(self, config: DiffLlama2Config):
        super().__init__(config)  # LlamaModel's modules, then its layers replaced by V2 layers
        self.layers = nn.ModuleList(
            [DiffLlama2DecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)]
        )
        self.post_init()


class DiffLlama2ForCausalLM(DiffLlama2PreTrainedModel, LlamaForCausalLM):
    def __init__(self, config: DiffLlama2Config):
        super().__init__(config)
        self.model = DiffLlama2Model(config)
        self.post_init()


def register() -> None:
    """Teach transformers' Auto classes `model_type: "diffllama2"` (idempotent)."""
    AutoConfig.register(MODEL_TYPE, DiffLlama2Config, exist_ok=True)
    AutoModelForCausalLM.register(DiffLlama2Config, DiffLlama2ForCausalLM, exist_ok=True)


__all__ = [
    "DiffLlama2Attention",
    "DiffLlama2Config",
    "DiffLlama2DecoderLayer",
    "DiffLlama2ForCausalLM",
    "DiffLlama2Model",
    "DiffLlama2PreTrainedModel",
    "register",
]
