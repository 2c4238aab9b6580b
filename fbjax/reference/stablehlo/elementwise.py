"""numpy twins of the element-wise StableHLO ops."""

from __future__ import annotations

import numpy as np

from ..registry import register

OP_SET = "stablehlo"


def _wrap(fn, a, b):
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return fn(np.asarray(a), np.asarray(b))


@register(OP_SET, "stablehlo.divide")
def divide(ctx, lhs, rhs):
    """IEEE division for floats; integer division truncating toward zero.
    Integer division by zero gives -1 (all bits set) and ``INT_MIN / -1``
    gives ``INT_MIN``: the spec leaves both implementation-defined, these
    are XLA's (``ElementalIrEmitter::EmitIntegerDivide``), which the lowering
    runs."""
    a, b = np.asarray(lhs), np.asarray(rhs)
    if np.issubdtype(a.dtype, np.integer):
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            q = np.abs(a.astype(np.int64)) // np.where(b == 0, 1, np.abs(b.astype(np.int64)))
            neg = (a < 0) != (b < 0)
            q = np.where(b == 0, -1, np.where(neg, -q, q))
            return np.asarray(q).astype(np.dtype(f"u{a.dtype.itemsize}")).view(a.dtype)
    return _wrap(np.divide, a, b)


@register(OP_SET, "stablehlo.clamp")
def clamp(ctx, min, operand, max):  # noqa: A002
    """``minimum(maximum(operand, min), max)``."""
    x = np.asarray(operand)
    return np.minimum(np.maximum(x, np.asarray(min, x.dtype)), np.asarray(max, x.dtype))


@register(OP_SET, "stablehlo.convert")
def convert(ctx, operand):
    """Conversion to the output tensor's type. Float -> integer truncates
    toward zero and saturates: values beyond the type's range give its
    minimum or maximum, NaN gives 0 (the spec leaves out-of-range values
    to be decided; this is what XLA, which the lowering runs, computes)."""
    x = np.asarray(operand)
    out = np.dtype(ctx.out_dtype(0))
    if x.dtype.kind == "f" and out.kind in "iu":
        info = np.iinfo(out)
        t = np.trunc(x.astype(np.float64))
        hi, lo = t >= float(info.max), t <= float(info.min)
        mid = ~(hi | lo | np.isnan(t))
        r = np.zeros(x.shape, out)
        r[hi], r[lo] = info.max, info.min
        r[mid] = t[mid].astype(out)
        return r
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(out)


@register(OP_SET, "stablehlo.batch_norm_inference")
def batch_norm_inference(ctx, operand, scale, offset, mean, variance, *, epsilon=0.0, feature_index=0):
    """``scale * (x - mean) / sqrt(variance + epsilon) + offset`` along
    ``feature_index`` (float64 arithmetic)."""
    x = np.asarray(operand)
    shape = [1] * x.ndim
    shape[int(feature_index)] = -1

    def b(v):
        return np.asarray(v, np.float64).reshape(shape)

    y = b(scale) * (x.astype(np.float64) - b(mean)) / np.sqrt(b(variance) + float(np.float32(epsilon))) + b(offset)
    return y.astype(x.dtype)


# --- ops added with the TFLite STABLEHLO_* carrier (numpy, from the spec) ------

def _bits(dt) -> int:
    return np.dtype(dt).itemsize * 8


def _shift(a, b, kind):
    a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
    n = _bits(a.dtype)
    udt = np.dtype(f"u{a.dtype.itemsize}")
    out = np.zeros(a.shape, a.dtype)
    for i in np.ndindex(*a.shape):
        s = int(b[i])
        v = int(a[i])
        if kind == "left":
            out[i] = np.array(((v << s) & ((1 << n) - 1)) if 0 <= s < n else 0).astype(udt).view(a.dtype)
        elif kind == "logical":
            out[i] = np.array((v & ((1 << n) - 1)) >> s if 0 <= s < n else 0).astype(udt).view(a.dtype)
        else:  # arithmetic: the bit pattern read as signed (unsigned types too), >> fills with its sign bit
            v &= (1 << n) - 1
            v = v - (1 << n) if v >> (n - 1) else v
            r = v >> s if 0 <= s < n else (-1 if v < 0 else 0)
            out[i] = np.array(r & ((1 << n) - 1)).astype(udt).view(a.dtype)
    return out


@register(OP_SET, "stablehlo.popcnt")
def popcnt(ctx, operand):
    """Number of set bits."""
    x = np.asarray(operand)
    n = _bits(x.dtype)
    return np.vectorize(lambda v: bin(int(v) & ((1 << n) - 1)).count("1"), otypes=[x.dtype])(x) if x.size \
        else x.copy()


@register(OP_SET, "stablehlo.power")
def power(ctx, lhs, rhs):
    """Floats: ``pow`` (float64 arithmetic); integers: exact power modulo
    2**bits, negative exponents 1 / x**-y truncated."""
    a, b = np.broadcast_arrays(np.asarray(lhs), np.asarray(rhs))
    if _inexact(a.dtype):
        with np.errstate(all="ignore"):
            return np.power(a.astype(_wide(a.dtype)), b.astype(_wide(a.dtype))).astype(a.dtype)
    n = _bits(a.dtype)
    udt = np.dtype(f"u{a.dtype.itemsize}")
    out = np.zeros(a.shape, a.dtype)
    for i in np.ndindex(*a.shape):
        x, y = int(a[i]), int(b[i])
        if y < 0:
            r = 1 if x == 1 else ((-1 if y % 2 else 1) if x == -1 else 0)
        else:
            r = pow(x, y, 1 << n)
        out[i] = np.array(r & ((1 << n) - 1)).astype(udt).view(a.dtype)
    return out


@register(OP_SET, "stablehlo.remainder")
def remainder(ctx, lhs, rhs):
    """``lhs - rhs * trunc(lhs / rhs)``: sign of the dividend (``fmod``);
    integer division by zero gives the dividend (XLA)."""
    a, b = np.asarray(lhs), np.asarray(rhs)
    with np.errstate(all="ignore"):
        if np.issubdtype(a.dtype, np.integer):
            return np.where(b == 0, a, np.fmod(a, np.where(b == 0, 1, b))).astype(a.dtype)
        return np.fmod(a, b)


def _inexact(dt) -> bool:
    """Floating or complex, ml_dtypes' bfloat16 included (numpy's
    issubdtype does not know it)."""
    dt = np.dtype(dt)
    return dt.kind in "fc" or dt.name == "bfloat16"


def _wide(dt):
    return np.complex128 if np.dtype(dt).kind == "c" else np.float64


def _f64(fn):
    def op(x):
        x = np.asarray(x)
        with np.errstate(all="ignore"):
            return fn(x.astype(_wide(x.dtype))).astype(x.dtype)
    return op


def _register(name: str, fn, doc: str, arity: int):
    """Register ``stablehlo.<name>`` as ``fn(operand)`` or ``fn(lhs, rhs)``."""
    if arity == 1:
        def op(ctx, operand):
            return fn(operand)
    else:
        def op(ctx, lhs, rhs):
            return fn(lhs, rhs)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = doc
    register(OP_SET, f"stablehlo.{name}")(op)
    return op


def _logistic(operand):
    x = np.asarray(operand)
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(x.dtype)


def _not(operand):
    x = np.asarray(operand)
    return np.logical_not(x) if x.dtype == np.bool_ else np.invert(x)


def _negate(operand):
    with np.errstate(over="ignore"):
        return np.negative(np.asarray(operand))


def _sign(x):
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.floating):
        return np.sign(x)
    return np.where(x == 0, x, np.sign(x)).astype(x.dtype)


def _round_afz(x):
    x = np.asarray(x)
    return (np.sign(x) * np.floor(np.abs(x) + np.asarray(0.5, x.dtype))).astype(x.dtype)


def _atan2(lhs, rhs):
    a = np.asarray(lhs)
    return np.arctan2(a.astype(np.float64), np.asarray(rhs).astype(np.float64)).astype(a.dtype)


def _asarrays(fn):
    return lambda lhs, rhs: fn(np.asarray(lhs), np.asarray(rhs))


#: two-input ops: ``name: (fn, doc)``
_BINARY = {
    "add": (lambda a, b: _wrap(np.add, a, b), "``lhs + rhs`` (integers wrap)."),
    "subtract": (lambda a, b: _wrap(np.subtract, a, b), "``lhs - rhs``."),
    "multiply": (lambda a, b: _wrap(np.multiply, a, b), "``lhs * rhs``."),
    "maximum": (np.maximum, "Element-wise max, NaN-propagating."),
    "minimum": (np.minimum, "Element-wise min, NaN-propagating."),
    "and": (_asarrays(np.bitwise_and), "Bitwise / logical AND."),
    "or": (_asarrays(np.bitwise_or), "Bitwise / logical OR."),
    "xor": (_asarrays(np.bitwise_xor), "Bitwise / logical XOR."),
    "shift_left": (lambda a, b: _shift(a, b, "left"), "``lhs << rhs`` modulo 2**bits; 0 for shifts outside "
                   "``[0, bits)``."),
    "shift_right_logical": (lambda a, b: _shift(a, b, "logical"),
                            "Zero-filling right shift; 0 for shifts outside ``[0, bits)``."),
    "shift_right_arithmetic": (lambda a, b: _shift(a, b, "arithmetic"),
                               "Sign-filling right shift of the bit pattern (the top bit fills, for unsigned types "
                               "too: the StableHLO interpreter's ``APInt::ashr``); all sign bits for shifts outside "
                               "``[0, bits)``."),
    "atan2": (_atan2, "``atan2(lhs, rhs)``."),
}
#: one-input ops: ``name: (fn, doc)``
_UNARY = {
    "abs": (np.abs, "``|x|``."),
    "ceil": (np.ceil, "Round toward +inf."),
    "logistic": (_logistic, "``1 / (1 + exp(-x))`` computed in float64."),
    "not": (_not, "Bitwise NOT (integers), logical NOT (booleans)."),
    "exponential": (_f64(np.exp), "``e ** x`` (float64 arithmetic)."),
    "exponential_minus_one": (_f64(np.expm1), "``e ** x - 1``."),
    "log": (_f64(np.log), "Natural logarithm."),
    "log_plus_one": (_f64(np.log1p), "``log(1 + x)``."),
    "sqrt": (_f64(np.sqrt), "Square root."),
    "rsqrt": (_f64(lambda x: 1.0 / np.sqrt(x)), "``1 / sqrt(x)``."),
    "cbrt": (_f64(np.cbrt), "Cube root."),
    "tanh": (_f64(np.tanh), "Hyperbolic tangent."),
    "cosine": (_f64(np.cos), "Cosine."),
    "sine": (_f64(np.sin), "Sine."),
    "tan": (_f64(np.tan), "Tangent."),
    "floor": (np.floor, "Round toward -inf."),
    "sign": (_sign, "-1, 0 or 1; NaN and signed zeros stay."),
    "round_nearest_afz": (_round_afz, "Round half away from zero."),
    "round_nearest_even": (np.rint, "Round half to even."),
    "is_finite": (np.isfinite, "Neither inf nor NaN."),
    "negate": (_negate, "``-x`` (integers wrap)."),
}
for _n, (_f, _d) in _BINARY.items():
    _register(_n, _f, _d, 2)
for _n, (_f, _d) in _UNARY.items():
    _register(_n, _f, _d, 1)


@register(OP_SET, "stablehlo.select")
def select(ctx, pred, on_true, on_false):
    """``pred ? on_true : on_false``; a scalar ``pred`` picks a whole operand."""
    return np.where(np.asarray(pred, bool), np.asarray(on_true), np.asarray(on_false))


def _total_key(x):
    x = np.asarray(x)
    it = np.dtype(f"i{x.dtype.itemsize}")
    i = x.view(it).astype(np.int64)
    return np.where(i < 0, i ^ np.int64(np.iinfo(it).max), i)


@register(OP_SET, "stablehlo.compare")
def compare(ctx, lhs, rhs, *, comparison_direction="EQ", compare_type="NOTYPE"):
    """``lhs <direction> rhs``; ``TOTALORDER`` orders floats by IEEE totalOrder."""
    a, b = np.asarray(lhs), np.asarray(rhs)
    if str(compare_type).upper() == "TOTALORDER" and _inexact(a.dtype) and a.dtype.kind != "c":
        a, b = _total_key(a), _total_key(np.asarray(b, a.dtype))
    fn = {"EQ": np.equal, "NE": np.not_equal, "GE": np.greater_equal, "GT": np.greater, "LE": np.less_equal,
          "LT": np.less}.get(str(comparison_direction).upper())
    if fn is None:
        raise ctx.error(f"unknown comparison_direction {comparison_direction!r}")
    with np.errstate(invalid="ignore"):
        return fn(a, b)
