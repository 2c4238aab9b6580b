"""numpy twins of TFLite's fixed-point primitives, in plain int64 arithmetic.

Written from the definitions in TFLite's ``kernels/internal/common.h``,
independently of :mod:`fbjax.lower.tflite_int.fixedpoint`
(which avoids 64-bit types with 16-bit limbs).
"""

from __future__ import annotations

import math

import numpy as np


def srdhm(a, b):
    """``SaturatingRoundingDoublingHighMul`` (int32 semantics, int64 math)."""
    a = np.asarray(a, np.int64)
    b = np.asarray(b, np.int64)
    ab = a * b
    nudge = np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    s = ab + nudge
    q = np.where(s >= 0, s // (1 << 31), -((-s) // (1 << 31)))  # C truncation
    return np.where((a == -(2**31)) & (b == -(2**31)), 2**31 - 1, q)


def rdbpot(x, e):
    """``RoundingDivideByPOT``: round half away from zero."""
    x = np.asarray(x, np.int64)
    e = np.asarray(e, np.int64)
    mask = (np.int64(1) << e) - 1
    rem = x & mask
    th = (mask >> 1) + (x < 0)
    return (x >> e) + (rem > th)


def wrap32(x):
    x = np.asarray(x, np.int64)
    return ((x + 2**31) % 2**32) - 2**31


def mbqm(x, m, shift):
    """``MultiplyByQuantizedMultiplier`` (double rounding, int32 input)."""
    shift = np.asarray(shift, np.int64)
    left = np.maximum(shift, 0)
    right = np.maximum(-shift, 0)
    return rdbpot(srdhm(wrap32(np.asarray(x, np.int64) * (np.int64(1) << left)), m), right)


def mbqm64(x, m, shift):
    """The int64 overload: 15-bit multiplier, one rounding shift."""
    m = np.asarray(m, np.int64)
    red = np.where(m < 0x7FFF0000, (m + (1 << 15)) >> 16, 0x7FFF)
    total = 15 - np.asarray(shift, np.int64)
    return (np.asarray(x, np.int64) * red + (np.int64(1) << (total - 1))) >> total


def quantize_multiplier(real: float):
    """``QuantizeMultiplier`` -> ``(q, shift)``."""
    if real == 0.0:
        return 0, 0
    frac, e = math.frexp(float(real))
    q = int(math.floor(abs(frac) * 2**31 + 0.5)) * (1 if frac >= 0 else -1)
    if q == 2**31:
        q //= 2
        e += 1
    if e < -31:
        return 0, 0
    return q, e


def multipliers(reals):
    out = [quantize_multiplier(float(r)) for r in np.asarray(reals, np.float64).reshape(-1)]
    return np.array([q for q, _ in out], np.int64), np.array([s for _, s in out], np.int64)


def round_half_away(x):
    x = np.asarray(x, np.float64)
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def qp(ctx, v):
    """(scales float32 1-D, zero points int64 1-D)."""
    if v is None or v.quant is None:
        raise ctx.error("missing quantization parameters")
    z = np.asarray(v.quant.zero_point, np.int64).reshape(-1)
    return np.asarray(v.quant.scale, np.float32).reshape(-1), (z if z.size else np.zeros(1, np.int64))


def sz(ctx, v):
    s, z = qp(ctx, v)
    return np.float32(s[0]), int(z[0])


def qrange(dt):
    i = np.iinfo(np.dtype(dt))
    return int(i.min), int(i.max)


def act_range(ctx, fused, v):
    lo, hi = qrange(v.dtype)
    s, z = sz(ctx, v)

    def q(f):
        return z + int(round_half_away(np.float32(f) / s))

    if fused in (None, "NONE"):
        return lo, hi
    if fused == "RELU":
        return max(lo, q(0.0)), hi
    if fused == "RELU6":
        return max(lo, q(0.0)), min(hi, q(6.0))
    if fused == "RELU_N1_TO_1":
        return max(lo, q(-1.0)), min(hi, q(1.0))
    raise ctx.error(f"fused activation {fused} on quantized tensors")
