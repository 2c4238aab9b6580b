"""TFLite/gemmlowp fixed-point primitives in 32-bit JAX integer arithmetic.

Everything here is exact and needs no 64-bit types (``jax_enable_x64`` stays
off): the 64-bit product inside :func:`srdhm` is assembled from 16-bit limbs
in ``uint32``. Load-time helpers (:func:`quantize_multiplier`) are numpy.

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


def _u32(x):
    return lax.bitcast_convert_type(jnp.asarray(x, jnp.int32), jnp.uint32)


def srdhm(a, b):
    """``SaturatingRoundingDoublingHighMul`` of int32 arrays (broadcasting)."""
    a = jnp.asarray(a, jnp.int32)
    b = jnp.asarray(b, jnp.int32)
    neg = (a < 0) != (b < 0)
    # |a|, |b| as uint32 (|INT32_MIN| = 2^31 fits).
    ua = jnp.where(a < 0, jnp.uint32(0) - _u32(a), _u32(a))
    ub = jnp.where(b < 0, jnp.uint32(0) - _u32(b), _u32(b))
    m16 = jnp.uint32(0xFFFF)
    ah, al = ua >> 16, ua & m16
    bh, bl = ub >> 16, ub & m16
    ll = al * bl
    mid = al * bh + ah * bl  # each term < 2^31: no wrap
    lo = ll + (mid << 16)
    hi = ah * bh + (mid >> 16) + (lo < ll).astype(jnp.uint32)
    # |p| + 2^30 for p >= 0, |p| + 2^30 - 1 for p < 0, then >> 31 (floor).
    c = jnp.where(neg, jnp.uint32(2**30 - 1), jnp.uint32(2**30))
    lo2 = lo + c
    hi2 = hi + (lo2 < lo).astype(jnp.uint32)
    r = (hi2 << 1) | (lo2 >> 31)
    r = lax.bitcast_convert_type(r, jnp.int32)
    out = jnp.where(neg, -r, r)
    sat = (a == INT32_MIN) & (b == INT32_MIN)
    return jnp.where(sat, jnp.int32(INT32_MAX), out)


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


def mbqm(x, multiplier, shift):
    """``MultiplyByQuantizedMultiplier(x, multiplier, shift)`` (double rounding).

    ``multiplier``/``shift`` are int32 (numpy) broadcastable against ``x``
    (per-channel along the last axis when 1-D of the channel count).
    """
    multiplier = np.asarray(multiplier, np.int32)
    shift = np.asarray(shift, np.int32)
    left = np.maximum(shift, 0)
    right = np.maximum(-shift, 0)
    y = x if not left.any() else shift_left(x, left)
    y = srdhm(y, multiplier)
    return y if not right.any() else rdbpot(y, right)


def mbqm_smaller_than_one(x, multiplier, shift):
    """``MultiplyByQuantizedMultiplierSmallerThanOneExp``: ``shift <= 0``."""
    return rdbpot(srdhm(x, np.asarray(multiplier, np.int32)), np.maximum(-np.asarray(shift, np.int32), 0))


def mbqm_greater_than_one(x, multiplier, left_shift):
    """``MultiplyByQuantizedMultiplierGreaterThanOne``: ``SRDHM(x << left_shift, M)``."""
    return srdhm(shift_left(x, left_shift), np.asarray(multiplier, np.int32))


# --- load-time (numpy / Python float64) ---------------------------------------

def rounding_shift_right_half_up(x, exponent):
    """``(x + 2^(e-1)) >> e`` (ties toward +infinity), ``e`` in ``[0, 31]``."""
    x = jnp.asarray(x, jnp.int32)
    e = np.asarray(exponent, np.int32)
    if not e.any():
        return x
    half = np.where(e > 0, np.left_shift(np.int64(1), np.maximum(e, 1) - 1), 0).astype(np.int32)
    # x + half may overflow int32 only for |x| near 2^31, where TFLite's
    # kernels overflow too.
    y = x + jnp.asarray(half)
    return lax.shift_right_arithmetic(y, jnp.broadcast_to(jnp.asarray(e), y.shape))


def mbqm_gemm(x, multiplier, shift):
    """The rescale of TFLite's x86 gemm output stage (ruy), used by the
    builtin int8 CONV_2D / FULLY_CONNECTED kernels:
    ``SRDHM(x * 2^left, M)`` then a right shift rounding ties toward +inf
    (``RoundingDivideByPOT`` rounds them away from zero; the two differ only
    on negative exact ties)."""
    multiplier = np.asarray(multiplier, np.int32)
    shift = np.asarray(shift, np.int32)
    left = np.maximum(shift, 0)
    right = np.maximum(-shift, 0)
    y = x if not left.any() else shift_left(x, left)
    return rounding_shift_right_half_up(srdhm(y, multiplier), right)
