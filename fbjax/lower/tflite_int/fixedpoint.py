"""TFLite/gemmlowp fixed-point primitives in 32-bit JAX integer arithmetic.

Everything here is exact and leaves ``jax_enable_x64`` as the user set it:
the 64-bit product inside :func:`srdhm` is formed in int64 under a local
``jax.enable_x64`` (a few operations, converted back to int32).
Load-time helpers (:func:`quantize_multiplier`) are numpy.

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
    32-bit): ``(a*b + nudge) / 2^31`` with XLA's truncating integer division,
    as the C kernel. 26 StableHLO ops instead of the 81 of the former
    emulation in 16-bit limbs (bit-identical: checked on 3e5 random and
    edge-case pairs against the numpy reference), which made the quantized
    programs slow to compile. The saturating case ``a == b ==
    INT32_MIN`` is tested only where ``b`` is not a constant without
    ``INT32_MIN`` (quantized multipliers are positive).
    """
    b_const = isinstance(b, (np.ndarray, np.generic, int))
    needs_sat = not b_const or bool(np.any(np.asarray(b) == INT32_MIN))
    a = jnp.asarray(a, jnp.int32)
    b = jnp.asarray(b, jnp.int32)
    shape = jnp.broadcast_shapes(a.shape, b.shape)
    a32, b32 = jnp.broadcast_to(a, shape), jnp.broadcast_to(b, shape)
    with jax.enable_x64(True):
        p = lax.mul(lax.convert_element_type(a32, jnp.int64), lax.convert_element_type(b32, jnp.int64))
        nudge = lax.select(p >= 0, lax.full_like(p, 2**30), lax.full_like(p, 1 - 2**30))
        r = lax.convert_element_type(lax.div(lax.add(p, nudge), lax.full_like(p, 2**31)), jnp.int32)
    if not needs_sat:
        return r
    return jnp.where((a32 == INT32_MIN) & (b32 == INT32_MIN), jnp.int32(INT32_MAX), r)


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
