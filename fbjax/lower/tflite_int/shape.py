"""Integer TFLite data-movement ops that depend on quantization parameters
(op set ``"tflite.int"``): PAD/PADV2 fill with the zero point or the
quantized constant, RESIZE_BILINEAR in 10-bit fixed point
(``ResizeBilinearInteger``), RESIZE_NEAREST_NEIGHBOR as a gather.
Pure reshuffles (RESHAPE, TRANSPOSE, GATHER, STRIDED_SLICE, ...) stay in the
``"tflite"`` op set: they never look at the values.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import kernels
from ..registry import register
from ._common import out_dtype, require_x64, scale_zp

OP_SET = "tflite.int"


def _pad(ctx, x, paddings, value):
    p = np.asarray(paddings).reshape(-1, 2)
    if p.shape[0] != x.ndim or (p < 0).any():
        raise ctx.error(f"paddings {p.tolist()} do not fit rank {x.ndim}")
    return lax.pad(jnp.asarray(x), jnp.asarray(value, x.dtype), [(int(a), int(b), 0) for a, b in p])


@register(OP_SET, "PAD", differentiable=False, static_inputs=(1,))
def PAD(ctx, x, paddings):
    """Quantized PAD: pads with the output zero point."""
    _, z = scale_zp(ctx, ctx.outputs[0], "output")
    return _pad(ctx, x, paddings, z)


@register(OP_SET, "PADV2", differentiable=False, static_inputs=(1, 2))
def PADV2(ctx, x, paddings, constant_values=None):
    """Quantized PADV2: pads with the (quantized) constant, else the zero point."""
    if constant_values is None:
        _, z = scale_zp(ctx, ctx.outputs[0], "output")
        return _pad(ctx, x, paddings, z)
    c = np.asarray(constant_values).reshape(-1)
    if c.size != 1:
        raise ctx.error(f"constant_values must be a scalar, got {c.size} values")
    if c.dtype != np.dtype(x.dtype):
        raise ctx.error(f"constant_values dtype {c.dtype.name} differs from the input's {np.dtype(x.dtype).name}")
    return _pad(ctx, x, paddings, c[0])


@register(OP_SET, "RESIZE_NEAREST_NEIGHBOR", differentiable=False, static_inputs=(1,))
def RESIZE_NEAREST_NEIGHBOR(ctx, x, size, *, align_corners=False, half_pixel_centers=False):
    """Quantized RESIZE_NEAREST_NEIGHBOR: gather of raw codes (same rule as float)."""
    hw = [int(v) for v in np.asarray(size).reshape(-1)]
    if x.ndim != 4 or len(hw) != 2:
        raise ctx.error(f"expected NHWC input and [h, w] size, got {tuple(x.shape)}, {hw}")
    idx = [kernels.nearest_resize_indices(x.shape[1 + i], hw[i], align_corners=bool(align_corners),
                                          half_pixel_centers=bool(half_pixel_centers)) for i in range(2)]
    return kernels.resize_nearest(jnp.asarray(x), (1, 2), idx).astype(out_dtype(ctx))


def _coords10(in_size, out_size, align_corners, half_pixel):
    if align_corners and out_size > 1:
        scale10 = ((1 << 10) * (in_size - 1) + (out_size - 1) // 2) // (out_size - 1)
    else:
        scale10 = ((1 << 10) * in_size + out_size // 2) // out_size
    v = np.arange(out_size, dtype=np.int64)
    if half_pixel:
        sv = v * scale10 + scale10 // 2 - (1 << 9)
    else:
        sv = v * scale10
    lo = np.maximum(np.where(sv >= 0, sv // 1024, -((-sv) // 1024)), 0)
    up = np.minimum(np.where(sv + 1023 >= 0, (sv + 1023) // 1024, -((-(sv + 1023)) // 1024)), in_size - 1)
    return sv, lo.astype(np.int32), up.astype(np.int32)


@register(OP_SET, "RESIZE_BILINEAR", differentiable=False, static_inputs=(1,))
def RESIZE_BILINEAR(ctx, x, size, *, align_corners=False, half_pixel_centers=False):
    """Quantized RESIZE_BILINEAR (``ResizeBilinearInteger``): 10-bit fixed
    point source coordinates, products summed with weights ``2^20`` and
    rounded half away from zero (int64 for int16 inputs)."""
    hw = [int(v) for v in np.asarray(size).reshape(-1)]
    if x.ndim != 4 or len(hw) != 2:
        raise ctx.error(f"expected NHWC input and [h, w] size, got {tuple(x.shape)}, {hw}")
    wide = np.dtype(x.dtype).itemsize > 1
    if wide:
        require_x64(ctx, "RESIZE_BILINEAR")
    acc_t = jnp.int64 if wide else jnp.int32
    ys, y0, y1 = _coords10(x.shape[1], hw[0], align_corners, half_pixel_centers)
    xs, x0, x1 = _coords10(x.shape[2], hw[1], align_corners, half_pixel_centers)
    wy1 = (ys - 1024 * y0.astype(np.int64)).reshape(1, -1, 1, 1)
    wy0 = 1024 - wy1
    wx1 = (xs - 1024 * x0.astype(np.int64)).reshape(1, 1, -1, 1)
    wx0 = 1024 - wx1
    xi = jnp.asarray(x).astype(acc_t)
    r0 = jnp.take(xi, y0, axis=1)
    r1 = jnp.take(xi, y1, axis=1)
    ll = jnp.take(r0, x0, axis=2) * (wy0 * wx0).astype(acc_t)
    lu = jnp.take(r1, x0, axis=2) * (wy1 * wx0).astype(acc_t)
    rl = jnp.take(r0, x1, axis=2) * (wy0 * wx1).astype(acc_t)
    ru = jnp.take(r1, x1, axis=2) * (wy1 * wx1).astype(acc_t)
    o = ll + lu + rl + ru
    rnd = jnp.where(o > 0, acc_t(1 << 19), acc_t(-(1 << 19)))
    num = o + rnd
    q = jnp.abs(num) >> 20
    q = jnp.where(num < 0, -q, q)
    return q.astype(out_dtype(ctx))


@register(OP_SET, "GATHER", differentiable=False)
def GATHER(ctx, params, indices, *, axis=0, batch_dims=0):
    """Quantized GATHER: ``params`` codes taken along ``axis`` (values untouched;
    input and output share quantization). ``batch_dims`` must be 0."""
    if int(batch_dims) != 0:
        raise ctx.error("GATHER with batch_dims != 0 is not supported on quantized tensors")
    p = jnp.asarray(params)
    ax = int(axis) + p.ndim if int(axis) < 0 else int(axis)
    if not 0 <= ax < p.ndim:
        raise ctx.error(f"axis {axis} out of range for rank {p.ndim}")
    return jnp.take(p, jnp.asarray(indices).astype(jnp.int32), axis=ax, mode="clip").astype(out_dtype(ctx))
