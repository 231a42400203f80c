"""Phi-4-mini-flash (SambaY) in transformers form, without the checkpoint's remote code.

It reads the published `config.json` (its `auto_map` included: diffeval's class is registered for `model_type:
"phi4flash"`, so no remote code runs) and the published tensor names. Which layer is what is the record's rule
(record.py); the sources and where they disagree are in docs/engines/phi4flash.md. Per layer, pre-norm with LayerNorm
(weight and bias, `layer_norm_eps`), the MLP fc2(up ⊙ act(gate)) with [gate | up] = fc1(x), and one of:

- Mamba-1 (`attn.in_proj`, `conv1d`, `x_proj`, `dt_proj`, `A_log`, `D`, `out_proj`): the scan is models/mamba.py's;
  the memory layer L/2 keeps its scan output before the gate for the cross-decoder;
- DIFF attention (`attn.Wqkv` and `attn.out_proj` with biases; λ and subln under `attn.inner_cross_attn`): no
  positional encoding; Motif's head pairing (`diff.motif_maps`: adjacent query heads 2i and 2i + 1 over the even and
  odd heads of a KV pair, each map over the pair's double-width value), λ = exp(λq1·λk1) − exp(λq2·λk2) + λ_init with
  λ_init = 0.8 − 0.6·exp(−0.3·layer) (0-based), subln RMSNorm(2·head_dim, eps 1e-5) with a weight, × (1 − λ_init);
  a sliding layer's query at position i sees keys i − w < j ≤ i; cross layers make queries only and read layer
  L/2 + 1's keys and values;
- a Gated Memory Unit (`attn.in_proj`, `attn.out_proj`): out_proj(memory ⊙ silu(in_proj(x))).

Attention runs once per layer through transformers' attention interface (eager, sdpa, diffeval's capture and
activation implementations) over 2·(N/2) heads laid out as DiffLlama's maps. Generation goes through
`Phi4FlashCache`: the attention layers' KV (a window for the sliding ones), the Mamba layers' convolution and SSM
states, and the KV layer's cache that the cross-decoder reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers.activations import ACT2FN
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import eager_attention_forward

from diffeval.models.diff import differential_heads, lambda_full, lambda_init, learned_lambda, motif_maps
from diffeval.models.mamba import causal_conv1d, selective_scan, selective_state_update
from diffeval.models.variants.base import GATED_MEMORY, STATE_SPACE
from diffeval.models.variants.phi4flash import record
from diffeval.models.variants.phi4flash.record import PHI4FLASH

MODEL_TYPE = PHI4FLASH.model_types[0]
SUBLN_EPS = 1e-5  # every source fixes subln's eps; the config has no key for it
# transformers 5.24 names the cache `cache` (keyword and output field), 5.19-5.23 `past_key_values`
CACHE_FIELD = "cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)} else "past_key_values"


@strict
class Phi4FlashConfig(PreTrainedConfig):
    """The keys of the published config, with the remote configuration class's defaults for those it leaves out."""

    model_type = MODEL_TYPE

    vocab_size: int = 51200
    hidden_size: int = 2560
    intermediate_size: int = 9216
    num_hidden_layers: int = 32
    num_attention_heads: int = 40
    num_key_value_heads: int | None = 4
    resid_pdrop: float | int = 0.0
    embd_pdrop: float | int = 0.0
    attention_dropout: float | int = 0.0
    hidden_act: str = "silu"
    max_position_embeddings: int = 4096
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-5
    use_cache: bool = True
    tie_word_embeddings: bool = True
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    pad_token_id: int | None = None
    # one width for the self-decoder's attention layers, or one entry per layer (as the remote config class saves it)
    sliding_window: int | list[int | None] | None = 2047
    layer_types: list[str] | None = None
    mb_per_layer: int = 2
    mamba_d_state: int = 16
    mamba_d_conv: int = 4
    mamba_expand: int = 2
    mamba_dt_rank: int | str = "auto"
    mamba_conv_bias: bool = True
    mamba_proj_bias: bool = False

    def __post_init__(self, **kwargs):
        kwargs.pop("rope_theta", None)  # the published config carries one; SambaY's attention has no RoPE
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        super().__post_init__(**kwargs)

    def validate_architecture(self):
        layers, heads, kv_heads = self.num_hidden_layers, self.num_attention_heads, self.kv_heads
        if self.hidden_size % heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads {heads}")
        if heads % 2 or kv_heads % 2 or heads % kv_heads:
            raise ValueError(
                f"Phi-4-mini-flash pairs adjacent heads: num_attention_heads ({heads}) and num_key_value_heads "
                f"({kv_heads}) must be even, the first a multiple of the second"
            )
        if self.mb_per_layer != 2 or layers % 4:
            # the layout the sources agree on (the remote code, PaddleFormers and ArchScale assert L % 4 == 0, mobius
            # refuses another mb_per_layer): layer L/2 is then a Mamba layer and L/2 + 1 an attention layer
            raise ValueError(
                f"num_hidden_layers {layers} with mb_per_layer {self.mb_per_layer} gives no SambaY layer pattern "
                "diffeval computes as the sources do: it needs mb_per_layer 2 and a multiple of 4 layers (layer L/2 "
                "a Mamba layer, L/2 + 1 an attention layer); Phi-4-mini-flash has 32 layers and mb_per_layer 2"
            )
        widths = self.sliding_window if isinstance(self.sliding_window, list) else [self.sliding_window]
        if isinstance(self.sliding_window, list) and len(widths) != layers:
            raise ValueError(f"sliding_window lists {len(widths)} layers, the config {layers}")
        if any(w is not None and w < 1 for w in widths):
            raise ValueError(f"sliding_window {self.sliding_window}: a window holds at least one token")
        if self.layer_types is not None and len(self.layer_types) != layers:
            raise ValueError(f"layer_types lists {len(self.layer_types)} layers, the config {layers}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_heads(self) -> int:
        """N_kv (`__post_init__` fills an unset num_key_value_heads in with num_attention_heads)."""
        return self.num_key_value_heads or self.num_attention_heads


class Phi4FlashCache:
    """One sequence batch's state: each attention layer's keys and values (the last w − 1 tokens for a sliding layer,
    all of them otherwise; the cross-decoder reads layer L/2 + 1's), each Mamba layer's convolution inputs and SSM
    state, and the number of tokens seen. `snapshot` and `restore` put it back to an earlier point (prefix reuse):
    a Mamba state cannot be cropped."""

    def __init__(self, config: Phi4FlashConfig):
        self.windows = record.windows(config)
        self.length = 0
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.conv: dict[int, torch.Tensor] = {}
        self.ssm: dict[int, torch.Tensor] = {}

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Append one forward's keys and values (B, N_kv, T, d); returns those to attend over and the position of
        the first of them. A sliding layer then keeps only what the next token's window needs."""
        incoming = key.shape[2]
        if layer_idx in self.keys:
            key = torch.cat([self.keys[layer_idx], key], 2)
            value = torch.cat([self.values[layer_idx], value], 2)
        start = self.length + incoming - key.shape[2]  # `length` counts the tokens before this forward
        window = self.windows[layer_idx]
        keep = key.shape[2] if window is None else min(key.shape[2], window - 1)
        self.keys[layer_idx], self.values[layer_idx] = (
            key[:, :, key.shape[2] - keep :],
            value[:, :, value.shape[2] - keep :],
        )
        return key, value, start

    def snapshot(self) -> dict[str, Any]:
        """What `restore` needs to come back here: the length, and what a later forward replaces. A forward replaces
        a layer's tensors and never writes into them, so holding them is enough."""
        sliding = {i for i, w in enumerate(self.windows) if w is not None}
        return {
            "length": self.length,
            "keys": {i: k for i, k in self.keys.items() if i in sliding},
            "values": {i: v for i, v in self.values.items() if i in sliding},
            "conv": dict(self.conv),
            "ssm": dict(self.ssm),
        }

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Back to a snapshot taken on this cache: full layers' keys cut to its length, the rest as they were (the
        snapshot stays usable)."""
        length = snapshot["length"]
        for i in list(self.keys):
            if i in snapshot["keys"]:
                self.keys[i], self.values[i] = snapshot["keys"][i], snapshot["values"][i]
            else:
                self.keys[i], self.values[i] = self.keys[i][:, :, :length], self.values[i][:, :, :length]
        self.conv, self.ssm = dict(snapshot["conv"]), dict(snapshot["ssm"])
        self.length = length


class Masks:
    """The attention masks of one forward, built once per (first key position, window): None where the attention
    implementation's own causal rule is exact (sdpa without padding over a whole causal block or for one new token)."""

    def __init__(self, padding: torch.Tensor | None, past: int, new: int, eager: bool, dtype, device):
        self.padding, self.past, self.new, self.eager, self.dtype, self.device = (
            padding,
            past,
            new,
            eager,
            dtype,
            device,
        )
        self.built: dict[tuple[int, int | None], torch.Tensor | None] = {}

    def __call__(self, start: int, window: int | None) -> torch.Tensor | None:
        if (start, window) not in self.built:
            self.built[start, window] = self._build(start, window)
        return self.built[start, window]

    def _build(self, start: int, window: int | None) -> torch.Tensor | None:
        total = self.past + self.new
        whole = window is None or window >= total - start
        if self.padding is None and whole and not self.eager and (self.new == 1 or (self.past == 0 and start == 0)):
            return None
        queries = torch.arange(self.past, total, device=self.device)[:, None]
        keys = torch.arange(start, total, device=self.device)[None, :]
        allowed = keys <= queries
        if window is not None:
            allowed &= keys > queries - window  # bool (T, K): no integer T×K difference
        allowed = allowed[None, None]
        if self.padding is not None:
            allowed = allowed & self.padding[:, None, None, start:total]
        allowed = allowed | (keys == queries)  # a padding row attends to itself: finite, and never read
        if not self.eager:
            return allowed
        return torch.zeros(allowed.shape, dtype=self.dtype, device=self.device).masked_fill(
            ~allowed, torch.finfo(self.dtype).min
        )


class Phi4FlashMLP(nn.Module):
    def __init__(self, config: Phi4FlashConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.activation_fn = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.fc1(x).chunk(2, dim=-1)
        return self.fc2(up * self.activation_fn(gate))


class Phi4FlashDifferential(nn.Module):
    """λ's parameters and subln, under the published name `inner_cross_attn`."""

    def __init__(self, head_dim: int, layer_idx: int):
        super().__init__()
        self.lambda_init = lambda_init(layer_idx)
        self.lambda_q1 = nn.Parameter(torch.zeros(head_dim))
        self.lambda_k1 = nn.Parameter(torch.zeros(head_dim))
        self.lambda_q2 = nn.Parameter(torch.zeros(head_dim))
        self.lambda_k2 = nn.Parameter(torch.zeros(head_dim))
        self.subln = nn.RMSNorm(2 * head_dim, eps=SUBLN_EPS)


class Phi4FlashAttention(nn.Module):
    """DIFF attention over the layer's own keys (sliding or full) or, in the cross-decoder, over layer L/2 + 1's."""

    def __init__(self, config: Phi4FlashConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.is_causal = True
        self.num_key_value_groups = 1  # `motif_maps` hands the interface one key and value head per query head
        self.attention_dropout = config.attention_dropout
        kind = record.layers(config)[layer_idx]
        self.sliding_window = kind.window
        self.cross = kind.kv_from is not None  # a cross-decoder layer: queries only, over layer L/2 + 1's KV
        heads, kv = config.num_attention_heads * self.head_dim, config.kv_heads * self.head_dim
        self.Wqkv = nn.Linear(config.hidden_size, heads if self.cross else heads + 2 * kv, bias=True)
        self.out_proj = nn.Linear(heads, config.hidden_size, bias=True)
        self.inner_cross_attn = Phi4FlashDifferential(self.head_dim, layer_idx)
        self.split = (heads, kv, kv)

    def forward(
        self,
        hidden_states: torch.Tensor,
        masks: Masks,
        cache: Phi4FlashCache | None,
        shared: tuple[torch.Tensor, torch.Tensor, int] | None,
        **kwargs,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, int]]:
        batch, length, _ = hidden_states.shape
        shape = (batch, length, -1, self.head_dim)
        if self.cross:
            assert shared is not None
            query, (key, value, start) = self.Wqkv(hidden_states), shared
        else:
            query, key, value = self.Wqkv(hidden_states).split(self.split, dim=-1)
            key, value = key.view(shape).transpose(1, 2), value.view(shape).transpose(1, 2)
            start = masks.past
            if cache is not None:
                key, value, start = cache.update(key, value, self.layer_idx)
        query = query.view(shape).transpose(1, 2)
        q, k, v = motif_maps(query, key, value)
        interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        output, _ = interface(
            self, q, k, v, masks(start, self.sliding_window), dropout=0.0, scaling=self.scaling,
            sliding_window=self.sliding_window, **kwargs,
        )  # fmt: skip  # (B, T, 2S, 2d): heads [0, S) map 1, [S, 2S) map 2
        half = output.shape[2] // 2
        inner = self.inner_cross_attn
        lam = lambda_full(inner.lambda_q1, inner.lambda_k1, inner.lambda_q2, inner.lambda_k2, inner.lambda_init)
        heads = differential_heads(
            output[:, :, :half], output[:, :, half:], lam.to(output.dtype), inner.lambda_init, SUBLN_EPS,
            norm_weight=inner.subln.weight,
        )  # fmt: skip
        return self.out_proj(heads.reshape(batch, length, -1)), (key, value, start)


class Phi4FlashMamba(nn.Module):
    """Mamba-1; the memory layer (L/2) also returns its scan output before the gate."""

    def __init__(self, config: Phi4FlashConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.memory = layer_idx == record.memory_layer(config)
        inner, state, self.dt_rank = (
            config.mamba_expand * config.hidden_size,
            config.mamba_d_state,
            record.dt_rank(config),
        )
        self.d_state = state
        self.in_proj = nn.Linear(config.hidden_size, 2 * inner, bias=config.mamba_proj_bias)
        self.conv1d = nn.Conv1d(
            inner, inner, config.mamba_d_conv, groups=inner, padding=config.mamba_d_conv - 1,
            bias=config.mamba_conv_bias,
        )  # fmt: skip
        self.x_proj = nn.Linear(inner, self.dt_rank + 2 * state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, inner, bias=True)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, state + 1, dtype=torch.float32)).repeat(inner, 1))
        self.D = nn.Parameter(torch.ones(inner))
        self.out_proj = nn.Linear(inner, config.hidden_size, bias=config.mamba_proj_bias)

    def forward(
        self, hidden_states: torch.Tensor, cache: Phi4FlashCache | None, padding: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        x, z = self.in_proj(hidden_states).transpose(1, 2).chunk(2, dim=1)  # (B, d_inner, T) each
        if padding is not None:  # a left-padded row's state starts at its first token, as if alone
            x = x.masked_fill(~padding[:, None, :], 0)
        conv_state = cache.conv.get(self.layer_idx) if cache is not None else None
        x, conv_state = causal_conv1d(x, self.conv1d.weight[:, 0], self.conv1d.bias, conv_state)
        if padding is not None:
            x = x.masked_fill(~padding[:, None, :], 0)
        dt, B, C = self.x_proj(x.transpose(1, 2)).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        delta = (dt @ self.dt_proj.weight.T).transpose(1, 2)
        A = -torch.exp(self.A_log.float())
        gate = None if self.memory else z
        ssm_state = cache.ssm.get(self.layer_idx) if cache is not None else None
        if ssm_state is not None and x.shape[-1] == 1:
            one_gate = None if gate is None else gate[..., 0]
            y, ssm_state = selective_state_update(
                ssm_state, x[..., 0], delta[..., 0], A, B[:, 0], C[:, 0], self.D, one_gate, self.dt_proj.bias
            )
            y = y[..., None]
        else:
            y, ssm_state = selective_scan(
                x, delta, A, B.transpose(1, 2), C.transpose(1, 2), self.D, gate, self.dt_proj.bias, True, ssm_state
            )
        if cache is not None:
            cache.conv[self.layer_idx], cache.ssm[self.layer_idx] = conv_state, ssm_state
        y = y.transpose(1, 2)  # (B, T, d_inner)
        if self.memory:
            return self.out_proj(y * nn.functional.silu(z.transpose(1, 2))), y
        return self.out_proj(y), None


class Phi4FlashGatedMemory(nn.Module):
    """A Gated Memory Unit: the memory layer's scan output m gated by this layer's input x,
    out_proj(m ⊙ silu(in_proj(x)))."""

    def __init__(self, config: Phi4FlashConfig):
        super().__init__()
        inner = config.mamba_expand * config.hidden_size
        self.in_proj = nn.Linear(config.hidden_size, inner, bias=config.mamba_proj_bias)
        self.out_proj = nn.Linear(inner, config.hidden_size, bias=config.mamba_proj_bias)

    def forward(self, hidden_states: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        return self.out_proj(memory * nn.functional.silu(self.in_proj(hidden_states)))


class Phi4FlashDecoderLayer(nn.Module):
    def __init__(self, config: Phi4FlashConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        mixer = record.layers(config)[layer_idx].mixer  # the record's rule, the one place it is written
        if mixer == STATE_SPACE:
            self.attn: nn.Module = Phi4FlashMamba(config, layer_idx)
        elif mixer == GATED_MEMORY:
            self.attn = Phi4FlashGatedMemory(config)
        else:
            self.attn = Phi4FlashAttention(config, layer_idx)
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = Phi4FlashMLP(config)

    def forward(self, hidden_states, carried: dict[str, Any], masks: Masks, cache, padding, **kwargs):
        """`carried`: what later layers read, the memory (L/2's scan output) and the shared KV (L/2 + 1's)."""
        x = self.input_layernorm(hidden_states)
        if isinstance(self.attn, Phi4FlashAttention):
            out, kv = self.attn(x, masks, cache, carried.get("shared"), **kwargs)
            if not self.attn.cross:
                carried["shared"] = kv
        elif isinstance(self.attn, Phi4FlashGatedMemory):
            out = self.attn(x, carried["memory"])
        else:
            out, memory = self.attn(x, cache, padding)
            if memory is not None:
                carried["memory"] = memory
        hidden_states = hidden_states + out
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class Phi4FlashPreTrainedModel(PreTrainedModel):
    config_class = Phi4FlashConfig
    config: Phi4FlashConfig
    base_model_prefix = "model"
    _no_split_modules = ["Phi4FlashDecoderLayer"]
    _supports_sdpa = True
    _supports_attention_backend = True  # diffeval's capture and activation implementations

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model makes its own Phi4FlashCache

    @torch.no_grad()
    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.normal_(0, std)
            if getattr(module, "bias", None) is not None:
                module.bias.zero_()
        elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
            module.weight.fill_(1.0)
            if getattr(module, "bias", None) is not None:
                module.bias.zero_()
        elif isinstance(module, nn.Conv1d):
            module.reset_parameters()
        if isinstance(module, Phi4FlashDifferential):
            for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                getattr(module, name).normal_(0, 0.1)
        elif isinstance(module, Phi4FlashMamba):
            state = module.A_log.shape[1]
            module.A_log.copy_(
                torch.log(torch.arange(1, state + 1, dtype=torch.float32)).repeat(module.A_log.shape[0], 1)
            )
            module.D.fill_(1.0)


class Phi4FlashModel(Phi4FlashPreTrainedModel):
    def __init__(self, config: Phi4FlashConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([Phi4FlashDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.final_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        cache: Phi4FlashCache | None = None,
        past_key_values: Phi4FlashCache | None = None,
        position_ids=None,
        cache_position=None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        """`output_hidden_states`: the embeddings and each decoder layer's output, the last one after the final norm,
        as transformers' models give them."""
        cache = cache if cache is not None else past_key_values
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        if use_cache if use_cache is not None else self.config.use_cache:
            cache = cache if cache is not None else Phi4FlashCache(self.config)
        else:
            cache = None
        past, new = (cache.length if cache is not None else 0), inputs_embeds.shape[1]
        padding = None
        if attention_mask is not None and not bool(attention_mask.all()):
            padding = attention_mask.bool()
        masks = Masks(
            padding, past, new, self.config._attn_implementation in ("eager", None), inputs_embeds.dtype,
            inputs_embeds.device,
        )  # fmt: skip
        new_padding = None if padding is None else padding[:, past : past + new]
        carried: dict[str, Any] = {}
        hidden = inputs_embeds
        states = [hidden]
        for layer in self.layers:
            hidden = layer(hidden, carried, masks, cache, new_padding, **kwargs)
            states.append(hidden)
        if cache is not None:
            cache.length = past + new
        hidden = self.final_layernorm(hidden)
        states[-1] = hidden  # as transformers' models give it: the last layer's output after the final norm
        outputs: dict[str, Any] = {CACHE_FIELD: cache, "hidden_states": tuple(states) if output_hidden_states else None}
        return BaseModelOutputWithPast(last_hidden_state=hidden, **outputs)


class Phi4FlashForCausalLM(Phi4FlashPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: Phi4FlashConfig):
        super().__init__(config)
        self.model = Phi4FlashModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    def get_decoder(self):
        return self.model

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        cache: Phi4FlashCache | None = None,
        past_key_values: Phi4FlashCache | None = None,
        logits_to_keep: int = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        outputs = self.model(
            input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, use_cache=use_cache,
            cache=cache if cache is not None else past_key_values, **kwargs,
        )  # fmt: skip
        hidden = outputs.last_hidden_state
        logits = self.lm_head(hidden[:, -logits_to_keep:] if logits_to_keep else hidden)
        passed = {CACHE_FIELD: getattr(outputs, CACHE_FIELD), "hidden_states": outputs.hidden_states}
        return CausalLMOutputWithPast(logits=logits, **passed)


def layer_lambdas(model: Any) -> list[dict[str, float]]:
    """λ_init and learned λ of every DIFF attention layer (Mamba and gated memory layers have none)."""
    rows = []
    for i, layer in enumerate(model.get_decoder().layers):
        if isinstance(layer.attn, Phi4FlashAttention):
            inner = layer.attn.inner_cross_attn
            rows.append({"layer": i, "lambda_init": float(inner.lambda_init), "lambda": learned_lambda(inner)})
    return rows


def register() -> None:
    """Teach transformers' Auto classes `model_type: "phi4flash"` (idempotent); the published config's `auto_map`
    names the remote code, which then runs only with `--trust-remote-code`."""
    AutoConfig.register(MODEL_TYPE, Phi4FlashConfig, exist_ok=True)
    AutoModelForCausalLM.register(Phi4FlashConfig, Phi4FlashForCausalLM, exist_ok=True)


__all__ = [
    "Phi4FlashCache",
    "Phi4FlashConfig",
    "Phi4FlashForCausalLM",
    "Phi4FlashModel",
    "Phi4FlashPreTrainedModel",
    "register",
]
