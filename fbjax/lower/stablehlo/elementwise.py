"""Element-wise StableHLO ops: arithmetic, clamp, convert, batch_norm_inference.

Operands have equal shapes (StableHLO has no implicit broadcasting), except
``clamp``'s ``min``/``max`` which may be scalars. Spec:
https://openxla.org/stablehlo/spec
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import op_rules
from .. import kernels
from ._util import register

OP_SET = "stablehlo"


def _divide(lhs, rhs):
    """IEEE division for floats, rounded once per element
    (:func:`fbjax.lower.kernels.ieee_divide`), division truncating toward
    zero for integers (``lax.div``)."""
    if jnp.issubdtype(lhs.dtype, jnp.floating) or jnp.issubdtype(lhs.dtype, jnp.complexfloating):
        return kernels.ieee_divide(lhs, rhs)
    return lax.div(lhs, rhs)


def _binary(name: str, fn, doc: str):
    def op(ctx, lhs, rhs):
        return fn(lhs, rhs)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"``stablehlo.{name}``: {doc}"
    register(OP_SET, f"stablehlo.{name}")(op)
    return op


def _unary(name: str, fn, doc: str):
    def op(ctx, operand):
        return fn(operand)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"``stablehlo.{name}``: {doc}"
    register(OP_SET, f"stablehlo.{name}")(op)
    return op


@register(OP_SET, "stablehlo.clamp")
def clamp(ctx, min, operand, max):  # noqa: A002 - the spec's names
    """``stablehlo.clamp``: ``minimum(maximum(operand, min), max)``; ``min``
    and ``max`` are scalars or have the operand's shape."""
    x = jnp.asarray(operand)
    lo = jnp.asarray(min, x.dtype)
    hi = jnp.asarray(max, x.dtype)
    return lax.min(lax.max(x, jnp.broadcast_to(lo, x.shape)), jnp.broadcast_to(hi, x.shape))


@register(OP_SET, "stablehlo.convert")
def convert(ctx, operand):
    """``stablehlo.convert``: element type conversion to the output tensor's
    type (float -> int truncates toward zero)."""
    return lax.convert_element_type(operand, ctx.out_dtype(0))


def _batch_norm_inference_batch(node, carrying, batch) -> None:
    if int(node.attrs.get("feature_index", 0) or 0) == 0:
        raise op_rules.refusal(node, "normalises along the batch dimension (feature_index 0)")


@register(OP_SET, "stablehlo.batch_norm_inference", batch=_batch_norm_inference_batch)
def batch_norm_inference(ctx, operand, scale, offset, mean, variance, *, epsilon=0.0, feature_index=0):
    """``stablehlo.batch_norm_inference``:
    ``scale * (x - mean) / sqrt(variance + epsilon) + offset`` with the 1-D
    parameters broadcast along ``feature_index``."""
    x = jnp.asarray(operand)
    dt = x.dtype
    fi = int(feature_index)
    if not 0 <= fi < x.ndim:
        raise ctx.error(f"feature_index {fi} out of range for rank {x.ndim}")
    dims = (fi,)

    def b(v):
        return lax.broadcast_in_dim(jnp.asarray(v, dt), x.shape, dims)

    eps = np.asarray(epsilon, dt)
    return b(scale) * (x - b(mean)) / jnp.sqrt(b(variance) + eps) + b(offset)


# --- ops added with the TFLite STABLEHLO_* carrier ------------------------------------
# Binary ops broadcast operands of unequal shapes with numpy rules: StableHLO
# never does (its operands have equal shapes), but bodies applied element-wise
# to whole arrays (sort comparators, vectorized reductions) mix scalar
# constants with arrays.

def _b(lhs, rhs):
    lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
    if lhs.shape != rhs.shape:
        shape = jnp.broadcast_shapes(lhs.shape, rhs.shape)
        lhs, rhs = jnp.broadcast_to(lhs, shape), jnp.broadcast_to(rhs, shape)
    return lhs, rhs


def _is_float(x) -> bool:
    return bool(jnp.issubdtype(x.dtype, jnp.inexact))  # bfloat16 included


def _int_power(x, y):
    """Integer ``x ** y`` by squaring (64 steps at most); negative exponents
    give ``1 / x ** -y`` truncated: 1 for x = 1, +-1 for x = -1, else 0."""
    x, y = _b(x, y)
    dt = x.dtype
    neg = y < 0
    e = jnp.where(neg, jnp.zeros_like(y), y)
    acc = jnp.ones_like(x)
    base = x
    for _ in range(np.iinfo(dt).bits):
        acc = jnp.where((e & 1) == 1, acc * base, acc)
        base = base * base
        e = lax.shift_right_logical(e, jnp.ones_like(e))
    one = jnp.ones_like(x)
    if np.issubdtype(dt, np.signedinteger):
        negres = jnp.where(x == 1, one, jnp.where(x == -1, jnp.where((y & 1) == 1, -one, one), jnp.zeros_like(x)))
    else:
        negres = jnp.where(x == 1, one, jnp.zeros_like(x))
    return jnp.where(neg, negres, acc)


def _power(lhs, rhs):
    """``lhs ** rhs``; floats follow ``pow`` (IEEE), integers exponentiate by
    squaring with wrap-around (negative exponents: see the spec's integer
    rules)."""
    lhs, rhs = _b(lhs, rhs)
    if _is_float(lhs):
        return lax.pow(lhs, rhs)
    return _int_power(lhs, rhs)


def _broadcasting(fn):
    return lambda lhs, rhs: fn(*_b(lhs, rhs))


#: two-input ops: ``name: (fn, doc)``; those of the TFLite STABLEHLO_* carrier broadcast (see :func:`_b`)
_BINARY = {
    "add": (lax.add, "element-wise ``lhs + rhs`` (integers wrap)."),
    "subtract": (lax.sub, "element-wise ``lhs - rhs``."),
    "multiply": (lax.mul, "element-wise ``lhs * rhs``."),
    "divide": (_divide, "IEEE division for floats, truncating division for integers (:func:`_divide`)."),
    "maximum": (lax.max, "element-wise max, NaN-propagating for floats."),
    "minimum": (lax.min, "element-wise min, NaN-propagating for floats."),
    "and": (_broadcasting(lax.bitwise_and), "bitwise AND of integers, logical AND of booleans."),
    "or": (_broadcasting(lax.bitwise_or), "bitwise / logical OR."),
    "xor": (_broadcasting(lax.bitwise_xor), "bitwise / logical XOR."),
    "shift_left": (_broadcasting(lax.shift_left),
                   "``lhs << rhs``; 0 when ``rhs`` is negative or at least the bit width (XLA's semantics, "
                   "``lax.shift_left``)."),
    "shift_right_logical": (_broadcasting(lax.shift_right_logical),
                            "zero-filling right shift; 0 for out-of-range shift amounts."),
    "shift_right_arithmetic": (_broadcasting(lax.shift_right_arithmetic),
                               "sign-filling right shift; out-of-range amounts give 0 or -1 by sign."),
    "power": (_power, "``lhs ** rhs`` (:func:`_power`)."),
    "remainder": (_broadcasting(lax.rem), "``lhs - rhs * trunc(lhs / rhs)`` (sign of the dividend, C ``fmod``)."),
    "atan2": (_broadcasting(lax.atan2), "``atan2(lhs, rhs)``."),
}
#: one-input ops: ``name: (fn, doc)``
_UNARY = {
    "abs": (lax.abs, "``|x|`` (signed integer minimum stays itself)."),
    "ceil": (lax.ceil, "round toward +inf (floats)."),
    "floor": (lax.floor, "round toward -inf."),
    "logistic": (lax.logistic, "``1 / (1 + exp(-x))`` (floats)."),
    "not": (lax.bitwise_not, "bitwise NOT of integers, logical NOT of booleans."),
    "popcnt": (lax.population_count, "number of set bits per integer element."),
    "exponential": (lax.exp, "``e ** x``."),
    "exponential_minus_one": (lax.expm1, "``e ** x - 1``."),
    "log": (lax.log, "natural logarithm."),
    "log_plus_one": (lax.log1p, "``log(1 + x)``."),
    "sqrt": (lax.sqrt, "square root."),
    "rsqrt": (lax.rsqrt, "``1 / sqrt(x)``."),
    "cbrt": (lax.cbrt, "cube root (negative for negative x)."),
    "tanh": (lax.tanh, "hyperbolic tangent."),
    "cosine": (lax.cos, "cosine."),
    "sine": (lax.sin, "sine."),
    "tan": (lax.tan, "tangent."),
    "negate": (lax.neg, "``-x`` (integers wrap)."),
    "sign": (lax.sign, "-1, 0 or 1 (NaN stays NaN, -0.0 stays -0.0)."),
    "round_nearest_afz": (lambda x: lax.round(x, lax.RoundingMethod.AWAY_FROM_ZERO), "round half away from zero."),
    "round_nearest_even": (lambda x: lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN), "round half to even."),
    "is_finite": (lax.is_finite, "neither inf nor NaN."),
}
for _n, (_f, _d) in _BINARY.items():
    _binary(_n, _f, _d)
for _n, (_f, _d) in _UNARY.items():
    _unary(_n, _f, _d)


@register(OP_SET, "stablehlo.select")
def select(ctx, pred, on_true, on_false):
    """``stablehlo.select``: ``pred ? on_true : on_false`` element-wise; a
    scalar ``pred`` picks a whole operand."""
    t, f = _b(on_true, on_false)
    p = jnp.asarray(pred)
    if p.shape != t.shape:
        shape = jnp.broadcast_shapes(p.shape, t.shape)
        p, t, f = jnp.broadcast_to(p, shape), jnp.broadcast_to(t, shape), jnp.broadcast_to(f, shape)
    return lax.select(p, t, f)


def total_order_key(x):
    """Floats as signed integers whose order is the IEEE totalOrder
    (-NaN < -inf < ... < -0 < +0 < ... < inf < NaN)."""
    bits = {2: jnp.int16, 4: jnp.int32, 8: jnp.int64}[np.dtype(x.dtype).itemsize]
    i = lax.bitcast_convert_type(x, bits)
    mask = jnp.array(np.iinfo(np.dtype(bits)).max, bits)
    return jnp.where(i < 0, i ^ mask, i)


_CMP = {"EQ": lax.eq, "NE": lax.ne, "GE": lax.ge, "GT": lax.gt, "LE": lax.le, "LT": lax.lt}


@register(OP_SET, "stablehlo.compare")
def compare(ctx, lhs, rhs, *, comparison_direction="EQ", compare_type="NOTYPE"):
    """``stablehlo.compare``: element-wise ``lhs <direction> rhs`` -> bool.

    ``compare_type`` ``TOTALORDER`` compares floats by IEEE totalOrder (NaNs
    ordered, -0 < +0); ``FLOAT`` / ``NOTYPE`` use IEEE comparisons (NaN
    unordered), ``SIGNED`` / ``UNSIGNED`` the operands' own integer order.

    Raises:
        ModelFormatError: an unknown direction.
    """
    d = str(comparison_direction).upper()
    if d not in _CMP:
        raise ctx.error(f"unknown comparison_direction {comparison_direction!r}")
    lhs, rhs = _b(lhs, rhs)
    if str(compare_type).upper() == "TOTALORDER" and _is_float(lhs):
        lhs, rhs = total_order_key(lhs), total_order_key(rhs)
    return _CMP[d](lhs, rhs)
