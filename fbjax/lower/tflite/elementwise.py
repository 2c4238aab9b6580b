"""TFLite element-wise ops: arithmetic with broadcasting and activations.

Float path (and plain integer tensors where the op allows them); quantized
integer inputs are refused with a :class:`~fbjax.errors.ModelFormatError`
naming the node. Reference kernels: TFLite ``kernels/add.cc``, ``sub.cc``,
``mul.cc``, ``div.cc``, ``activations.cc``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import kernels
from ..registry import register


def apply_fused(ctx, x, name, *, allowed=None):
    """Apply a TFLite ``fused_activation_function`` as LiteRT's float kernels do.

    They only clamp to ``CalculateActivationRange``: ``RELU``, ``RELU6``,
    ``RELU_N1_TO_1`` clamp, while ``TANH`` and ``SIGN_BIT`` leave the values
    unchanged (checked against LiteRT 2.3 for CONV_2D, DEPTHWISE_CONV_2D,
    ADD, SUB, MUL, DIV, MAX_POOL_2D). ``allowed`` lists the names an op
    accepts; others raise a ModelFormatError naming the node.
    """
    if allowed is not None and name not in allowed:
        raise ctx.error(f"fused activation {name} is not supported by this op (allowed: {', '.join(allowed)})")
    try:
        return kernels.clamp_to_activation_range(x, name)
    except ValueError as e:
        raise ctx.error(str(e)) from None


def require_unquantized(ctx, what: str = "", positions=None):
    """Refuse quantized integer inputs (this lowering has only the float path)."""
    bad = kernels.quantized_inputs(ctx, positions)
    if bad:
        v = ctx.inputs[bad[0]]
        raise ctx.error(
            f"quantized {np.dtype(v.dtype).name} input {bad[0]} ({v.name!r}) is not supported"
            f"{' by ' + what if what else ''}; only the float path is implemented"
        )


def _binary(ctx, fn, a, b, act):
    require_unquantized(ctx)
    return apply_fused(ctx, fn(a, b), act)


def _div(a, b):
    a, b = jnp.asarray(a), jnp.asarray(b)
    if jnp.issubdtype(jnp.result_type(a, b), jnp.integer):
        a, b = jnp.broadcast_arrays(a, b)
        return lax.div(a, b)  # C division: truncates toward zero
    return kernels.ieee_divide(a, b)


def _register_fused_binary(name: str, fn, doc: str):
    def op(ctx, a, b, *, fused_activation_function="NONE"):
        return _binary(ctx, fn, a, b, fused_activation_function)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"TFLite {name} {doc}, then the fused activation."
    register("tflite", name)(op)
    return op


#: two-input arithmetic with a ``fused_activation_function``: ``name: (fn, doc)``
_FUSED_BINARY = {
    "ADD": (jnp.add, "(``kernels/add.cc``): broadcasting ``a + b``"),
    "SUB": (jnp.subtract, "(``kernels/sub.cc``): broadcasting ``a - b``"),
    "MUL": (jnp.multiply, "(``kernels/mul.cc``): broadcasting ``a * b``"),
    "DIV": (_div, "(``kernels/div.cc``): broadcasting ``a / b`` (int32: truncating)"),
}
for _n, (_f, _d) in _FUSED_BINARY.items():
    _register_fused_binary(_n, _f, _d)


# --- activations --------------------------------------------------------------

def _clamp(ctx, x, lo, hi):
    require_unquantized(ctx)
    x = jnp.asarray(x)
    if lo is not None:
        x = jnp.maximum(x, jnp.array(lo, x.dtype))
    if hi is not None:
        x = jnp.minimum(x, jnp.array(hi, x.dtype))
    return x


def _register_clamp(name: str, lo, hi, doc: str):
    def op(ctx, x):
        return _clamp(ctx, x, lo, hi)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"TFLite {name} (``kernels/activations.cc``): {doc}"
    register("tflite", name)(op)
    return op


#: clamping activations: ``name: (low, high, doc)`` (None: unbounded)
_CLAMP = {
    "RELU": (0, None, "``max(x, 0)``, any shape."),
    "RELU6": (0, 6, "``min(max(x, 0), 6)``."),
    "RELU_N1_TO_1": (-1, 1, "``clip(x, -1, 1)``."),
    "RELU_0_TO_1": (0, 1, "``clip(x, 0, 1)``."),
}
for _n, (_lo, _hi, _d) in _CLAMP.items():
    _register_clamp(_n, _lo, _hi, _d)


def _register_float_unary(name: str, fn, doc: str, **facts):
    def op(ctx, x):
        require_unquantized(ctx, name)
        return fn(x)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"TFLite {name} (``kernels/activations.cc``), float: {doc}"
    register("tflite", name, **facts)(op)
    return op


#: float activations: ``name: (fn, doc, facts)``
_FLOAT_UNARY = {
    "TANH": (jnp.tanh, "``tanh(x)``.", {}),
    "LOGISTIC": (jax.nn.sigmoid, "``1 / (1 + exp(-x))``.", {"squashing": True}),
}
for _n, (_f, _d, _facts) in _FLOAT_UNARY.items():
    _register_float_unary(_n, _f, _d, **_facts)


@register("tflite", "HARD_SWISH")
def HARD_SWISH(ctx, x):
    """TFLite HARD_SWISH, float, in the builtin kernel's rounding order
    (``optimized_ops::HardSwish``, vectorized on x86 through NEON_2_SSE):
    ``(x * (1/6)) * min(6, max(0, x + 3))``, except the last ``size % 4``
    elements (scalar loop): ``(x * relu6(x + 3)) * (1/6)``. (``reference_ops``
    divides by 6; each order differs from the others by 1 ulp.) The tail is
    :func:`fbjax.lower.kernels.tail_mask` (also with a symbolic batch)."""
    require_unquantized(ctx, "HARD_SWISH")
    x = jnp.asarray(x)
    r6 = jnp.clip(x + jnp.array(3, x.dtype), jnp.array(0, x.dtype), jnp.array(6, x.dtype))
    sixth = jnp.array(np.float32(1.0) / np.float32(6.0), x.dtype)
    y = (x * sixth) * r6
    in_tail = kernels.tail_mask(x.shape, 4)
    return y if in_tail is None else jnp.where(in_tail, (x * r6) * sixth, y)


@register("tflite", "PRELU")
def PRELU(ctx, x, alpha):
    """TFLite PRELU (``kernels/activations.cc``): ``x >= 0 ? x : x * alpha`` with
    ``alpha`` broadcast against ``x`` (numpy rules, e.g. ``[1, 1, C]``)."""
    require_unquantized(ctx, "PRELU")
    x = jnp.asarray(x)
    return jnp.where(x >= 0, x, x * alpha)
