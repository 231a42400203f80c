"""Motif-2.6B in transformers form: DIFF V1 attention in Motif's layout and a PolyNorm MLP (the math is in diff.py).

It loads Motif checkpoints as published (config keys, tensor names), without their remote code. The sources, what
each assumption rests on, and where they disagree are in docs/engines/motif.md; in short (vLLM v0.10.2's
`models/variants/motif/modeling.py` and its differential flash-attention backend, which diffeval follows):

- per layer `self_attn.{q,k,v,o}_proj` as in Llama (q: N heads of head_dim, k and v: Nkv heads), `self_attn.lambda_q1,
  lambda_k1, lambda_q2, lambda_k2` [head_dim], `self_attn.subln.weight` [2·head_dim] and `mlp.act_fn.weight` [3],
  `mlp.act_fn.bias` [1] beside Llama's gate, up and down projections;
- rotate-half (NeoX) RoPE on every query and key head before the pairing; adjacent heads (2i, 2i + 1) pair into N/2
  differential heads over Nkv/2 KV pairs, each over the pair's double-width value; softmax scale head_dim^−½;
- subln = RMSNorm over 2·head_dim with its weight and `attn_rms_norm_eps`, × (1 − λ_init) with Motif's λ_init;
- MLP = down(PolyNorm(gate(x)) ⊙ up(x)): Llama's MLP with `hidden_act: poly_norm`, which `register()` adds to
  transformers' activations.

With `num_noise_heads` (Motif-2-12.7B's grouped differential attention, docs/engines/gda.md), the query heads form
groups of R signal heads and one noise head, and each signal head subtracts its group's noise map; without it the
groups are the adjacent pairs above.

Attention runs once per layer through transformers' attention interface (eager, sdpa, ...) over 2S query heads
(`diff.motif_maps`): [0, S) the signal heads (map 1), [S, 2S) each one's noise head (map 2), with one key and value
head each, as DiffLlama's maps split; the KV cache holds the layer's own keys and values, a Llama's.

`register()` teaches `AutoConfig` and `AutoModelForCausalLM` both spellings of the model type that Motif's configs use
("Motif", as its own configuration module writes it, and "motif").
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig
from transformers.activations import ACT2FN
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

from diffeval.models.diff import differential_heads, lambda_full, motif_lambda_init, motif_maps, poly_norm
from diffeval.models.variants.motif.record import MOTIF

MODEL_TYPE, MODEL_TYPE_LOWER = MOTIF.model_types


@strict
class MotifConfig(LlamaConfig):
    """Llama's keys plus `attn_rms_norm_eps` (subln's eps) and `hidden_act: poly_norm`."""

    model_type = MODEL_TYPE
    # a differential head's two maps are adjacent heads: a column split would part them (None: no plan)
    base_model_tp_plan = None  # type: ignore[assignment]

    hidden_act: str = "poly_norm"
    attn_rms_norm_eps: float = 1e-5  # subln's eps when a config leaves it out (mlx-motif's default)
    # grouped differential attention (Motif-2-12.7B): noise query heads, one per group; None is Motif-2.6B's N/2
    num_noise_heads: int | None = None
    k_ratio: int | None = None  # signal key heads per noise key head; the published configs (and vLLM's code) use 1

    def validate_architecture(self):
        # Llama's check (hidden_size a multiple of the heads) holds only without head_dim: Motif-2-12.7B has 40 heads
        # of 128 over a width of 4096
        if self.head_dim is None:
            super().validate_architecture()
        heads, kv_heads = self.num_attention_heads, self.num_key_value_heads or self.num_attention_heads
        if kv_heads % 2:
            raise ValueError(f"Motif pairs its key/value heads: num_key_value_heads must be even, got {kv_heads}")
        noise = self.num_noise_heads
        if noise is None:
            if heads % 2:
                raise ValueError(f"Motif pairs adjacent heads: num_attention_heads must be even, got {heads}")
            if heads % kv_heads:
                raise ValueError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
            return
        if self.k_ratio not in (None, 1):
            raise ValueError(f"k_ratio {self.k_ratio} is not supported: the published Motif-2-12.7B and vLLM use 1")
        if not 0 < noise < heads or (heads - noise) % noise:
            raise ValueError(
                f"num_noise_heads {noise} does not divide the {heads - noise} signal heads "
                f"(num_attention_heads {heads} − num_noise_heads): each group is R signal heads and one noise head"
            )
        if noise % (kv_heads // 2):
            raise ValueError(
                f"num_noise_heads {noise} is not a multiple of the {kv_heads // 2} key/value pairs "
                f"(num_key_value_heads {kv_heads} / 2): every group reads one pair"
            )

    @property
    def signal_heads(self) -> int:
        """S: the query heads of map 1, each one output head (o_proj reads 2·S·head_dim features)."""
        return self.num_attention_heads - (self.num_noise_heads or self.num_attention_heads // 2)


@strict
class MotifLowerConfig(MotifConfig):
    model_type = MODEL_TYPE_LOWER


# transformers' Auto registry pairs a model class with a config class by the config class's name
MotifLowerConfig.__name__ = MotifConfig.__name__


class PolyNorm(nn.Module):
    """Motif's MLP activation: three weights and a bias (diff.poly_norm)."""

    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.full((3,), 1 / 3))
        self.bias = nn.Parameter(torch.zeros(1))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return poly_norm(x, self.weight, self.bias, self.eps)


class MotifAttention(LlamaAttention):
    """DIFF attention over Motif's head groups (adjacent pairs, or GDA's signal and noise heads); λ per layer (Eq. 2)
    with Motif's λ_init; subln with a weight; o_proj over the S signal heads' 2·head_dim outputs."""

    def __init__(self, config: MotifConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.noise_heads = config.num_noise_heads
        self.num_key_value_groups = 1  # `motif_maps` hands the interface one key and value head per query head
        self.o_proj = nn.Linear(2 * config.signal_heads * self.head_dim, config.hidden_size, bias=config.attention_bias)
        self.lambda_init = motif_lambda_init(layer_idx)
        self.lambda_q1 = nn.Parameter(torch.zeros(self.head_dim))
        self.lambda_k1 = nn.Parameter(torch.zeros(self.head_dim))
        self.lambda_q2 = nn.Parameter(torch.zeros(self.head_dim))
        self.lambda_k2 = nn.Parameter(torch.zeros(self.head_dim))
        self.subln = nn.RMSNorm(2 * self.head_dim, eps=config.attn_rms_norm_eps)

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

        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # (B, N, T, d)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # (B, Nkv, T, d)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        if cache is not None:
            key_states, value_states = cache.update(key_states, value_states, self.layer_idx, kwargs=kwargs)
        query_states, key_states, value_states = motif_maps(query_states, key_states, value_states, self.noise_heads)

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
        )  # (B, T, 2S, 2d): heads [0, S) map 1, [S, 2S) map 2 (each signal head's group's noise head)

        half = attn_output.shape[2] // 2
        lam = lambda_full(self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2, self.lambda_init)
        heads = differential_heads(
            attn_output[:, :, :half], attn_output[:, :, half:], lam.to(attn_output.dtype), self.lambda_init,
            self.subln.eps, norm_weight=self.subln.weight,
        )  # fmt: skip
        attn_output = self.o_proj(heads.reshape(*input_shape, -1).contiguous())
        return attn_output, attn_weights


class MotifDecoderLayer(LlamaDecoderLayer):
    def __init__(self, config: MotifConfig, layer_idx: int):
        super().__init__(config, layer_idx)  # Llama's MLP with ACT2FN["poly_norm"] (`register`) is Motif's
        self.self_attn = MotifAttention(config=config, layer_idx=layer_idx)


class MotifPreTrainedModel(LlamaPreTrainedModel):
    config_class = MotifConfig
    config: MotifConfig
    _no_split_modules = ["MotifDecoderLayer"]
    _can_record_outputs = {"hidden_states": MotifDecoderLayer, "attentions": MotifAttention}

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, PolyNorm):
            module.weight.fill_(1 / 3)
            module.bias.zero_()
        elif isinstance(module, MotifAttention):
            for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                getattr(module, name).normal_(0, 0.1)


class MotifModel(MotifPreTrainedModel, LlamaModel):
    def __init__(self, config: MotifConfig):
        super().__init__(config)  # LlamaModel's modules, then its layers replaced by Motif's
        self.layers = nn.ModuleList(
            [MotifDecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)]
        )
        self.post_init()


class MotifForCausalLM(MotifPreTrainedModel, LlamaForCausalLM):
    def __init__(self, config: MotifConfig):
        super().__init__(config)
        self.model = MotifModel(config)
        self.post_init()


def register() -> None:
    """Teach transformers' Auto classes both spellings of Motif's model type, and its activation registry PolyNorm
    (Llama's MLP, down(act(gate(x)) ⊙ up(x)), builds `mlp.act_fn` from it); idempotent."""
    ACT2FN["poly_norm"] = PolyNorm
    for config_class in (MotifConfig, MotifLowerConfig):
        AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
        AutoModelForCausalLM.register(config_class, MotifForCausalLM, exist_ok=True)


__all__ = [
    "MotifAttention",
    "MotifConfig",
    "MotifDecoderLayer",
    "MotifForCausalLM",
    "MotifLowerConfig",
    "MotifModel",
    "MotifPreTrainedModel",
    "PolyNorm",
    "register",
]
