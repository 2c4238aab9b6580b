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


def _register_unary(name: str, fn, doc: str, quantized_refused: bool = True):
    """Register TFLite ``name`` as ``fn(x)`` (quantized inputs refused unless
    ``quantized_refused`` is False: bool and any-dtype ops)."""
    if quantized_refused:
        def op(ctx, x):
            return _u(ctx, fn, x)
    else:
        def op(ctx, x):
            return fn(x)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"TFLite {name}: {doc}"
    register("tflite", name)(op)
    return op


def _rsqrt(x):
    """``1 / sqrt(x)`` with both operations correctly rounded, as LiteRT's float RSQRT kernel
    (``elementwise.cc``: ``1.f / std::sqrt(f)``). XLA rewrites ``1 / sqrt(x)`` into its ``rsqrt``,
    which on CPU differs in the last bit for about a third of float32 inputs (measured); the
    square root is made opaque to that rewrite by a select that never fires."""
    s = jnp.sqrt(x)
    return 1 / jnp.where(s != s, jnp.asarray(np.nan, s.dtype), s)


#: one-input ops: ``name: (fn, doc)``
_UNARY = {
    "ABS": (jnp.abs, "``|x|`` (float or int)."),
    "CEIL": (jnp.ceil, "``ceil(x)``, float."),
    "FLOOR": (jnp.floor, "``floor(x)``, float."),
    "ROUND": (jnp.round, "(``reference_ops::Round``): nearest, ties to even."),
    "COS": (jnp.cos, "``cos(x)``, float."),
    "SIN": (jnp.sin, "``sin(x)``, float."),
    "EXP": (jnp.exp, "``exp(x)``, float."),
    "LOG": (jnp.log, "natural log, float (``-inf`` at 0, NaN below)."),
    "SQRT": (jnp.sqrt, "``sqrt(x)``, float."),
    "RSQRT": (_rsqrt, "``1 / sqrt(x)``, float, each correctly rounded (LiteRT's kernel)."),
    "SQUARE": (jnp.square, "``x * x``."),
    "NEG": (jnp.negative, "``-x`` (float or int)."),
    "SIGN": (jnp.sign, "-1, 0 or 1 (float or int)."),
}
#: one-input ops on bool or any tensors (no quantized check)
_UNARY_ANY = {
    "LOGICAL_NOT": (jnp.logical_not, "logical not of a bool tensor."),
    "ZEROS_LIKE": (jnp.zeros_like, "zeros of ``x``'s shape and dtype."),
}
for _n, (_f, _d) in _UNARY.items():
    _register_unary(_n, _f, _d)
for _n, (_f, _d) in _UNARY_ANY.items():
    _register_unary(_n, _f, _d, quantized_refused=False)


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


def _floor_div(x, y):
    """FLOOR_DIV: integers round toward -inf. Floats: the floor of the exact
    quotient, as LiteRT's ``reference_ops::FloorDiv`` (``a / b`` divided in
    double, then floored; a double quotient of float32 operands never rounds
    across an integer). ``floor`` of a float32 quotient is 1 too large
    wherever the quotient rounds up to an integer (measured: 48 of 256
    elements of exact multiples). Finite operands take
    ``jnp.floor_divide``'s exact remainder (``fmod``) correction (a zero
    quotient takes the sign of ``a * b``, as ``floor(-0.0)``); infinities and
    NaN ``floor(a / b)``."""
    if jnp.issubdtype(x.dtype, jnp.integer):
        return jnp.floor_divide(x, y)
    finite = jnp.isfinite(x) & jnp.isfinite(y) & (y != 0)
    q = jnp.floor_divide(jnp.where(finite, x, jnp.zeros_like(x)), jnp.where(finite, y, jnp.ones_like(y)))
    q = jnp.where(q == 0, jnp.copysign(jnp.zeros_like(q), x * y), q)  # floor(-0.0) keeps its sign
    return jnp.where(finite, q, jnp.floor(x / y))


def _floor_mod(x, y):
    """FLOOR_MOD (``floor_mod.cc``): the C remainder (``fmod`` for floats),
    plus ``y`` when it is non-zero and its sign differs from ``y``'s."""
    x, y = jnp.broadcast_arrays(x, y)
    r = lax.rem(x, y)
    fix = (r != 0) & ((r < 0) != (y < 0))
    return jnp.where(fix, r + y, r)


def _register_binary(name: str, fn, doc: str, quantized_refused: bool = True):
    """Register TFLite ``name`` as ``fn(a, b)`` with numpy broadcasting
    (quantized inputs refused unless ``quantized_refused`` is False)."""
    if quantized_refused:
        def op(ctx, a, b):
            return _b(ctx, fn, a, b)
    else:
        def op(ctx, a, b):
            return fn(a, b)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"TFLite {name}, broadcasting: {doc}"
    register("tflite", name)(op)
    return op


#: two-input ops with numpy broadcasting: ``name: (fn, doc)``
_BINARY = {
    "MAXIMUM": (lambda x, y: jnp.where(x > y, x, y),
                "``a > b ? a : b`` per element (``kernels/maximum_minimum.cc`` ``MaximumOp``): a NaN in ``a`` "
                "gives ``b``, a NaN in ``b`` gives NaN; ``max(0.0, -0.0)`` is ``-0.0``."),
    "MINIMUM": (lambda x, y: jnp.where(x < y, x, y),
                "``a < b ? a : b`` per element (``MinimumOp``; NaN and signed zeros as MAXIMUM)."),
    "POW": (jnp.power, "``a ** b`` (float or int32)."),
    "SQUARED_DIFFERENCE": (lambda x, y: jnp.square(x - y), "``(a - b)^2``."),
    "FLOOR_DIV": (_floor_div, "``floor(a / b)`` (:func:`_floor_div`)."),
    "FLOOR_MOD": (_floor_mod, "remainder with the divisor's sign (:func:`_floor_mod`)."),
    "ATAN2": (jnp.arctan2, "``atan2(a, b)``, float."),
    "BITWISE_XOR": (jnp.bitwise_xor, "bitwise xor of integer tensors."),
    "RIGHT_SHIFT": (jnp.right_shift, "``a >> b``: arithmetic for signed, logical for unsigned ints."),
    "EQUAL": (jnp.equal, "``a == b``, bool output."),
    "NOT_EQUAL": (jnp.not_equal, "``a != b``, bool output."),
    "LESS": (jnp.less, "``a < b``, bool output."),
    "LESS_EQUAL": (jnp.less_equal, "``a <= b``, bool output."),
    "GREATER": (jnp.greater, "``a > b``, bool output."),
    "GREATER_EQUAL": (jnp.greater_equal, "``a >= b``, bool output."),
}
#: two-input ops on bool tensors (no quantized check)
_BINARY_BOOL = {
    "LOGICAL_AND": (jnp.logical_and, "logical and of bool tensors."),
    "LOGICAL_OR": (jnp.logical_or, "logical or of bool tensors."),
}
for _n, (_f, _d) in _BINARY.items():
    _register_binary(_n, _f, _d)
for _n, (_f, _d) in _BINARY_BOOL.items():
    _register_binary(_n, _f, _d, quantized_refused=False)


@register("tflite", "ADD_N")
def ADD_N(ctx, *xs):
    """TFLite ADD_N: element-wise sum of all (same-shape) inputs."""
    require_unquantized(ctx, "ADD_N")
    out = jnp.asarray(xs[0])
    for x in xs[1:]:
        out = out + x
    return out


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
