"""bf16 in Triton's interpreter against a float64 model of what compiled Triton computes.

The model follows Triton's type promotion (``bf16 op bf16`` is bf16 except
``/``, which is float32; a float scalar takes the tensor's dtype): each
operation is exact in float64 and rounded once to its result's dtype
(compiled Triton widens bf16 to float32, where a product or sum of two bf16
values is exact, and rounds the result back); a ``tl.dot``
of bf16 operands sums exact products in float32; a reduction combines in
bf16 (each partial sum rounded), so it lies within ``log2(n)`` roundings of
the exact sum.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from harness.core.triton_bf16 import narrow, use_compiled_bf16, widen
from harness.core.triton_mode import interpret_triton_here

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

N = 32
U_BF16 = 2.0**-8  # bf16's unit roundoff
U_FP32 = 2.0**-24


@pytest.fixture(autouse=True, scope="module")
def interpreted() -> None:
    assert interpret_triton_here(), "the unit tests run Triton interpreted"
    assert use_compiled_bf16()


def _bf16(values: torch.Tensor) -> torch.Tensor:
    """float64 values rounded to bf16 (nearest-even), kept as float64: the model's rounding."""
    return values.to(torch.bfloat16).to(torch.float64)


def _fp32(values: torch.Tensor) -> torch.Tensor:
    return values.to(torch.float32).to(torch.float64)


def _random(*shape: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * 3).to(torch.bfloat16)


@triton.jit
def _elementwise(x_ptr, y_ptr, o_ptr, scale, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i)
    y = tl.load(y_ptr + i)
    z = x * y  # bf16 x bf16: bf16
    z = z + x
    w = tl.where(z > x, z, x)  # a comparison of bf16 values, negatives among them
    tl.store(o_ptr + i, w * 0.5)  # a float constant takes the tensor's dtype: bf16
    tl.store(o_ptr + BLOCK + i, x * scale)  # a float argument (a scalar) too
    tl.store(o_ptr + 2 * BLOCK + i, z - y / x)  # bf16 / bf16 is float32, so is the rest


@triton.jit
def _dot(a_ptr, b_ptr, o_ptr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tile = i[:, None] * BLOCK + i[None, :]
    tl.store(o_ptr + tile, tl.dot(tl.load(a_ptr + tile), tl.load(b_ptr + tile)))


@triton.jit
def _reductions(x_ptr, o_ptr, BLOCK: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, BLOCK))
    tl.store(o_ptr, tl.max(x, 0))
    tl.store(o_ptr + 1, tl.min(x, 0))
    tl.store(o_ptr + 2, tl.sum(x, 0))
    tl.store(o_ptr + 3, tl.exp(tl.max(x, 0) * 0.25))


def test_widen_and_narrow_round_as_torch_does():
    values = np.concatenate(
        [
            np.random.default_rng(0).standard_normal(1000).astype(np.float32) * 100,
            np.array([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, -0.0, np.inf, -np.inf], np.float32),
        ]
    )  # ties to even included
    expected = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy()
    assert np.array_equal(narrow(values).view(np.int16), expected)
    assert np.array_equal(
        widen(narrow(values)), torch.from_numpy(values).bfloat16().float().numpy()
    )
    assert narrow(np.array(np.nan, np.float32)) == 0x7FC0  # a quiet NaN, 0-d stays 0-d


def test_elementwise_operations_round_once_each_like_compiled_triton():
    x, y = _random(N, seed=1), _random(N, seed=2)
    out = torch.empty(3 * N, dtype=torch.bfloat16)
    _elementwise[(1,)](x, y, out, 0.3, BLOCK=N)
    a, b = x.double(), y.double()
    z = _bf16(_bf16(a * b) + a)
    w = torch.where(z > a, z, a)
    scale = _bf16(torch.tensor(0.3, dtype=torch.float64))
    difference = _fp32(z - _fp32(b / a))  # stored: rounded to bf16 from float32
    expected = torch.cat([_bf16(w * 0.5), _bf16(a * scale), _bf16(difference)])
    assert torch.equal(out.double(), expected)


def test_a_bf16_dot_sums_exact_products_in_float32():
    a, b = _random(N, N, seed=3), _random(N, N, seed=4)
    out = torch.empty(N, N, dtype=torch.float32)
    _dot[(1,)](a, b, out, BLOCK=N)
    exact = a.double() @ b.double()
    bound = N * U_FP32 * (a.double().abs() @ b.double().abs())
    assert ((out.double() - exact).abs() <= bound).all()
    assert not torch.equal(out.double(), torch.zeros_like(exact))


def test_reductions_combine_in_bf16():
    x = _random(N, seed=5)
    out = torch.empty(4, dtype=torch.bfloat16)
    _reductions[(1,)](x, out, BLOCK=N)
    values = x.double()
    assert out[0].item() == values.max().item()  # exact, negative values ordered right
    assert out[1].item() == values.min().item()
    rounding = math.ceil(math.log2(N)) * U_BF16 * values.abs().sum().item()
    assert abs(out[2].item() - values.sum().item()) <= rounding + U_BF16 * abs(out[2].item())
    expected_exp = math.exp(float(_bf16(values.max() * 0.25)))
    assert out[3].item() == pytest.approx(expected_exp, rel=2 * U_BF16)
