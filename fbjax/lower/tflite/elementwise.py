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


@register("tflite", "ADD")
def ADD(ctx, a, b, *, fused_activation_function="NONE"):
    """TFLite ADD (``kernels/add.cc``): broadcasting ``a + b``, then the fused activation."""
    return _binary(ctx, jnp.add, a, b, fused_activation_function)


@register("tflite", "SUB")
def SUB(ctx, a, b, *, fused_activation_function="NONE"):
    """TFLite SUB (``kernels/sub.cc``): broadcasting ``a - b``, then the fused activation."""
    return _binary(ctx, jnp.subtract, a, b, fused_activation_function)


@register("tflite", "MUL")
def MUL(ctx, a, b, *, fused_activation_function="NONE"):
    """TFLite MUL (``kernels/mul.cc``): broadcasting ``a * b``, then the fused activation."""
    return _binary(ctx, jnp.multiply, a, b, fused_activation_function)


def _div(a, b):
    a, b = jnp.asarray(a), jnp.asarray(b)
    if jnp.issubdtype(jnp.result_type(a, b), jnp.integer):
        a, b = jnp.broadcast_arrays(a, b)
        return lax.div(a, b)  # C division: truncates toward zero
    return kernels.ieee_divide(a, b)


@register("tflite", "DIV")
def DIV(ctx, a, b, *, fused_activation_function="NONE"):
    """TFLite DIV (``kernels/div.cc``): broadcasting ``a / b`` (int32: truncating),
    then the fused activation."""
    return _binary(ctx, _div, a, b, fused_activation_function)


# --- activations --------------------------------------------------------------

def _clamp(ctx, x, lo, hi):
    require_unquantized(ctx)
    x = jnp.asarray(x)
    if lo is not None:
        x = jnp.maximum(x, jnp.array(lo, x.dtype))
    if hi is not None:
        x = jnp.minimum(x, jnp.array(hi, x.dtype))
    return x


@register("tflite", "RELU")
def RELU(ctx, x):
    """TFLite RELU (``kernels/activations.cc``): ``max(x, 0)``, any shape."""
    return _clamp(ctx, x, 0, None)


@register("tflite", "RELU6")
def RELU6(ctx, x):
    """TFLite RELU6 (``kernels/activations.cc``): ``min(max(x, 0), 6)``."""
    return _clamp(ctx, x, 0, 6)


@register("tflite", "RELU_N1_TO_1")
def RELU_N1_TO_1(ctx, x):
    """TFLite RELU_N1_TO_1 (``kernels/activations.cc``): ``clip(x, -1, 1)``."""
    return _clamp(ctx, x, -1, 1)


@register("tflite", "RELU_0_TO_1")
def RELU_0_TO_1(ctx, x):
    """TFLite RELU_0_TO_1 (``kernels/activations.cc``): ``clip(x, 0, 1)``."""
    return _clamp(ctx, x, 0, 1)


@register("tflite", "TANH")
def TANH(ctx, x):
    """TFLite TANH (``kernels/activations.cc``), float: ``tanh(x)``."""
    require_unquantized(ctx, "TANH")
    return jnp.tanh(x)


@register("tflite", "LOGISTIC", squashing=True)
def LOGISTIC(ctx, x):
    """TFLite LOGISTIC (``kernels/activations.cc``), float: ``1 / (1 + exp(-x))``."""
    require_unquantized(ctx, "LOGISTIC")
    return jax.nn.sigmoid(x)


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
