"""Integer-exact TFLite pooling and reductions (op set ``"tflite.int"``).

AVERAGE_POOL_2D sums raw codes over in-bounds taps and divides by the tap
count rounding half away from zero (C division); MAX_POOL_2D takes the max
of raw codes; both clamp to the fused activation range (input and output
share their quantization). MEAN over H and W of a 4-D tensor with
``keep_dims`` follows ``optimized_integer_ops::Mean``; other MEANs follow the
integer ``QuantizedMeanOrSum`` and SUM its float path.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ...errors import InputError
from .. import kernels
from ..registry import register
from . import fixedpoint as fp
from . import rounding
from ._common import activation_range, as_i32, clamp_cast, lookup, out_dtype, qrange, scale_zp

OP_SET = "tflite.int"


def _geometry(ctx, x, padding, stride_w, stride_h, filter_width, filter_height):
    if x.ndim != 4:
        raise ctx.error(f"expected a 4-D NHWC input, got shape {tuple(x.shape)}")
    window = (int(filter_height), int(filter_width))
    strides = (int(stride_h), int(stride_w))
    if min(window + strides) < 1:
        raise ctx.error(f"window {window} and strides {strides} must be positive")
    try:
        pads = kernels.explicit_padding(padding, x.shape[1:3], window, strides)
    except ValueError as e:
        raise ctx.error(str(e)) from None
    return window, strides, pads


def _cdiv_round(acc, n):
    """``acc > 0 ? (acc + n/2) / n : (acc - n/2) / n`` with C truncation."""
    n = jnp.asarray(n, jnp.int32)
    half = n // 2
    num = jnp.where(acc > 0, acc + half, acc - half)
    q = jnp.abs(num) // n
    return jnp.where(num < 0, -q, q)


@register(OP_SET, "AVERAGE_POOL_2D", differentiable=False)
def AVERAGE_POOL_2D(ctx, x, *, padding="SAME", stride_w=1, stride_h=1, filter_width=1, filter_height=1,
                    fused_activation_function="NONE"):
    """Quantized AVERAGE_POOL_2D (``reference_integer_ops::AveragePool``)."""
    window, strides, pads = _geometry(ctx, x, padding, stride_w, stride_h, filter_width, filter_height)
    xi = as_i32(x)
    s = lax.reduce_window(xi, np.int32(0), lax.add, (1,) + window + (1,), (1,) + strides + (1,),
                          [(0, 0)] + [tuple(p) for p in pads] + [(0, 0)])
    count = np.ones((1, 1), np.int64)
    hs = kernels._valid_taps(x.shape[1], window[0], strides[0], 1, tuple(pads[0]))
    ws = kernels._valid_taps(x.shape[2], window[1], strides[1], 1, tuple(pads[1]))
    count = (hs[:, None] * ws[None, :]).astype(np.int32)[None, :, :, None]
    y = _cdiv_round(s, count)
    lo, hi = activation_range(ctx, fused_activation_function, ctx.outputs[0])
    return clamp_cast(y, lo, hi, out_dtype(ctx))


@register(OP_SET, "MAX_POOL_2D", differentiable=False)
def MAX_POOL_2D(ctx, x, *, padding="SAME", stride_w=1, stride_h=1, filter_width=1, filter_height=1,
                fused_activation_function="NONE"):
    """Quantized MAX_POOL_2D: max of raw codes (padding never wins), clamped."""
    window, strides, pads = _geometry(ctx, x, padding, stride_w, stride_h, filter_width, filter_height)
    y = kernels.max_pool(as_i32(x), window=window, strides=strides, padding=pads, spatial_axes=(1, 2))
    lo, hi = activation_range(ctx, fused_activation_function, ctx.outputs[0])
    return clamp_cast(y, lo, hi, out_dtype(ctx))


def _axes(ctx, x, axis):
    nd = jnp.asarray(x).ndim
    axes = sorted({int(a) + nd if int(a) < 0 else int(a) for a in np.asarray(axis).reshape(-1)})
    if any(not 0 <= a < nd for a in axes):
        raise ctx.error(f"axis {np.asarray(axis).tolist()} out of range for rank {nd}")
    return tuple(axes)


def _finish(ctx, y, x_shape, axes, keep_dims, clamped=False):
    if keep_dims:
        y = jnp.expand_dims(y, axes)
    lo, hi = qrange(ctx.outputs[0].dtype)
    if not clamped:
        y = clamp_cast(y, lo, hi, out_dtype(ctx))
    return y.reshape(
        tuple(d for d in ctx.outputs[0].shape) if ctx.outputs[0].static_shape else y.shape)


def _mean_or_sum(ctx, x, axis, keep_dims, compute_sum):
    vi, vo = ctx.inputs[0], ctx.outputs[0]
    si, zi = scale_zp(ctx, vi, "input")
    so, zo = scale_zp(ctx, vo, "output")
    axes = _axes(ctx, x, axis)
    n = int(np.prod([x.shape[a] for a in axes])) if axes else 1
    if n == 0:
        # LiteRT's integer MEAN/SUM of an empty set returns what its
        # uninitialised buffers hold (differs from run to run): no defined value
        raise InputError(f"{ctx.node.location} ({ctx.node.op_name}): the quantized input has shape "
                         f"{tuple(x.shape)}, and the reduction over its empty axes {list(axes)} has no defined "
                         "value in TFLite's integer kernels; call the model with non-empty sizes there")
    m, s = fp.quantize_multiplier(float(si) / float(so))
    xi = as_i32(x)
    if not compute_sum and x.ndim == 4 and axes == (1, 2) and keep_dims and np.dtype(vi.dtype).itemsize == 1:
        # optimized_integer_ops::Mean: raw sum, one float32-derived multiplier
        # s_in / (n * s_out), float32-rounded bias for the zero points. Its
        # 16-channel vector body rounds the final shift half up, the scalar
        # tail (the last C % 16 channels) half away from zero.
        f32 = np.float32
        t = f32(f32(f32(zi) * si) / so)
        t = f32(t + f32(0.5)) if t > 0 else f32(t - f32(0.5))
        bias = zo - int(t)
        m2, s2 = fp.quantize_multiplier(float(f32(si / f32(f32(n) * so))))
        acc = jnp.sum(xi, axis=axes)
        c = x.shape[3]
        body = c - c % 16
        y = fp.requantize(acc, m2, s2, ties_up=np.arange(c) < body if body < c else True, offset=bias,
                          clamp=qrange(vo.dtype), dtype=vo.dtype)
        return _finish(ctx, y, x.shape, axes, keep_dims, clamped=True)
    if compute_sum:
        # QuantizedMeanOrSum, sum branch: round(S * scale + bias) + zp_out in
        # float32, scale = s_in / s_out, bias = -zp_in * scale * n. S is an
        # integer in a known range: tabulate (numpy float32, two roundings)
        # so XLA cannot contract the multiply-add into an FMA.
        lo, hi = qrange(vi.dtype)
        smin, smax = lo * n, hi * n
        if smax - smin > (1 << 21):
            raise ctx.error(f"quantized SUM over {n} elements is too large for the exact table")
        scale = np.float32(si / so)
        bias = np.float32(np.float32(np.float32(-zi) * scale) * np.float32(n))
        vals = np.arange(smin, smax + 1).astype(np.float32)
        f = (vals * scale).astype(np.float32) + bias
        r = np.sign(f) * np.floor(np.abs(f.astype(np.float64)) + 0.5)
        olo, ohi = qrange(vo.dtype)
        table = np.clip(r + zo, olo, ohi).astype(np.int32)
        acc = jnp.sum(xi, axis=axes)
        return _finish(ctx, lookup(table, acc, smin), x.shape, axes, keep_dims)
    if not compute_sum:
        shift = n.bit_length() - 1
        shift = min(shift, 32, 31 + s)
        m = int((np.int64(m) << np.int64(shift)) // np.int64(n))
        s = s - shift
    acc = jnp.sum(xi, axis=axes) - zi * n
    y = fp.requantize(acc, m, s, offset=zo, clamp=qrange(vo.dtype), dtype=vo.dtype)
    return _finish(ctx, y, x.shape, axes, keep_dims, clamped=True)


@register(OP_SET, "MEAN", differentiable=False, static_inputs=(1,), fq_rounding=rounding.mean)
def MEAN(ctx, x, axis, *, keep_dims=False):
    """Quantized MEAN (8/16-bit, ``s_in/s_out`` rescaling)."""
    return _mean_or_sum(ctx, x, axis, keep_dims, False)


@register(OP_SET, "SUM", differentiable=False, static_inputs=(1,))
def SUM(ctx, x, axis, *, keep_dims=False):
    """Quantized SUM (``QuantizedMeanOrSum`` with ``compute_sum``)."""
    return _mean_or_sum(ctx, x, axis, keep_dims, True)
