"""Attention-logit instruments registered with transformers' attention interface (paper Table 5 and Figure 8).

- `diffeval_quant`: attention whose pre-softmax logits QKᵀ/√d are quantized by dynamic post-training absmax
  quantization to b bits before the softmax: scale = max|logit| / (2^(b−1) − 1) over the chosen granularity
  (`tensor`: one scale per sequence and layer call; `head`: per head; `row`: per query row), each logit rounded to the
  nearest of the 2^b − 1 symmetric levels. Only positions the mask allows take part. b = 16 leaves logits untouched.
- `diffeval_logit_stats`: the model's sdpa attention, plus running statistics of |logit| over all causal positions
  (top-k and a log-spaced histogram), computed in row chunks so no T×T map is held at once.
DiffLlama calls the interface twice per layer with the same queries and keys; statistics count each layer once. Only
layers that attend call the interface (a hybrid's Mamba layers never do): both say which layers they saw, keyed by
decoder index, for the caller to hold against the model's layer kinds.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

QUANT_IMPL = "diffeval_quant"
STATS_IMPL = "diffeval_logit_stats"
# |value| histogram: log-spaced bins from 1e-6 to 1e6; a median read from it is off by at most one bin's width,
# a relative error of 10**(12/HIST_BINS) − 1 ≈ 0.28 %
HIST_LOW, HIST_HIGH, HIST_BINS = -6.0, 6.0, 10_000
TOP_K = 100


def quantize_absmax(logits: torch.Tensor, bits: int, granularity: str, valid: torch.Tensor | None = None):
    """Symmetric absmax quantization of (B, H, Q, K) logits to `bits` bits; `valid` marks positions that count."""
    if bits >= 16:
        return logits
    levels = 2 ** (bits - 1) - 1
    magnitude = logits.abs() if valid is None else logits.abs().masked_fill(~valid, 0)
    dims = {"tensor": (1, 2, 3), "head": (2, 3), "row": (3,)}[granularity]
    scale = magnitude.amax(dim=dims, keepdim=True).clamp_min(torch.finfo(logits.dtype).tiny) / levels
    return torch.round(logits / scale).clamp(-levels, levels) * scale


def _valid_positions(attention_mask, q_len: int, k_len: int, device, module) -> torch.Tensor:
    """Boolean (B|1, 1, Q, K) mask of allowed positions; causal (and windowed) when no mask is given."""
    if attention_mask is not None:
        mask = attention_mask[:, :, :, :k_len]
        return mask if mask.dtype == torch.bool else mask == 0
    rows = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)  # queries are the last q_len positions
    cols = torch.arange(k_len, device=device)[None, :]
    valid = cols <= rows
    window = getattr(module, "sliding_window", None)
    if window:
        valid &= cols > rows - window
    return valid[None, None]


@dataclass
class QuantSettings:
    bits: int = 16
    granularity: str = "row"
    layers: set[int] = field(default_factory=set)  # the decoder layers whose logits went through it


_quant = QuantSettings()


def quantized_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    _quant.layers.add(module.layer_idx)
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    logits = (query @ key.transpose(2, 3)).float() * scaling
    valid = _valid_positions(attention_mask, query.shape[2], key.shape[2], query.device, module)
    logits = quantize_absmax(logits, _quant.bits, _quant.granularity, valid)
    # the smallest float, not −inf: a fully masked (padding) row then softmaxes to finite values, as eager does
    logits = logits.masked_fill(~valid, torch.finfo(logits.dtype).min)
    weights = torch.softmax(logits, dim=-1).to(value.dtype)
    output = (weights @ value).transpose(1, 2).contiguous()
    return output, weights


@contextmanager
def quantized_logits(model, bits: int, granularity: str = "row"):
    """Within the block, `model` runs attention with its logits quantized to `bits` bits; the yielded set fills with
    the decoder layers whose logits were quantized."""
    AttentionInterface.register(QUANT_IMPL, quantized_attention)
    AttentionMaskInterface.register(QUANT_IMPL, eager_mask)
    previous = model.config._attn_implementation
    _quant.bits, _quant.granularity, _quant.layers = bits, granularity, set()
    model.set_attn_implementation(QUANT_IMPL)
    try:
        yield _quant.layers
    finally:
        model.set_attn_implementation(previous)


@dataclass
class RunningStats:
    """Streaming top-k and histogram of |values|: memory does not grow with the number of values seen."""

    top: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    hist: torch.Tensor = field(default_factory=lambda: torch.zeros(HIST_BINS, dtype=torch.long))
    count: int = 0

    def add(self, values: torch.Tensor) -> None:
        magnitudes = values.detach().abs().float().flatten()
        if magnitudes.numel() == 0:
            return
        merged = torch.cat([self.top, magnitudes.topk(min(TOP_K, magnitudes.numel())).values.cpu()])
        self.top = merged.topk(min(TOP_K, merged.numel())).values
        self.hist += torch.bincount(_bins(magnitudes), minlength=HIST_BINS).cpu()
        self.count += magnitudes.numel()


def _bins(magnitudes: torch.Tensor) -> torch.Tensor:
    logs = torch.log10(magnitudes.clamp_min(10**HIST_LOW))
    return ((logs - HIST_LOW) / (HIST_HIGH - HIST_LOW) * HIST_BINS).long().clamp(0, HIST_BINS - 1)


def histogram_median(hist: list[int] | torch.Tensor) -> float:
    """The median from a histogram: the geometric centre of the bin holding the middle value."""
    counts = torch.as_tensor(hist, dtype=torch.long)
    middle = (int(counts.sum()) + 1) // 2
    index = int(torch.searchsorted(counts.cumsum(0), torch.tensor(middle)))
    return 10 ** (HIST_LOW + (index + 0.5) * (HIST_HIGH - HIST_LOW) / HIST_BINS)


_logit_stats: dict[int, RunningStats] | None = None
ROW_CHUNK = 256


def _stats_attention(module, query, key, value, attention_mask, **kwargs):
    stats = _logit_stats
    if stats is not None and module.layer_idx not in stats:
        scaling = kwargs.get("scaling") or query.shape[-1] ** -0.5
        stats[module.layer_idx] = running = RunningStats()
        groups = query.shape[1] // key.shape[1]
        keys = key[0].float().repeat_interleave(groups, dim=0)  # (H, K, d)
        q_len, k_len = query.shape[2], key.shape[2]
        for start in range(0, q_len, ROW_CHUNK):
            rows = query[0, :, start : start + ROW_CHUNK].float()
            logits = rows @ keys.transpose(1, 2) * scaling  # (H, chunk, K)
            valid = _valid_positions(None, q_len, k_len, query.device, module)[0, 0, start : start + ROW_CHUNK]
            running.add(logits[:, valid])
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


@contextmanager
def logit_statistics(model):
    """Within the block, each forward of `model` (batch of one) fills the yielded {layer: RunningStats}."""
    global _logit_stats
    AttentionInterface.register(STATS_IMPL, _stats_attention)
    AttentionMaskInterface.register(STATS_IMPL, sdpa_mask)
    previous = model.config._attn_implementation
    model.set_attn_implementation(STATS_IMPL)
    _logit_stats = {}
    try:
        yield _logit_stats
    finally:
        _logit_stats = None
        model.set_attn_implementation(previous)


def relative_median_error() -> float:
    """Bound on the relative error of `histogram_median`: one bin's width."""
    return 10 ** ((HIST_HIGH - HIST_LOW) / HIST_BINS) - 1
