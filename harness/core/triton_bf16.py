"""bfloat16 in Triton's interpreter, computed as compiled Triton computes it.

Triton's interpreter keeps a bf16 tensor as its bit patterns (``uint16``
arrays) and hands those to numpy: ``tl.dot`` and the elementwise operators
multiply and add the bit patterns as integers, ``tl.sum`` sums them, ``max``
orders negative values wrongly, and a kernel that mixes a float with a bf16
tensor fails (the builder has no ``get_bf16``). So a Triton kernel that is
right in bf16 on a GPU is wrong, or crashes, on the CPU, for reasons that are
not its own.

``use_compiled_bf16`` fixes the interpreter's builder (once per process, only
when Triton interprets) so bf16 computes as compiled Triton does: operands
widened to float32 (exact), the operation in float32, the result rounded
back to bf16 to nearest-even, as every cast to bf16 rounds (the interpreter
truncates); ``tl.dot`` of bf16 operands accumulates in its
accumulator's dtype (float32) from exact products; a float constant becomes
a rounded bf16 scalar; reductions combine in bf16, pairwise as a GPU's tree
reduction does, each partial sum rounded; scans run in float32 and round once.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np


def widen(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (``uint16``) as the float32 values they hold: exact."""
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def narrow(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to bf16 (nearest, ties to even), as bit patterns."""
    wide = np.array(values, dtype=np.float32)  # a copy: contiguous, and 0-d stays 0-d
    bits = wide.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(wide), np.uint16(0x7FC0), rounded).astype(np.uint16)


def _tree_sum(values: np.ndarray, axis: int) -> np.ndarray:
    """Sum along ``axis`` in pairs, each partial sum rounded to bf16 (float32 values)."""
    data = np.moveaxis(values, axis, 0)
    while data.shape[0] > 1:
        if data.shape[0] % 2:
            data = np.concatenate([data, np.zeros_like(data[:1])])
        data = widen(narrow(data[0::2] + data[1::2]))
    return data[0]


@functools.cache
def use_compiled_bf16() -> bool:
    """Make the interpreter's bf16 arithmetic that of compiled Triton; whether it applied.

    Only the interpreter's builder changes: compiled kernels never use it.
    ``harness.core.triton_mode.interpret_triton_here`` calls this when Triton
    will interpret. False when triton is not installed.
    """
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    _patch(interpreter, tl)
    return True


def _patch(interp: Any, tl: Any) -> None:
    builder, handle, bf16 = interp.InterpreterBuilder, interp.TensorHandle, tl.bfloat16

    def is_bf16(*handles: Any) -> bool:
        return any(
            getattr(h, "dtype", None) is not None and h.dtype.scalar == bf16 for h in handles
        )

    def rounded(values: np.ndarray) -> Any:
        return handle(narrow(values), bf16)

    binary, unary, dot = builder.binary_op, builder.unary_op, builder.create_dot

    def binary_op(self: Any, lhs: Any, rhs: Any, op: Any) -> Any:
        if not is_bf16(lhs, rhs):
            return binary(self, lhs, rhs, op)
        out = op(widen(lhs.data), widen(rhs.data))
        return handle(out.astype(np.uint16), bf16) if out.dtype == np.bool_ else rounded(out)

    def unary_op(self: Any, arg: Any, op: Any) -> Any:
        return rounded(op(widen(arg.data))) if is_bf16(arg) else unary(self, arg, op)

    def create_dot(self: Any, a: Any, b: Any, d: Any, precision: Any, imprecise: Any) -> Any:
        if not is_bf16(a, b):
            return dot(self, a, b, d, precision, imprecise)
        product = np.matmul(widen(a.data), widen(b.data), dtype=np.float32)
        total = product + (widen(d.data) if is_bf16(d) else d.data)
        return rounded(total) if is_bf16(d) else handle(total.astype(d.data.dtype), d.dtype.scalar)

    def create_fma(self: Any, x: Any, y: Any, z: Any) -> Any:
        if not is_bf16(z):
            return handle(x.data * y.data + z.data, z.dtype.scalar)
        return rounded(widen(x.data) * widen(y.data) + widen(z.data))

    clampf = builder.create_clampf

    def create_clampf(self: Any, arg: Any, lo: Any, hi: Any, propagate_nans: Any) -> Any:
        if not is_bf16(arg):
            return clampf(self, arg, lo, hi, propagate_nans)
        return rounded(np.clip(widen(arg.data), widen(lo.data), widen(hi.data)))

    cast = builder.cast_impl

    def cast_impl(self: Any, src: Any, dst_type: Any) -> Any:
        to_bf16, from_bf16 = dst_type.scalar == bf16, is_bf16(src)
        if to_bf16 == from_bf16:
            return cast(self, src, dst_type)
        if to_bf16:  # the interpreter truncates; compiled Triton rounds to nearest-even
            return rounded(np.asarray(src.data).astype(np.float32))
        target = interp._get_np_dtype(dst_type)
        return handle(widen(src.data).astype(target), dst_type.scalar)

    builder.binary_op, builder.unary_op, builder.create_dot = binary_op, unary_op, create_dot
    builder.cast_impl = cast_impl  # every create_*_to_* and fp ext/trunc goes through it
    builder.create_fma, builder.create_clampf = create_fma, create_clampf
    builder.create_rsqrt = lambda self, arg: (
        rounded(1 / np.sqrt(widen(arg.data)))
        if is_bf16(arg)
        else handle(1 / np.sqrt(arg.data), arg.dtype.scalar)
    )
    builder.get_bf16 = lambda self, value: rounded(np.array([value], dtype=np.float32))
    _patch_reductions(interp, bf16)


def _patch_reductions(interp: Any, bf16: Any) -> None:
    reduce_ops, scan_ops = interp.ReduceOps, interp.ScanOps
    min_max, total, cumsum, cumprod = (
        reduce_ops.min_max,
        reduce_ops.sum,
        scan_ops.cumsum,
        scan_ops.cumprod,
    )

    def widened(tensor: Any) -> Any:
        return tensor.dtype.scalar == bf16 if hasattr(tensor, "dtype") else False

    def bf16_min_max(self: Any, input: Any, val_reduce_op: Any, idx_reduce_op: Any = None) -> Any:
        value = input[0] if isinstance(input, tuple) else input
        if not widened(value):
            return min_max(self, input, val_reduce_op, idx_reduce_op)
        data = widen(value.handle.data)
        results = []
        if val_reduce_op:
            best = val_reduce_op(data, axis=self.axis, keepdims=self.keep_dims)
            results.append(self.to_tensor(narrow(best), value.dtype))
        if idx_reduce_op:
            index = idx_reduce_op(data, axis=self.axis, keepdims=self.keep_dims)
            results.append(self.to_tensor(index, interp.tl.int32))
        return results[0] if len(results) == 1 else tuple(results)

    def bf16_sum(self: Any, input: Any) -> Any:
        if not widened(input):
            return total(self, input)
        data = widen(input.handle.data)
        axis = 0 if self.axis is None else self.axis
        flat = data.reshape(-1) if self.axis is None else data
        summed = _tree_sum(flat, axis)
        if self.keep_dims:
            summed = (
                np.expand_dims(summed, axis)
                if self.axis is not None
                else summed.reshape([1] * data.ndim)
            )
        return self.to_tensor(narrow(summed), input.dtype)

    def scan(original: Any, op: Any) -> Any:
        def bf16_scan(self: Any, input: Any) -> Any:
            if not widened(input):
                return original(self, input)
            out = op(widen(input.handle.data), axis=self.axis)
            return [self.to_tensor(narrow(out), dtype=input.dtype)]

        return bf16_scan

    reduce_ops.min_max, reduce_ops.sum = bf16_min_max, bf16_sum
    scan_ops.cumsum, scan_ops.cumprod = scan(cumsum, np.cumsum), scan(cumprod, np.cumprod)
