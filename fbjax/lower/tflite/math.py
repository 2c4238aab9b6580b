"""TFLite element-wise math, comparison, logical and bitwise ops, float path
(and plain integer / bool tensors where the kernel allows them).

Reference kernels: TFLite ``kernels/elementwise.cc`` (ABS, SIN, COS, LOG,
SQRT, RSQRT, SQUARE, SIGN...), ``floor.cc``, ``ceil.cc``, ``round.cc``,
``exp.cc``, ``neg.cc``, ``maximum_minimum.cc``, ``pow.cc``,
``floor_div.cc``, ``floor_mod.cc``, ``squared_difference.cc``,
``comparisons.cc``, ``logical.cc``, ``bitwise_xor.cc``, ``right_shift.cc``,
``atan2.cc``, ``add_n.cc``, ``cast.cc``, ``activations.cc`` (ELU,
LEAKY_RELU, GELU, SOFTMAX, LOG_SOFTMAX), ``complex_support.cc``.
Quantized integer inputs are refused (see :func:`.elementwise.require_unquantized`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import op_rules
from ..registry import register
from .elementwise import require_unquantized


def _u(ctx, fn, x):
    require_unquantized(ctx)
    return fn(jnp.asarray(x))


@register("tflite", "ABS")
def ABS(ctx, x):
    """TFLite ABS: ``|x|`` (float or int)."""
    return _u(ctx, jnp.abs, x)


@register("tflite", "CEIL")
def CEIL(ctx, x):
    """TFLite CEIL: ``ceil(x)``, float."""
    return _u(ctx, jnp.ceil, x)


@register("tflite", "FLOOR")
def FLOOR(ctx, x):
    """TFLite FLOOR: ``floor(x)``, float."""
    return _u(ctx, jnp.floor, x)


@register("tflite", "ROUND")
def ROUND(ctx, x):
    """TFLite ROUND (``reference_ops::Round``): nearest, ties to even."""
    return _u(ctx, jnp.round, x)


@register("tflite", "COS")
def COS(ctx, x):
    """TFLite COS: ``cos(x)``, float."""
    return _u(ctx, jnp.cos, x)


@register("tflite", "SIN")
def SIN(ctx, x):
    """TFLite SIN: ``sin(x)``, float."""
    return _u(ctx, jnp.sin, x)


@register("tflite", "EXP")
def EXP(ctx, x):
    """TFLite EXP: ``exp(x)``, float."""
    return _u(ctx, jnp.exp, x)


@register("tflite", "LOG")
def LOG(ctx, x):
    """TFLite LOG: natural log, float (``-inf`` at 0, NaN below)."""
    return _u(ctx, jnp.log, x)


@register("tflite", "SQRT")
def SQRT(ctx, x):
    """TFLite SQRT: ``sqrt(x)``, float."""
    return _u(ctx, jnp.sqrt, x)


@register("tflite", "RSQRT")
def RSQRT(ctx, x):
    """TFLite RSQRT: ``1 / sqrt(x)``, float."""
    return _u(ctx, lax.rsqrt, x)


@register("tflite", "SQUARE")
def SQUARE(ctx, x):
    """TFLite SQUARE: ``x * x``."""
    return _u(ctx, jnp.square, x)


@register("tflite", "NEG")
def NEG(ctx, x):
    """TFLite NEG: ``-x`` (float or int)."""
    return _u(ctx, jnp.negative, x)


@register("tflite", "SIGN")
def SIGN(ctx, x):
    """TFLite SIGN: -1, 0 or 1 (float or int)."""
    return _u(ctx, jnp.sign, x)


@register("tflite", "LOGICAL_NOT")
def LOGICAL_NOT(ctx, x):
    """TFLite LOGICAL_NOT on bool tensors."""
    return jnp.logical_not(x)


@register("tflite", "ZEROS_LIKE")
def ZEROS_LIKE(ctx, x):
    """TFLite ZEROS_LIKE: zeros of ``x``'s shape and dtype."""
    return jnp.zeros_like(x)


@register("tflite", "ELU")
def ELU(ctx, x):
    """TFLite ELU: ``x < 0 ? exp(x) - 1 : x``, float."""
    require_unquantized(ctx, "ELU")
    x = jnp.asarray(x)
    return jnp.where(x < 0, jnp.expm1(jnp.minimum(x, 0)), x)


@register("tflite", "LEAKY_RELU")
def LEAKY_RELU(ctx, x, *, alpha=0.0):
    """TFLite LEAKY_RELU: ``x > 0 ? x : alpha * x``, float."""
    require_unquantized(ctx, "LEAKY_RELU")
    x = jnp.asarray(x)
    return jnp.where(x > 0, x, x * jnp.asarray(alpha, x.dtype))


@register("tflite", "GELU")
def GELU(ctx, x, *, approximate=False):
    """TFLite GELU: ``x * Phi(x)`` with the erf form, or the tanh form when
    ``approximate``, float."""
    require_unquantized(ctx, "GELU")
    return jax.nn.gelu(jnp.asarray(x), approximate=bool(approximate))


@register("tflite", "SOFTMAX", reads_input_twice=True, batch=op_rules.axis_not_batch(), full_precision=True,
          squashing=True)
def SOFTMAX(ctx, x, *, beta=1.0):
    """TFLite SOFTMAX: ``softmax(beta * x)`` over the last axis, float."""
    require_unquantized(ctx, "SOFTMAX")
    x = jnp.asarray(x)
    return jax.nn.softmax(x * jnp.asarray(beta, x.dtype), axis=-1)


@register("tflite", "LOG_SOFTMAX", reads_input_twice=True, batch=op_rules.axis_not_batch(), full_precision=True)
def LOG_SOFTMAX(ctx, x):
    """TFLite LOG_SOFTMAX over the last axis, float."""
    require_unquantized(ctx, "LOG_SOFTMAX")
    return jax.nn.log_softmax(jnp.asarray(x), axis=-1)


@register("tflite", "CAST", int_passthrough=True)
def CAST(ctx, x, *, in_data_type=None, out_data_type=None):
    """TFLite CAST (``kernels/cast.cc``) to the output tensor's dtype:
    float -> integer truncates toward zero and saturates as LiteRT's
    ``SaturatingCastFloatingToInteger`` does (beyond the range: the type's
    minimum or maximum; NaN: its maximum), anything -> bool is ``x != 0``,
    complex -> real keeps the real part."""
    x = jnp.asarray(x)
    dt = np.dtype(ctx.out_dtype(0))
    if dt == np.bool_:
        return x != 0
    if jnp.iscomplexobj(x) and dt.kind != "c":
        x = jnp.real(x)
    if dt.kind in "iu" and jnp.issubdtype(x.dtype, jnp.floating):  # XLA's convert saturates; its NaN gives 0
        return jnp.where(jnp.isnan(x), jnp.array(np.iinfo(dt).max, dt), x.astype(dt))
    return x.astype(dt)


def _b(ctx, fn, a, b):
    require_unquantized(ctx)
    return fn(jnp.asarray(a), jnp.asarray(b))


@register("tflite", "MAXIMUM")
def MAXIMUM(ctx, a, b):
    """TFLite MAXIMUM, broadcasting: ``a > b ? a : b`` per element
    (``kernels/maximum_minimum.cc`` ``MaximumOp``): a NaN in ``a`` gives
    ``b``, a NaN in ``b`` gives NaN; ``max(0.0, -0.0)`` is ``-0.0``."""
    return _b(ctx, lambda x, y: jnp.where(x > y, x, y), a, b)


@register("tflite", "MINIMUM")
def MINIMUM(ctx, a, b):
    """TFLite MINIMUM, broadcasting: ``a < b ? a : b`` per element
    (``MinimumOp``; NaN and signed zeros as MAXIMUM)."""
    return _b(ctx, lambda x, y: jnp.where(x < y, x, y), a, b)


@register("tflite", "POW")
def POW(ctx, a, b):
    """TFLite POW, broadcasting ``a ** b`` (float or int32)."""
    return _b(ctx, jnp.power, a, b)


@register("tflite", "SQUARED_DIFFERENCE")
def SQUARED_DIFFERENCE(ctx, a, b):
    """TFLite SQUARED_DIFFERENCE: ``(a - b)^2``, broadcasting."""
    return _b(ctx, lambda x, y: jnp.square(x - y), a, b)


@register("tflite", "FLOOR_DIV")
def FLOOR_DIV(ctx, a, b):
    """TFLite FLOOR_DIV: ``floor(a / b)``; integers round toward -inf.

    Floats: the floor of the exact quotient, as LiteRT's
    ``reference_ops::FloorDiv`` (``a / b`` divided in double, then floored;
    a double quotient of float32 operands never rounds across an integer).
    ``floor`` of a float32 quotient is 1 too large wherever the quotient
    rounds up to an integer (measured: 48 of 256 elements of exact multiples).
    Finite operands take ``jnp.floor_divide``'s exact remainder (``fmod``)
    correction (a zero quotient takes the sign of ``a * b``, as
    ``floor(-0.0)``); infinities and NaN ``floor(a / b)``."""
    def f(x, y):
        if jnp.issubdtype(x.dtype, jnp.integer):
            return jnp.floor_divide(x, y)
        finite = jnp.isfinite(x) & jnp.isfinite(y) & (y != 0)
        q = jnp.floor_divide(jnp.where(finite, x, jnp.zeros_like(x)), jnp.where(finite, y, jnp.ones_like(y)))
        q = jnp.where(q == 0, jnp.copysign(jnp.zeros_like(q), x * y), q)  # floor(-0.0) keeps its sign
        return jnp.where(finite, q, jnp.floor(x / y))
    return _b(ctx, f, a, b)


@register("tflite", "FLOOR_MOD")
def FLOOR_MOD(ctx, a, b):
    """TFLite FLOOR_MOD (``floor_mod.cc``): the C remainder (``fmod`` for
    floats), plus ``b`` when it is non-zero and its sign differs from ``b``'s."""
    def f(x, y):
        x, y = jnp.broadcast_arrays(x, y)
        r = lax.rem(x, y)
        fix = (r != 0) & ((r < 0) != (y < 0))
        return jnp.where(fix, r + y, r)
    return _b(ctx, f, a, b)


@register("tflite", "ATAN2")
def ATAN2(ctx, a, b):
    """TFLite ATAN2: ``atan2(a, b)``, float, broadcasting."""
    return _b(ctx, jnp.arctan2, a, b)


@register("tflite", "BITWISE_XOR")
def BITWISE_XOR(ctx, a, b):
    """TFLite BITWISE_XOR on integer tensors, broadcasting."""
    return _b(ctx, jnp.bitwise_xor, a, b)


@register("tflite", "RIGHT_SHIFT")
def RIGHT_SHIFT(ctx, a, b):
    """TFLite RIGHT_SHIFT: arithmetic for signed, logical for unsigned ints."""
    return _b(ctx, jnp.right_shift, a, b)


@register("tflite", "ADD_N")
def ADD_N(ctx, *xs):
    """TFLite ADD_N: element-wise sum of all (same-shape) inputs."""
    require_unquantized(ctx, "ADD_N")
    out = jnp.asarray(xs[0])
    for x in xs[1:]:
        out = out + x
    return out




@register("tflite", "EQUAL")
def EQUAL(ctx, a, b):
    """TFLite EQUAL, broadcasting, bool output."""
    return _b(ctx, jnp.equal, a, b)


@register("tflite", "NOT_EQUAL")
def NOT_EQUAL(ctx, a, b):
    """TFLite NOT_EQUAL, broadcasting, bool output."""
    return _b(ctx, jnp.not_equal, a, b)


@register("tflite", "LESS")
def LESS(ctx, a, b):
    """TFLite LESS, broadcasting, bool output."""
    return _b(ctx, jnp.less, a, b)


@register("tflite", "LESS_EQUAL")
def LESS_EQUAL(ctx, a, b):
    """TFLite LESS_EQUAL, broadcasting, bool output."""
    return _b(ctx, jnp.less_equal, a, b)


@register("tflite", "GREATER")
def GREATER(ctx, a, b):
    """TFLite GREATER, broadcasting, bool output."""
    return _b(ctx, jnp.greater, a, b)


@register("tflite", "GREATER_EQUAL")
def GREATER_EQUAL(ctx, a, b):
    """TFLite GREATER_EQUAL, broadcasting, bool output."""
    return _b(ctx, jnp.greater_equal, a, b)


@register("tflite", "LOGICAL_AND")
def LOGICAL_AND(ctx, a, b):
    """TFLite LOGICAL_AND on bool tensors, broadcasting."""
    return jnp.logical_and(a, b)


@register("tflite", "LOGICAL_OR")
def LOGICAL_OR(ctx, a, b):
    """TFLite LOGICAL_OR on bool tensors, broadcasting."""
    return jnp.logical_or(a, b)


@register("tflite", "SELECT", int_passthrough=True)
def SELECT(ctx, c, a, b):
    """TFLite SELECT: ``c ? a : b``; a 1-D ``c`` of length ``a.shape[0]``
    selects whole rows (TF1 semantics), else shapes broadcast."""
    c, a, b = jnp.asarray(c), jnp.asarray(a), jnp.asarray(b)
    if c.ndim == 1 and a.ndim > 1:
        c = c.reshape(c.shape + (1,) * (a.ndim - 1))
    return jnp.where(c, a, b)


@register("tflite", "SELECT_V2", int_passthrough=True)
def SELECT_V2(ctx, c, a, b):
    """TFLite SELECT_V2: ``c ? a : b`` with numpy broadcasting of all three."""
    return jnp.where(c, a, b)


@register("tflite", "REAL")
def REAL(ctx, x):
    """TFLite REAL: real part of a complex tensor."""
    return jnp.real(x).astype(ctx.out_dtype(0))


@register("tflite", "IMAG")
def IMAG(ctx, x):
    """TFLite IMAG: imaginary part of a complex tensor."""
    return jnp.imag(x).astype(ctx.out_dtype(0))


@register("tflite", "COMPLEX_ABS")
def COMPLEX_ABS(ctx, x):
    """TFLite COMPLEX_ABS: modulus of a complex tensor."""
    return jnp.abs(x).astype(ctx.out_dtype(0))


@register("tflite", "BITCAST")
def BITCAST(ctx, x):
    """TFLite BITCAST: reinterpret the bytes as the output dtype; a wider
    output drops the last dim, a narrower one adds a dim (TF semantics)."""
    return lax.bitcast_convert_type(jnp.asarray(x), np.dtype(ctx.out_dtype(0)))


def fake_quant_nudge(min_v, max_v, num_bits, narrow_range):
    """TF's nudged ``(scale, min, max)`` for FAKE_QUANT, float32 arithmetic
    (``kernels/fake_quant.cc`` -> ``FakeQuantizeArray`` / ``Nudge``)."""
    f = np.float32
    qmin, qmax = f(1 if narrow_range else 0), f((1 << int(num_bits)) - 1)
    min_v, max_v = f(min_v), f(max_v)
    scale = f((max_v - min_v) / (qmax - qmin))
    zp_from_min = f(qmin - min_v / scale)
    if zp_from_min < qmin:
        zp = qmin
    elif zp_from_min > qmax:
        zp = qmax
    else:
        zp = f(np.floor(zp_from_min + f(0.5)) if zp_from_min >= 0 else -np.floor(-zp_from_min + f(0.5)))
    return scale, f((qmin - zp) * scale), f((qmax - zp) * scale)


@register("tflite", "FAKE_QUANT")
def FAKE_QUANT(ctx, x, *, min=0.0, max=0.0, num_bits=8, narrow_range=False):  # noqa: A002 - schema names
    """TFLite FAKE_QUANT: quantize-dequantize with TF's nudged range:
    ``floor((clip(x, nmin, nmax) - nmin) / scale + 0.5) * scale + nmin``."""
    require_unquantized(ctx, "FAKE_QUANT")
    scale, nmin, nmax = fake_quant_nudge(min, max, num_bits, narrow_range)
    x = jnp.asarray(x)
    dt = x.dtype
    c = jnp.clip(x, jnp.asarray(nmin, dt), jnp.asarray(nmax, dt)) - jnp.asarray(nmin, dt)
    return jnp.floor(c * jnp.asarray(np.float32(1) / scale, dt) + jnp.asarray(0.5, dt)) * jnp.asarray(scale, dt) \
        + jnp.asarray(nmin, dt)
