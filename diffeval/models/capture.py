"""Attention rows without T×T maps, through transformers' attention interface.

A capturing implementation, registered as `diffeval_capture`, runs the model's usual sdpa attention and, per layer,
computes softmax(q·Kᵀ·s) only for the chosen query rows from the post-RoPE queries and keys it is handed. It reduces
each row at once to per-segment sums (answer, other needles, noise, ...), so memory stays O(rows × T) per head.
Module hooks would see pre-RoPE projections; the interface sees exactly what attention uses. DiffLlama calls the
interface twice per layer with the same queries and keys (two halves of V), so each layer is captured once. DIFF V2
(diffllama2) calls it once with 2h query heads; its per-token λ at the chosen rows is caught by a pre-hook on each
layer's attention, from the same input x its lambda_proj reads. Only layers that attend call the interface: a hybrid's
Mamba layers (Jamba's) are not captured, and the backend checks that the captured layers are those whose kind attends.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from diffeval.errors import InputError
from diffeval.models.diff import v2_lambda
from diffeval.models.layer_kinds import attention_layers
from diffeval.models.variants import registry as variants
from diffeval.models.variants.base import PER_TOKEN

CAPTURE_IMPL = "diffeval_capture"
# model types whose attention goes through the interface with (B, H, T, d) post-RoPE queries and causal masks: the
# baselines' here (Jamba: its attention layers, which have no RoPE; its Mamba layers are skipped by kind), and every
# DIFF variant's (each variant's split into A1 and A2 is the registry's)
SUPPORTED_MODEL_TYPES = (*variants.model_types(), "llama", "mistral", "qwen2", "jamba")


@dataclass
class RowCapture:
    rows: torch.Tensor  # (R,) query positions
    segment_ids: torch.Tensor  # (T,) segment index of every key position
    n_segments: int
    shares: dict[int, torch.Tensor] = field(default_factory=dict)  # layer → (H, R, S) weight summed per segment
    lambdas: dict[int, torch.Tensor] = field(default_factory=dict)  # DIFF V2: layer → (h, R) λ at the rows


_active: RowCapture | None = None


def _capturing_sdpa(module, query, key, value, attention_mask, **kwargs):
    capture = _active
    if capture is not None and module.layer_idx not in capture.shares:
        scaling = kwargs.get("scaling") or query.shape[-1] ** -0.5
        capture.shares[module.layer_idx] = segment_shares(query[0], key[0], capture, scaling, module)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def segment_shares(query: torch.Tensor, key: torch.Tensor, capture: RowCapture, scaling: float, module=None):
    """Per head and row, the softmax weight each segment receives. query (H, T, d), key (KV, T, d) post-RoPE."""
    q = query[:, capture.rows].float()
    k = key.float()
    heads, n_rows, dim = q.shape
    kv_heads, length = k.shape[:2]
    groups = heads // kv_heads  # GQA: query head h reads key head h // groups
    logits = (q.reshape(kv_heads, groups * n_rows, dim) @ k.transpose(1, 2)).reshape(heads, n_rows, length)
    positions = torch.arange(length, device=k.device)
    allowed = positions[None, :] <= capture.rows[:, None]
    window = getattr(module, "sliding_window", None)
    if window:
        allowed &= positions[None, :] > capture.rows[:, None] - window
    weights = torch.softmax((logits * scaling).masked_fill(~allowed, float("-inf")), dim=-1)
    shares = torch.zeros(heads, n_rows, capture.n_segments, device=k.device)
    return shares.index_add_(2, capture.segment_ids, weights).cpu()


def check_supported(model_type: str) -> None:
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise InputError(f"attention analysis supports {', '.join(SUPPORTED_MODEL_TYPES)} models, not {model_type!r}")


@contextmanager
def capturing(model, rows: list[int], segment_ids: list[int], n_segments: int):
    """Within the block, a forward of `model` fills the yielded RowCapture's per-layer shares."""
    global _active
    check_supported(model.config.model_type)
    AttentionInterface.register(CAPTURE_IMPL, _capturing_sdpa)
    AttentionMaskInterface.register(CAPTURE_IMPL, sdpa_mask)
    previous = model.config._attn_implementation
    device = model.device
    capture = RowCapture(
        rows=torch.tensor(rows, device=device),
        segment_ids=torch.tensor(segment_ids, device=device),
        n_segments=n_segments,
    )
    hooks = []
    variant = variants.variant_of(model.config)
    if variant is not None and variant.lambda_form == PER_TOKEN:  # λ is read at the captured rows
        decoder_layers = model.get_decoder().layers
        for index in attention_layers(variants.layers_of(model.config)):
            attention = decoder_layers[index].self_attn
            hooks.append(attention.register_forward_pre_hook(_row_lambdas(capture, index), with_kwargs=True))
    model.set_attn_implementation(CAPTURE_IMPL)
    _active = capture
    try:
        yield capture
    finally:
        _active = None
        model.set_attn_implementation(previous)
        for hook in hooks:
            hook.remove()


def _row_lambdas(capture: RowCapture, layer: int):
    """A pre-hook on a V2 layer's attention: λ = sigmoid(W_λ · x) at the captured rows, (h, R)."""

    def hook(module, args, kwargs):
        x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        capture.lambdas[layer] = v2_lambda(x[0, capture.rows].float(), module.lambda_proj.weight.float()).T.cpu()

    return hook
