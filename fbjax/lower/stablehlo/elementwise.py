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


@register(OP_SET, "stablehlo.add")
def add(ctx, lhs, rhs):
    """``stablehlo.add``: element-wise ``lhs + rhs`` (integers wrap)."""
    return lax.add(lhs, rhs)


@register(OP_SET, "stablehlo.subtract")
def subtract(ctx, lhs, rhs):
    """``stablehlo.subtract``: element-wise ``lhs - rhs``."""
    return lax.sub(lhs, rhs)


@register(OP_SET, "stablehlo.multiply")
def multiply(ctx, lhs, rhs):
    """``stablehlo.multiply``: element-wise ``lhs * rhs``."""
    return lax.mul(lhs, rhs)


@register(OP_SET, "stablehlo.divide")
def divide(ctx, lhs, rhs):
    """``stablehlo.divide``: IEEE division for floats, rounded once per
    element (:func:`fbjax.lower.kernels.ieee_divide`), division truncating
    toward zero for integers (``lax.div``)."""
    if jnp.issubdtype(lhs.dtype, jnp.floating) or jnp.issubdtype(lhs.dtype, jnp.complexfloating):
        return kernels.ieee_divide(lhs, rhs)
    return lax.div(lhs, rhs)


@register(OP_SET, "stablehlo.maximum")
def maximum(ctx, lhs, rhs):
    """``stablehlo.maximum``: element-wise max, NaN-propagating for floats."""
    return lax.max(lhs, rhs)


@register(OP_SET, "stablehlo.minimum")
def minimum(ctx, lhs, rhs):
    """``stablehlo.minimum``: element-wise min, NaN-propagating for floats."""
    return lax.min(lhs, rhs)


@register(OP_SET, "stablehlo.abs")
def abs(ctx, operand):  # noqa: A001 - the spec's name
    """``stablehlo.abs``: ``|x|`` (signed integer minimum stays itself)."""
    return lax.abs(operand)


@register(OP_SET, "stablehlo.ceil")
def ceil(ctx, operand):
    """``stablehlo.ceil``: round toward +inf (floats)."""
    return lax.ceil(operand)


@register(OP_SET, "stablehlo.logistic")
def logistic(ctx, operand):
    """``stablehlo.logistic``: ``1 / (1 + exp(-x))`` (floats)."""
    return lax.logistic(operand)


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


@register(OP_SET, "stablehlo.and")
def and_(ctx, lhs, rhs):
    """``stablehlo.and``: bitwise AND of integers, logical AND of booleans."""
    return lax.bitwise_and(*_b(lhs, rhs))


@register(OP_SET, "stablehlo.or")
def or_(ctx, lhs, rhs):
    """``stablehlo.or``: bitwise / logical OR."""
    return lax.bitwise_or(*_b(lhs, rhs))


@register(OP_SET, "stablehlo.xor")
def xor(ctx, lhs, rhs):
    """``stablehlo.xor``: bitwise / logical XOR."""
    return lax.bitwise_xor(*_b(lhs, rhs))


@register(OP_SET, "stablehlo.not")
def not_(ctx, operand):
    """``stablehlo.not``: bitwise NOT of integers, logical NOT of booleans."""
    return lax.bitwise_not(operand)


@register(OP_SET, "stablehlo.shift_left")
def shift_left(ctx, lhs, rhs):
    """``stablehlo.shift_left``: ``lhs << rhs``; 0 when ``rhs`` is negative
    or at least the bit width (XLA's semantics, ``lax.shift_left``)."""
    return lax.shift_left(*_b(lhs, rhs))


@register(OP_SET, "stablehlo.shift_right_logical")
def shift_right_logical(ctx, lhs, rhs):
    """``stablehlo.shift_right_logical``: zero-filling right shift; 0 for
    out-of-range shift amounts."""
    return lax.shift_right_logical(*_b(lhs, rhs))


@register(OP_SET, "stablehlo.shift_right_arithmetic")
def shift_right_arithmetic(ctx, lhs, rhs):
    """``stablehlo.shift_right_arithmetic``: sign-filling right shift;
    out-of-range amounts give 0 or -1 by sign."""
    return lax.shift_right_arithmetic(*_b(lhs, rhs))


@register(OP_SET, "stablehlo.popcnt")
def popcnt(ctx, operand):
    """``stablehlo.popcnt``: number of set bits per integer element."""
    return lax.population_count(operand)


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


@register(OP_SET, "stablehlo.power")
def power(ctx, lhs, rhs):
    """``stablehlo.power``: ``lhs ** rhs``; floats follow ``pow`` (IEEE),
    integers exponentiate by squaring with wrap-around (negative exponents:
    see the spec's integer rules)."""
    lhs, rhs = _b(lhs, rhs)
    if _is_float(lhs):
        return lax.pow(lhs, rhs)
    return _int_power(lhs, rhs)


@register(OP_SET, "stablehlo.remainder")
def remainder(ctx, lhs, rhs):
    """``stablehlo.remainder``: ``lhs - rhs * trunc(lhs / rhs)`` (sign of the
    dividend, C ``fmod``)."""
    return lax.rem(*_b(lhs, rhs))


@register(OP_SET, "stablehlo.atan2")
def atan2(ctx, lhs, rhs):
    """``stablehlo.atan2``: ``atan2(lhs, rhs)``."""
    return lax.atan2(*_b(lhs, rhs))


def _unary(name, fn, doc):
    def op(ctx, operand):
        return fn(operand)

    op.__name__ = name
    op.__qualname__ = name
    op.__doc__ = doc
    register(OP_SET, f"stablehlo.{name}")(op)
    return op


exponential = _unary("exponential", lax.exp, "``stablehlo.exponential``: ``e ** x``.")
exponential_minus_one = _unary("exponential_minus_one", lax.expm1, "``stablehlo.exponential_minus_one``: ``e ** x - 1``.")
log = _unary("log", lax.log, "``stablehlo.log``: natural logarithm.")
log_plus_one = _unary("log_plus_one", lax.log1p, "``stablehlo.log_plus_one``: ``log(1 + x)``.")
sqrt = _unary("sqrt", lax.sqrt, "``stablehlo.sqrt``: square root.")
rsqrt = _unary("rsqrt", lax.rsqrt, "``stablehlo.rsqrt``: ``1 / sqrt(x)``.")
cbrt = _unary("cbrt", lax.cbrt, "``stablehlo.cbrt``: cube root (negative for negative x).")
tanh = _unary("tanh", lax.tanh, "``stablehlo.tanh``: hyperbolic tangent.")
cosine = _unary("cosine", lax.cos, "``stablehlo.cosine``: cosine.")
sine = _unary("sine", lax.sin, "``stablehlo.sine``: sine.")
tan = _unary("tan", lax.tan, "``stablehlo.tan``: tangent.")
negate = _unary("negate", lax.neg, "``stablehlo.negate``: ``-x`` (integers wrap).")
floor = _unary("floor", lax.floor, "``stablehlo.floor``: round toward -inf.")
sign = _unary("sign", lax.sign, "``stablehlo.sign``: -1, 0 or 1 (NaN stays NaN, -0.0 stays -0.0).")
round_nearest_afz = _unary("round_nearest_afz", lambda x: lax.round(x, lax.RoundingMethod.AWAY_FROM_ZERO),
                           "``stablehlo.round_nearest_afz``: round half away from zero.")
round_nearest_even = _unary("round_nearest_even", lambda x: lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN),
                            "``stablehlo.round_nearest_even``: round half to even.")
is_finite = _unary("is_finite", lax.is_finite, "``stablehlo.is_finite``: neither inf nor NaN.")


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
