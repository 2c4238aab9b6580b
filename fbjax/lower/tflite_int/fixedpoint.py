"""TFLite/gemmlowp fixed-point primitives in 32-bit JAX integer arithmetic.

Everything here is exact and leaves ``jax_enable_x64`` as the user set it:
the 64-bit products inside :func:`srdhm` and :func:`requantize` are formed
in int64 under a local ``jax.enable_x64`` (a few operations, converted back
to int32 or the output type). :func:`requantize` is the whole output stage
of a kernel (rescale with either tie rule, zero point, clamp, cast) as one
int64 expression. Load-time helpers (:func:`quantize_multiplier`) are numpy.

Semantics follow TFLite's ``kernels/internal/common.h``:

* ``SaturatingRoundingDoublingHighMul(a, b)``: ``(a*b + nudge) / 2^31`` with
  ``nudge = 2^30`` if ``a*b >= 0`` else ``1 - 2^30``, C (truncating)
  division; ``INT32_MAX`` for ``a == b == INT32_MIN``.
* ``RoundingDivideByPOT(x, e)``: ``x / 2^e`` rounded half away from zero.
* ``MultiplyByQuantizedMultiplier(x, M, shift)`` (default double rounding):
  ``RDBPOT(SRDHM(x * 2^max(shift, 0), M), max(-shift, 0))``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...quantmath import (  # noqa: F401  (load-time helpers, JAX-free, shared with the passes and writers)
    quantize_multiplier,
    quantize_multiplier_greater_than_one,
    quantize_multiplier_smaller_than_one,
    quantize_multipliers,
    round_half_away,
)

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1


def srdhm(a, b):
    """``SaturatingRoundingDoublingHighMul`` of int32 arrays (broadcasting).

    The product is formed exactly in int64 (``jax.enable_x64`` around these
    few operations only: the user's setting and the rest of the program stay
    32-bit). The C kernel's ``(a*b + nudge) / 2^31`` with truncating division
    and ``nudge = 2^30`` or ``1 - 2^30`` by the product's sign is
    ``floor((a*b + 2^30) / 2^31)`` for either sign (for ``p = a*b < 0``:
    ``trunc((p + 1 - 2^30) / 2^31) = ceil(...) = floor((p + 2^30) / 2^31)``),
    i.e. one add and one arithmetic shift of the int64 product (checked
    against the numpy reference's truncating formula on random and edge
    pairs). The saturating case ``a == b == INT32_MIN`` is tested only where
    ``b`` is not a constant without ``INT32_MIN`` (quantized multipliers
    never are).
    """
    b_const = isinstance(b, (np.ndarray, np.generic, int))
    needs_sat = not b_const or bool(np.any(np.asarray(b) == INT32_MIN))
    a = jnp.asarray(a, jnp.int32)
    with jax.enable_x64(True):
        if b_const:
            b64 = jnp.asarray(np.asarray(b, np.int64))
        else:
            b64 = lax.convert_element_type(jnp.asarray(b, jnp.int32), jnp.int64)
        p = lax.convert_element_type(a, jnp.int64) * b64
        r = lax.convert_element_type((p + np.int64(2**30)) >> np.int64(31), jnp.int32)
    if not needs_sat:
        return r
    b = jnp.asarray(b, jnp.int32)
    return jnp.where((a == INT32_MIN) & (b == INT32_MIN), jnp.int32(INT32_MAX), r)


def rdbpot(x, exponent):
    """``RoundingDivideByPOT``: ``x / 2^exponent`` rounded half away from zero
    (``exponent`` in ``[0, 31]``, array or int)."""
    x = jnp.asarray(x, jnp.int32)
    e = jnp.asarray(exponent, jnp.int32)
    mask = (jnp.int32(1) << e) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0).astype(jnp.int32)
    return lax.shift_right_arithmetic(x, jnp.broadcast_to(e, x.shape) if e.ndim else e) + (
        remainder > threshold
    ).astype(jnp.int32)


def shift_left(x, n):
    """``x * 2^n`` with int32 wrap-around (as the C kernels' ``x * (1 << n)``)."""
    x = jnp.asarray(x, jnp.int32)
    return x * (jnp.int32(1) << jnp.asarray(n, jnp.int32))


def _const(v):
    """A numpy constant as a scalar when all its values are equal (one
    StableHLO constant instead of an array)."""
    v = np.asarray(v)
    return v.reshape(-1)[0] if v.size and np.all(v == v.reshape(-1)[0]) else v


def bconst(v, shape, dtype):
    """numpy ``v`` as an operand of a ``lax`` binary op on arrays of
    ``shape``: a scalar when all its values are equal, else broadcast with
    numpy's trailing alignment (``lax`` calls, no ``jnp`` dispatch: tracing
    time is part of a model's first call)."""
    v = _const(np.asarray(v).astype(dtype))
    if v.ndim == 0:
        return v
    nd = len(shape)
    return lax.broadcast_in_dim(jnp.asarray(v), tuple(shape), tuple(range(nd - v.ndim, nd)))


def mbqm(x, multiplier, shift, *, ties_up=False):
    """``MultiplyByQuantizedMultiplier(x, multiplier, shift)`` (double rounding):
    ``RoundingDivideByPOT(SRDHM(x * 2^left, M), right)``, or with ``ties_up``
    the x86 gemm output stage's final shift (ties toward +inf) instead of
    ``RoundingDivideByPOT`` (ties away from zero).

    ``x`` int32; ``multiplier``/``shift`` int32 (numpy) broadcastable against
    ``x`` (per channel along the last axis when 1-D of the channel count);
    ``ties_up`` a bool, or a bool array (numpy, or computed in the program)
    broadcastable against ``x`` (the kernels whose vector body and scalar
    tail round differently). Returns int32.

    Both roundings are one int64 expression on ``t = (x * 2^left) * M``
    (``x * 2^left`` wraps in int32 first, as in C): with ``r = floor((t +
    2^30) / 2^31)`` (SRDHM, see :func:`srdhm`) and ``e = right > 0``, the
    final shift is ``floor((r + c) / 2^e)`` with ``c = 2^(e-1)`` (ties up)
    or ``2^(e-1) - [r < 0]`` (ties away), and ``floor((floor(a/b) + c)/d) =
    floor((a + c b) / (b d))`` for integer ``c``, so the result is
    ``(t + 2^30 + 2^(30+e) - [t < -2^30] 2^31) >> (31 + e)``; ``|t| <= 2^62``
    leaves room in int64. No int32 intermediate can overflow, as in the
    numpy reference (``fbjax.reference.tflite_int``); checked against it in
    tests/test_tflite_quant.py on random and edge inputs, every shift and
    both tie rules.
    """
    return requantize(x, multiplier, shift, ties_up=ties_up)


def requantize(x, multiplier, shift, *, ties_up=False, offset=0, clamp=None, dtype=jnp.int32):
    """``clamp(mbqm(x, multiplier, shift, ties_up=ties_up) + offset)`` cast
    to ``dtype``, all in the one int64 expression of :func:`mbqm` (the
    kernels' rescale, output zero point and activation clamp).

    ``offset``: an int (the output zero point), added exactly before the
    final shift as ``offset * 2^(31+e)`` when that is at most ``2^61`` in
    magnitude (with ``|t| < 2^62`` and ``2^30 + 2^(30+e) <= 2^61`` the sum
    stays inside int64), else after it. ``clamp``:
    ``(lo, hi)`` ints or None (then the result must fit ``dtype``, as the
    int32 results of :func:`mbqm` do). As the numpy reference, nothing wraps
    after the left shift: ``mbqm + offset`` is clamped in int64.
    """
    multiplier = np.asarray(multiplier, np.int64)
    shift = np.asarray(shift, np.int64)
    left = np.maximum(shift, 0)
    right = np.maximum(-shift, 0)
    y = jnp.asarray(x)
    if y.dtype != np.int32:
        y = lax.convert_element_type(y, np.int32)
    shape = y.shape
    if left.any():
        # x * 2^left wrapping in int32 as C's x * (1 << left) (2^31 is INT32_MIN)
        pot = (np.left_shift(np.int64(1), left) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)
        y = lax.mul(y, bconst(pot, shape, np.int32))
    k = np.int64(2**30) + np.where(right > 0, np.left_shift(np.int64(1), 30 + right), 0).astype(np.int64)
    offset = int(offset)
    fold = offset != 0 and abs(offset) << (31 + int(right.max(initial=0))) <= 2**61
    if fold:
        k = k + np.int64(offset) * np.left_shift(np.int64(1), 31 + right)
    traced = not isinstance(ties_up, (bool, np.bool_, np.ndarray))
    away = (right > 0) & (True if traced else ~np.asarray(ties_up, bool))
    with jax.enable_x64(True):
        t = lax.mul(lax.convert_element_type(y, np.int64), bconst(multiplier, shape, np.int64))
        s = lax.add(t, bconst(k, shape, np.int64))
        if away.any():
            neg = lax.lt(t, np.int64(-(2**30)))
            if traced:  # a mask computed in the program (kernels.tail_mask with a symbolic batch)
                neg = lax.bitwise_and(neg, lax.bitwise_not(jnp.broadcast_to(ties_up, shape)))
            corr = np.where(away, np.int64(2**31), np.int64(0))
            s = lax.sub(s, lax.mul(lax.convert_element_type(neg, np.int64), bconst(corr, shape, np.int64)))
        s = lax.shift_right_arithmetic(s, bconst(31 + right, shape, np.int64))
        if offset and not fold:
            s = lax.add(s, np.int64(offset))
        if clamp is not None:
            s = lax.clamp(np.int64(clamp[0]), s, np.int64(clamp[1]))
        return lax.convert_element_type(s, np.dtype(dtype))


# --- load-time (numpy / Python float64) ---------------------------------------
