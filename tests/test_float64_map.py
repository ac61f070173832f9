"""A float64 copy of the model computes in float64 (bench_stability.py --findings compares iteration
counts in float32 and float64): the norms and RoPE keep its precision instead of rounding to float32."""

from __future__ import annotations

import torch

from recurrent_model import functional as fn


def test_rms_norm_keeps_float64():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 8, dtype=torch.float64, generator=g)
    w = torch.rand(8, dtype=torch.float64, generator=g)
    reference = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    out = fn.rms_norm(x, w, 1e-6)
    assert out.dtype == torch.float64
    assert torch.allclose(out, reference, rtol=1e-13, atol=0)


def test_rope_keeps_float64():
    x = torch.randn(1, 3, 2, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    table = fn.rope_table(8, 3, 10000.0)
    pairs = torch.view_as_complex(x.unflatten(-1, (-1, 2)).contiguous())
    reference = torch.view_as_real(pairs * table.to(torch.complex128).view(3, 1, 4)).flatten(-2)
    out = fn.apply_rope(x, table)
    assert out.dtype == torch.float64
    assert torch.allclose(out, reference, rtol=1e-13, atol=1e-15)
