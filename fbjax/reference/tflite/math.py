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


def _round_half_even(v):
    """Round half to even (TFLite ``RoundToNearest``): floor, then +1 when the
    fraction is above 0.5 or exactly 0.5 with an odd floor."""
    fl = np.floor(v)
    d = v - fl
    up = (d > 0.5) | ((d == 0.5) & (np.fmod(fl, 2) != 0))
    return fl + up


def _register(name: str, fn, doc: str, arity: int, wrap):
    """Register ``name`` as ``wrap(ctx, fn, *inputs)`` with ``arity`` inputs
    (their parameter names: ``x`` or ``a, b``)."""
    if arity == 1:
        def op(ctx, x):
            return wrap(ctx, fn, x)
    else:
        def op(ctx, a, b):
            return wrap(ctx, fn, a, b)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = doc
    register("tflite", name)(op)
    return op


def _plain(ctx, fn, *xs):
    return fn(*xs)


#: one-input ops, float math in float64: ``name: (fn, doc)``
_UNARY = {
    "ABS": (np.abs, "``|x|``."),
    "CEIL": (np.ceil, "``ceil(x)``."),
    "FLOOR": (np.floor, "``floor(x)``."),
    "ROUND": (_round_half_even, "Round half to even (:func:`_round_half_even`)."),
    "COS": (np.cos, "``cos(x)``."),
    "SIN": (np.sin, "``sin(x)``."),
    "EXP": (np.exp, "``exp(x)``."),
    "LOG": (np.log, "Natural log."),
    "SQRT": (np.sqrt, "``sqrt(x)``."),
    "RSQRT": (lambda v: 1.0 / np.sqrt(v), "``1 / sqrt(x)``."),
    "SQUARE": (lambda v: v * v, "``x * x``."),
    "NEG": (np.negative, "``-x``."),
    "SIGN": (np.sign, "-1, 0 or 1."),
}
#: one-input ops on bool or any tensors
_UNARY_ANY = {
    "LOGICAL_NOT": (np.logical_not, "Boolean not."),
    "ZEROS_LIKE": (np.zeros_like, "Zeros of ``x``'s shape and dtype."),
}
for _n, (_f, _d) in _UNARY.items():
    _register(_n, _f, _d, 1, _u)
for _n, (_f, _d) in _UNARY_ANY.items():
    _register(_n, _f, _d, 1, _plain)


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


def _floor_mod(x, y):
    r = np.fmod(x, y)
    return np.where((r != 0) & ((r < 0) != (y < 0)), r + y, r)


#: two-input ops with broadcasting, float math in float64: ``name: (fn, doc)``
_BINARY = {
    "MAXIMUM": (lambda x, y: np.where(x > y, x, y),
                "Element-wise ``a > b ? a : b``, broadcasting (kernels/maximum_minimum.cc ``MaximumOp``: NaN in "
                "``a`` gives ``b``, NaN in ``b`` gives NaN)."),
    "MINIMUM": (lambda x, y: np.where(x < y, x, y), "Element-wise ``a < b ? a : b``, broadcasting (``MinimumOp``)."),
    "POW": (np.power, "``a ** b``."),
    "SQUARED_DIFFERENCE": (lambda x, y: (x - y) ** 2, "``(a - b)^2``."),
    "FLOOR_DIV": (lambda x, y: np.floor_divide(x, y) if x.dtype.kind in "iu" else np.floor(x / y),
                  "``floor(a / b)``."),
    "FLOOR_MOD": (_floor_mod, "Remainder with the divisor's sign (Python ``%``)."),
    "ATAN2": (np.arctan2, "``atan2(a, b)``."),
    "BITWISE_XOR": (np.bitwise_xor, "Bitwise xor."),
    "RIGHT_SHIFT": (np.right_shift, "``a >> b`` (arithmetic for signed types)."),
}
#: comparisons and logical ops (bool output, inputs as they are)
_COMPARE = {
    "EQUAL": (lambda a, b: np.equal(np.asarray(a), np.asarray(b)), "``a == b``."),
    "NOT_EQUAL": (lambda a, b: np.not_equal(np.asarray(a), np.asarray(b)), "``a != b``."),
    "LESS": (lambda a, b: np.less(np.asarray(a), np.asarray(b)), "``a < b``."),
    "LESS_EQUAL": (lambda a, b: np.less_equal(np.asarray(a), np.asarray(b)), "``a <= b``."),
    "GREATER": (lambda a, b: np.greater(np.asarray(a), np.asarray(b)), "``a > b``."),
    "GREATER_EQUAL": (lambda a, b: np.greater_equal(np.asarray(a), np.asarray(b)), "``a >= b``."),
    "LOGICAL_AND": (np.logical_and, "Boolean and."),
    "LOGICAL_OR": (np.logical_or, "Boolean or."),
}
for _n, (_f, _d) in _BINARY.items():
    _register(_n, _f, _d, 2, _b)
for _n, (_f, _d) in _COMPARE.items():
    _register(_n, _f, _d, 2, _plain)


@register("tflite", "ADD_N")
def ADD_N(ctx, *xs):
    """Sum of all inputs."""
    reject_quantized(ctx)
    return to_out(ctx, sum(_f64(x) for x in xs))


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
