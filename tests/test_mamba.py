"""Mamba-1's torch scan (models/mamba.py), shared by the hf and vLLM models of Phi-4-mini-flash: the chunked scan
against a sequential float64 scan, from a given state, in about 3·√T vectorised steps; the one-token update against
the scan; the causal convolution carried across calls."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from diffeval.models import mamba


def _inputs(length: int, batch: int = 2, inner: int = 24, state: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return dict(
        u=torch.randn(batch, inner, length, generator=g),
        delta=torch.randn(batch, inner, length, generator=g),
        A=-torch.rand(inner, state, generator=g) * 4,
        B=torch.randn(batch, state, length, generator=g),
        C=torch.randn(batch, state, length, generator=g),
        D=torch.randn(inner, generator=g),
        z=torch.randn(batch, inner, length, generator=g),
        delta_bias=torch.randn(inner, generator=g),
        initial_state=torch.randn(batch, inner, state, generator=g),
    )


def _sequential(u, delta, A, B, C, D, z, delta_bias, initial_state):
    """The recurrence token by token in float64, as Mamba's reference `selective_scan_ref` writes it."""
    u, delta, A, B, C, D, z, delta_bias = (t.double() for t in (u, delta, A, B, C, D, z, delta_bias))
    dt = F.softplus(delta + delta_bias[:, None])
    h, ys = initial_state.double().clone(), []
    for t in range(u.shape[-1]):
        h = torch.exp(dt[:, :, t, None] * A) * h + (dt[:, :, t] * u[:, :, t])[..., None] * B[:, None, :, t]
        ys.append((h * C[:, None, :, t]).sum(-1) + D * u[:, :, t])
    return torch.stack(ys, -1) * F.silu(z), h


@pytest.mark.parametrize("length", [1, 5, 16, 17, 300, 2000])
def test_the_chunked_scan_is_within_1e_4_of_a_sequential_float64_scan(length):
    inputs = _inputs(length)
    y, state = mamba.selective_scan(**inputs)
    expected_y, expected_state = _sequential(**inputs)
    assert y.dtype == torch.float32 and state.dtype == torch.float32
    assert (y.double() - expected_y).abs().max() < 1e-4
    assert (state.double() - expected_state).abs().max() < 1e-4
    y64, _ = mamba.selective_scan(**{k: v.double() for k, v in inputs.items()})
    assert (y64 - expected_y).abs().max() < 1e-10  # the same arithmetic: only rounding differs


def test_the_scan_takes_about_three_root_t_steps_not_t(monkeypatch):
    """No Python loop per token: the decays are computed once per chunk position and chunk, so the calls of exp
    grow as √T."""
    calls = 0
    real_exp = torch.exp

    def counted(*args, **kwargs):
        nonlocal calls
        calls += 1
        return real_exp(*args, **kwargs)

    monkeypatch.setattr(mamba.torch, "exp", counted)
    length = 4096
    mamba.selective_scan(**_inputs(length, batch=1, inner=4, state=2))
    assert calls <= 3 * math.isqrt(length) + 2 < length // 10


def test_the_one_token_update_equals_the_scan_of_that_token():
    inputs = _inputs(1)
    y, state = mamba.selective_scan(**inputs)
    one = {k: inputs[k][..., 0] for k in ("u", "delta", "B", "C", "z")}
    y1, state1 = mamba.selective_state_update(
        inputs["initial_state"], one["u"], one["delta"], inputs["A"], one["B"], one["C"], inputs["D"], one["z"],
        inputs["delta_bias"],
    )  # fmt: skip
    torch.testing.assert_close(y1, y[..., 0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(state1, state, atol=1e-6, rtol=1e-6)


def test_a_scan_split_in_two_calls_equals_one_call():
    """Chunked prefill: the state after the first part is the second part's initial state."""
    inputs = _inputs(100)
    whole, whole_state = mamba.selective_scan(**inputs)
    first = {k: v[..., :37] if v.dim() == 3 and k != "initial_state" else v for k, v in inputs.items()}
    rest = {k: v[..., 37:] if v.dim() == 3 and k != "initial_state" else v for k, v in inputs.items()}
    y1, state = mamba.selective_scan(**first)
    y2, final = mamba.selective_scan(**{**rest, "initial_state": state})
    torch.testing.assert_close(torch.cat([y1, y2], -1), whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(final, whole_state, atol=1e-5, rtol=1e-5)


def test_the_causal_convolution_carries_its_inputs_across_calls():
    g = torch.Generator().manual_seed(1)
    x, weight, bias = torch.randn(2, 6, 20, generator=g), torch.randn(6, 4, generator=g), torch.randn(6, generator=g)
    whole, _ = mamba.causal_conv1d(x, weight, bias)
    first, state = mamba.causal_conv1d(x[..., :9], weight, bias)
    rest, _ = mamba.causal_conv1d(x[..., 9:], weight, bias, state)
    torch.testing.assert_close(torch.cat([first, rest], -1), whole)
    expected = F.silu(F.conv1d(F.pad(x, (3, 0)), weight[:, None, :], bias, groups=6))
    torch.testing.assert_close(whole, expected)
