"""Float lowerings used only by quantized models, for TFLite builtins that
the float op set (``"tflite"``) does not lower yet: op set ``"tflite.qfloat"``.

:func:`fbjax.quantization.prepare` routes a float node here only when
``("tflite", op)`` has no lowering, so the float op set always wins once it
has the op. They serve ``quantized="float"`` (dequantized models) and the
float islands of integer models (NEG between DEQUANTIZE and QUANTIZE).
Plain float semantics of the TFLite kernels; no integer arithmetic here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import kernels
from ..registry import register

OP_SET = "tflite.qfloat"


def _fused(x, name):
    return kernels.clamp_to_activation_range(x, name or "NONE")


@register(OP_SET, "SOFTMAX")
def SOFTMAX(ctx, x, *, beta=1.0):
    """softmax(beta * x) over the last axis."""
    return jax.nn.softmax(x * jnp.asarray(beta, x.dtype), axis=-1)


@register(OP_SET, "NEG")
def NEG(ctx, x):
    """-x."""
    return -x


@register(OP_SET, "RSQRT")
def RSQRT(ctx, x):
    """1 / sqrt(x)."""
    return lax.rsqrt(x)


@register(OP_SET, "SQUARED_DIFFERENCE")
def SQUARED_DIFFERENCE(ctx, a, b):
    """(a - b)^2, broadcasting."""
    d = a - b
    return d * d


@register(OP_SET, "GELU")
def GELU(ctx, x, *, approximate=False):
    """GELU (erf form, or tanh approximation)."""
    return jax.nn.gelu(x, approximate=bool(approximate))


@register(OP_SET, "LEAKY_RELU")
def LEAKY_RELU(ctx, x, *, alpha=0.0):
    """x if x >= 0 else alpha * x."""
    return jnp.where(x >= 0, x, x * jnp.asarray(alpha, x.dtype))


@register(OP_SET, "TRANSPOSE", static_inputs=(1,))
def TRANSPOSE(ctx, x, perm):
    """Permute axes."""
    return jnp.transpose(x, [int(p) for p in np.asarray(perm).reshape(-1)])


@register(OP_SET, "BATCH_MATMUL")
def BATCH_MATMUL(ctx, a, b, *, adj_x=False, adj_y=False, asymmetric_quantize_inputs=False):
    """Batched a @ b with optional adjoints, broadcasting batch dims."""
    if adj_x:
        a = jnp.swapaxes(a, -1, -2)
    if adj_y:
        b = jnp.swapaxes(b, -1, -2)
    return jnp.matmul(a, b, precision=kernels.PRECISION)


@register(OP_SET, "GATHER")
def GATHER(ctx, params, indices, *, axis=0, batch_dims=0):
    """Take along ``axis`` (batch_dims 0)."""
    if int(batch_dims):
        raise ctx.error("batch_dims != 0 is not supported")
    return jnp.take(params, jnp.asarray(indices), axis=int(axis) % jnp.ndim(params), mode="clip")


@register(OP_SET, "SUM", static_inputs=(1,))
def SUM(ctx, x, axis, *, keep_dims=False):
    """Sum over axes."""
    return jnp.sum(x, axis=tuple(int(a) % x.ndim for a in np.asarray(axis).reshape(-1)), keepdims=bool(keep_dims))


@register(OP_SET, "PADV2", static_inputs=(1,))
def PADV2(ctx, x, paddings, constant_values=None):
    """Pad with a constant."""
    c = 0 if constant_values is None else jnp.asarray(constant_values).reshape(())
    p = np.asarray(paddings).reshape(-1, 2)
    return lax.pad(x, jnp.asarray(c, x.dtype), [(int(a), int(b), 0) for a, b in p])


@register(OP_SET, "RESIZE_NEAREST_NEIGHBOR", static_inputs=(1,))
def RESIZE_NEAREST_NEIGHBOR(ctx, x, size, *, align_corners=False, half_pixel_centers=False):
    """Nearest-neighbour resize, NHWC."""
    hw = [int(v) for v in np.asarray(size).reshape(-1)]
    idx = [kernels.nearest_resize_indices(x.shape[1 + i], hw[i], align_corners=bool(align_corners),
                                          half_pixel_centers=bool(half_pixel_centers)) for i in range(2)]
    return kernels.resize_nearest(x, (1, 2), idx)


@register(OP_SET, "TRANSPOSE_CONV", static_inputs=(0,))
def TRANSPOSE_CONV(ctx, output_shape, w, x, b=None, *, padding="SAME", stride_w=1, stride_h=1,
                   fused_activation_function="NONE"):
    """Transposed convolution, weights OHWI, padding from the output size."""
    oshape = [int(d) for d in np.asarray(output_shape).reshape(-1)]
    strides = (int(stride_h), int(stride_w))
    pads = []
    for ax in range(2):
        k, s, out, n = w.shape[1 + ax], strides[ax], oshape[1 + ax], x.shape[1 + ax]
        before = kernels.explicit_padding(padding, [out], [k], [s])[0][0]
        lo = k - 1 - before
        pads.append((lo, out - ((n - 1) * s + 1) - lo + k - 1))
    y = lax.conv_general_dilated(x, w[:, ::-1, ::-1, :], (1, 1), pads, lhs_dilation=strides,
                                 dimension_numbers=("NHWC", "OHWI", "NHWC"), precision=kernels.PRECISION)
    if b is not None:
        y = y + b
    return _fused(y, fused_activation_function)
