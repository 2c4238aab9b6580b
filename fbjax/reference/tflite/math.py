"""Element-wise math, comparison, logical and bitwise ops (numpy reference).

Written from the TFLite kernels' semantics (``kernels/elementwise.cc``,
``floor_div.cc``, ``floor_mod.cc``, ``round.cc``, ``comparisons.cc``,
``activations.cc``, ``cast.cc``...). Float math is done in float64 and cast
to the output dtype.
"""

from __future__ import annotations

import math

import numpy as np

from . import reject_quantized, to_out
from ..registry import register


def _f64(x):
    x = np.asarray(x)
    return x.astype(np.float64) if np.issubdtype(x.dtype, np.floating) else x


def _u(ctx, fn, x):
    reject_quantized(ctx)
    with np.errstate(all="ignore"):
        return to_out(ctx, fn(_f64(x)))


@register("tflite", "ABS")
def ABS(ctx, x):
    """``|x|``."""
    return _u(ctx, np.abs, x)


@register("tflite", "CEIL")
def CEIL(ctx, x):
    """``ceil(x)``."""
    return _u(ctx, np.ceil, x)


@register("tflite", "FLOOR")
def FLOOR(ctx, x):
    """``floor(x)``."""
    return _u(ctx, np.floor, x)


@register("tflite", "ROUND")
def ROUND(ctx, x):
    """Round half to even (TFLite ``RoundToNearest``): floor, then +1 when the
    fraction is above 0.5 or exactly 0.5 with an odd floor."""
    def f(v):
        fl = np.floor(v)
        d = v - fl
        up = (d > 0.5) | ((d == 0.5) & (np.fmod(fl, 2) != 0))
        return fl + up
    return _u(ctx, f, x)


@register("tflite", "COS")
def COS(ctx, x):
    """``cos(x)``."""
    return _u(ctx, np.cos, x)


@register("tflite", "SIN")
def SIN(ctx, x):
    """``sin(x)``."""
    return _u(ctx, np.sin, x)


@register("tflite", "EXP")
def EXP(ctx, x):
    """``exp(x)``."""
    return _u(ctx, np.exp, x)


@register("tflite", "LOG")
def LOG(ctx, x):
    """Natural log."""
    return _u(ctx, np.log, x)


@register("tflite", "SQRT")
def SQRT(ctx, x):
    """``sqrt(x)``."""
    return _u(ctx, np.sqrt, x)


@register("tflite", "RSQRT")
def RSQRT(ctx, x):
    """``1 / sqrt(x)``."""
    return _u(ctx, lambda v: 1.0 / np.sqrt(v), x)


@register("tflite", "SQUARE")
def SQUARE(ctx, x):
    """``x * x``."""
    return _u(ctx, lambda v: v * v, x)


@register("tflite", "NEG")
def NEG(ctx, x):
    """``-x``."""
    return _u(ctx, np.negative, x)


@register("tflite", "SIGN")
def SIGN(ctx, x):
    """-1, 0 or 1."""
    return _u(ctx, np.sign, x)


@register("tflite", "LOGICAL_NOT")
def LOGICAL_NOT(ctx, x):
    """Boolean not."""
    return np.logical_not(x)


@register("tflite", "ZEROS_LIKE")
def ZEROS_LIKE(ctx, x):
    """Zeros of ``x``'s shape and dtype."""
    return np.zeros_like(x)


@register("tflite", "ELU")
def ELU(ctx, x):
    """``x < 0 ? exp(x) - 1 : x``."""
    return _u(ctx, lambda v: np.where(v < 0, np.expm1(np.minimum(v, 0)), v), x)


@register("tflite", "LEAKY_RELU")
def LEAKY_RELU(ctx, x, *, alpha=0.0):
    """``x > 0 ? x : alpha * x``."""
    return _u(ctx, lambda v: np.where(v > 0, v, v * float(np.float32(alpha))), x)


@register("tflite", "GELU")
def GELU(ctx, x, *, approximate=False):
    """``0.5 x (1 + erf(x / sqrt 2))``, or the tanh approximation
    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""
    if approximate:
        f = lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))  # noqa: E731
    else:
        erf = np.vectorize(math.erf, otypes=[np.float64])
        f = lambda v: 0.5 * v * (1 + erf(v / math.sqrt(2)))  # noqa: E731
    return _u(ctx, f, x)


@register("tflite", "SOFTMAX")
def SOFTMAX(ctx, x, *, beta=1.0):
    """``exp(beta (x - max)) / sum`` over the last axis."""
    def f(v):
        z = (v - v.max(axis=-1, keepdims=True)) * float(np.float32(beta))
        e = np.exp(z)
        return e / e.sum(axis=-1, keepdims=True)
    return _u(ctx, f, x)


@register("tflite", "LOG_SOFTMAX")
def LOG_SOFTMAX(ctx, x):
    """``x - max - log(sum(exp(x - max)))`` over the last axis."""
    def f(v):
        z = v - v.max(axis=-1, keepdims=True)
        return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return _u(ctx, f, x)


@register("tflite", "CAST")
def CAST(ctx, x, *, in_data_type=None, out_data_type=None):
    """Convert to the output dtype: float -> int truncates toward zero and
    saturates (kernels/cast.cc ``SaturatingCastFloatingToInteger``: below the
    range the type's minimum, above it or NaN its maximum), -> bool is
    ``!= 0``, complex keeps its real part."""
    dt = np.dtype(ctx.out_dtype(0))
    x = np.asarray(x)
    if dt == np.bool_:
        return x != 0
    if np.iscomplexobj(x) and dt.kind != "c":
        x = x.real
    if dt.kind in "iu" and x.dtype.kind == "f":
        info = np.iinfo(dt)
        t = np.trunc(x.astype(np.float64))
        hi, lo = np.isnan(t) | (t >= float(info.max)), t <= float(info.min)
        out = np.zeros(x.shape, dt)
        out[hi], out[lo] = info.max, info.min
        mid = ~(hi | lo)
        out[mid] = t[mid].astype(dt)
        return out
    with np.errstate(all="ignore"):
        return x.astype(dt)


def _b(ctx, fn, a, b):
    reject_quantized(ctx)
    with np.errstate(all="ignore"):
        return to_out(ctx, fn(_f64(a), _f64(b)))


@register("tflite", "MAXIMUM")
def MAXIMUM(ctx, a, b):
    """Element-wise ``a > b ? a : b``, broadcasting (kernels/maximum_minimum.cc
    ``MaximumOp``: NaN in ``a`` gives ``b``, NaN in ``b`` gives NaN)."""
    return _b(ctx, lambda x, y: np.where(x > y, x, y), a, b)


@register("tflite", "MINIMUM")
def MINIMUM(ctx, a, b):
    """Element-wise ``a < b ? a : b``, broadcasting (``MinimumOp``)."""
    return _b(ctx, lambda x, y: np.where(x < y, x, y), a, b)


@register("tflite", "POW")
def POW(ctx, a, b):
    """``a ** b``."""
    return _b(ctx, np.power, a, b)


@register("tflite", "SQUARED_DIFFERENCE")
def SQUARED_DIFFERENCE(ctx, a, b):
    """``(a - b)^2``."""
    return _b(ctx, lambda x, y: (x - y) ** 2, a, b)


@register("tflite", "FLOOR_DIV")
def FLOOR_DIV(ctx, a, b):
    """``floor(a / b)``."""
    return _b(ctx, lambda x, y: np.floor_divide(x, y) if x.dtype.kind in "iu" else np.floor(x / y), a, b)


@register("tflite", "FLOOR_MOD")
def FLOOR_MOD(ctx, a, b):
    """Remainder with the divisor's sign (Python ``%``)."""
    def f(x, y):
        r = np.fmod(x, y)
        return np.where((r != 0) & ((r < 0) != (y < 0)), r + y, r)
    return _b(ctx, f, a, b)


@register("tflite", "ATAN2")
def ATAN2(ctx, a, b):
    """``atan2(a, b)``."""
    return _b(ctx, np.arctan2, a, b)


@register("tflite", "BITWISE_XOR")
def BITWISE_XOR(ctx, a, b):
    """Bitwise xor."""
    return _b(ctx, np.bitwise_xor, a, b)


@register("tflite", "RIGHT_SHIFT")
def RIGHT_SHIFT(ctx, a, b):
    """``a >> b`` (arithmetic for signed types)."""
    return _b(ctx, np.right_shift, a, b)


@register("tflite", "ADD_N")
def ADD_N(ctx, *xs):
    """Sum of all inputs."""
    reject_quantized(ctx)
    return to_out(ctx, sum(_f64(x) for x in xs))


def _cmp(fn, a, b):
    return fn(np.asarray(a), np.asarray(b))


@register("tflite", "EQUAL")
def EQUAL(ctx, a, b):
    """``a == b``."""
    return _cmp(np.equal, a, b)


@register("tflite", "NOT_EQUAL")
def NOT_EQUAL(ctx, a, b):
    """``a != b``."""
    return _cmp(np.not_equal, a, b)


@register("tflite", "LESS")
def LESS(ctx, a, b):
    """``a < b``."""
    return _cmp(np.less, a, b)


@register("tflite", "LESS_EQUAL")
def LESS_EQUAL(ctx, a, b):
    """``a <= b``."""
    return _cmp(np.less_equal, a, b)


@register("tflite", "GREATER")
def GREATER(ctx, a, b):
    """``a > b``."""
    return _cmp(np.greater, a, b)


@register("tflite", "GREATER_EQUAL")
def GREATER_EQUAL(ctx, a, b):
    """``a >= b``."""
    return _cmp(np.greater_equal, a, b)


@register("tflite", "LOGICAL_AND")
def LOGICAL_AND(ctx, a, b):
    """Boolean and."""
    return np.logical_and(a, b)


@register("tflite", "LOGICAL_OR")
def LOGICAL_OR(ctx, a, b):
    """Boolean or."""
    return np.logical_or(a, b)


@register("tflite", "SELECT")
def SELECT(ctx, c, a, b):
    """``c ? a : b``; a 1-D ``c`` picks rows of higher-rank ``a``/``b``."""
    c = np.asarray(c)
    if c.ndim == 1 and np.ndim(a) > 1:
        c = c.reshape(c.shape + (1,) * (np.ndim(a) - 1))
    return np.where(c, a, b)


@register("tflite", "SELECT_V2")
def SELECT_V2(ctx, c, a, b):
    """``c ? a : b`` with broadcasting."""
    return np.where(c, a, b)


@register("tflite", "REAL")
def REAL(ctx, x):
    """Real part."""
    return to_out(ctx, np.real(x))


@register("tflite", "IMAG")
def IMAG(ctx, x):
    """Imaginary part."""
    return to_out(ctx, np.imag(x))


@register("tflite", "COMPLEX_ABS")
def COMPLEX_ABS(ctx, x):
    """Modulus."""
    return to_out(ctx, np.abs(np.asarray(x).astype(np.complex128)))


@register("tflite", "BITCAST")
def BITCAST(ctx, x):
    """Reinterpret bytes as the output dtype (TF shape rules)."""
    x = np.ascontiguousarray(x)
    dt = np.dtype(ctx.out_dtype(0))
    if dt.itemsize == x.dtype.itemsize:
        return x.view(dt)
    if dt.itemsize < x.dtype.itemsize:
        return x.view(dt).reshape(x.shape + (x.dtype.itemsize // dt.itemsize,))
    return x.view(dt).reshape(x.shape[:-1])


@register("tflite", "FAKE_QUANT")
def FAKE_QUANT(ctx, x, *, min=0.0, max=0.0, num_bits=8, narrow_range=False):  # noqa: A002
    """Quantize-dequantize on TF's nudged grid (float32 steps, as the kernel)."""
    f = np.float32
    qmin, qmax = (1 if narrow_range else 0), (1 << int(num_bits)) - 1
    scale = f((f(max) - f(min)) / f(qmax - qmin))
    zf = f(qmin) - f(min) / scale
    zp = qmin if zf < qmin else qmax if zf > qmax else float(np.sign(zf) * np.floor(abs(zf) + 0.5))
    nmin, nmax = f((qmin - zp) * scale), f((qmax - zp) * scale)
    x = np.asarray(x, np.float32)
    q = np.floor((np.clip(x, nmin, nmax) - nmin) * (f(1) / scale) + f(0.5))
    return to_out(ctx, q * scale + nmin)
