"""TFLite neural-network ops, float path: batched matmul,
normalizations, L2 pooling, transposed and 3-D convolutions, nearest resize,
RFFT2D and REDUCE_WINDOW. Layouts stay native (NHWC / NDHWC activations,
OHWI / DHWIO / DHWOI weights) through ``dimension_numbers``.

Reference kernels: TFLite ``kernels/batch_matmul.cc``,
``l2norm.cc``, ``local_response_norm.cc``, ``pooling.cc`` (L2Pool),
``transpose_conv.cc``, ``conv3d.cc``, ``conv3d_transpose.cc``,
``resize_nearest_neighbor.cc``, ``rfft2d.cc``, ``reduce_window.cc``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import kernels
from ..registry import register
from .elementwise import apply_fused, require_unquantized


def _pads(ctx, padding, in_sizes, k, strides, dil=None):
    try:
        return kernels.explicit_padding(padding, in_sizes, k, strides, dil)
    except ValueError as e:
        raise ctx.error(str(e)) from None


@register("tflite", "BATCH_MATMUL", weights=((0, "MK"), (1, "KN")))
def BATCH_MATMUL(ctx, x, y, *, adj_x=False, adj_y=False, asymmetric_quantize_inputs=False):
    """TFLite BATCH_MATMUL: ``x @ y`` over the last two dims with numpy
    broadcasting of the batch dims; ``adj_x`` / ``adj_y`` transpose them first."""
    require_unquantized(ctx, "BATCH_MATMUL")
    x, y = jnp.asarray(x), jnp.asarray(y)
    if adj_x:
        x = jnp.swapaxes(x, -1, -2)
    if adj_y:
        y = jnp.swapaxes(y, -1, -2)
    return jnp.matmul(x, y, precision=kernels.precision(ctx), preferred_element_type=kernels.accumulation_dtype(x, y))


@register("tflite", "L2_NORMALIZATION", full_precision=True)
def L2_NORMALIZATION(ctx, x, *, fused_activation_function="NONE"):
    """TFLite L2_NORMALIZATION over the last axis:
    ``x / max(sqrt(sum(x^2)), 1e-6)``."""
    require_unquantized(ctx, "L2_NORMALIZATION")
    x = jnp.asarray(x)
    n = jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True))
    return apply_fused(ctx, x / jnp.maximum(n, jnp.asarray(1e-6, x.dtype)), fused_activation_function)


@register("tflite", "LOCAL_RESPONSE_NORMALIZATION", full_precision=True)
def LOCAL_RESPONSE_NORMALIZATION(ctx, x, *, radius=0, bias=0.0, alpha=0.0, beta=0.0):
    """TFLite LOCAL_RESPONSE_NORMALIZATION over the last (channel) axis:
    ``x / (bias + alpha * sum_{|d| <= radius} x[c + d]^2) ** beta``."""
    require_unquantized(ctx, "LOCAL_RESPONSE_NORMALIZATION")
    x = jnp.asarray(x)
    r = int(radius)
    sq = x * x
    window = (1,) * (x.ndim - 1) + (2 * r + 1,)
    s = lax.reduce_window(sq, jnp.zeros((), x.dtype), lax.add, window, (1,) * x.ndim,
                          [(0, 0)] * (x.ndim - 1) + [(r, r)])
    dt = x.dtype
    return x / jnp.power(jnp.asarray(bias, dt) + jnp.asarray(alpha, dt) * s, jnp.asarray(beta, dt))


@register("tflite", "L2_POOL_2D", full_precision=True)
def L2_POOL_2D(ctx, x, *, padding="SAME", stride_w=1, stride_h=1, filter_width=1, filter_height=1,
               fused_activation_function="NONE"):
    """TFLite L2_POOL_2D, NHWC: ``sqrt(mean of x^2)`` over each window, the
    mean dividing by the in-bounds tap count."""
    require_unquantized(ctx, "L2_POOL_2D")
    window, strides = (int(filter_height), int(filter_width)), (int(stride_h), int(stride_w))
    pads = _pads(ctx, padding, x.shape[1:3], window, strides)
    m = kernels.avg_pool(x * x, window=window, strides=strides, padding=pads, spatial_axes=(1, 2))
    return apply_fused(ctx, jnp.sqrt(m), fused_activation_function)


def _transpose_conv(ctx, output_shape, w, x, b, padding, strides, spec, act):
    require_unquantized(ctx)
    out = [int(v) for v in np.asarray(output_shape).reshape(-1)]
    nsp = len(strides)
    if len(out) != nsp + 2:
        raise ctx.error(f"output_shape {out} does not have rank {nsp + 2}")
    osp = out[1:1 + nsp]
    ks = [w.shape[spec[1].index(c)] for c in spec[0][1:1 + nsp]]
    pads = _pads(ctx, padding, osp, ks, strides)
    y = kernels.conv_transpose(x, w, strides=strides, padding=pads, output_sizes=osp,
                               dimension_numbers=spec, backend=getattr(ctx, "backend", None),
                               options=kernels.kernel_options(ctx))
    if b is not None:
        y = y + b
    return apply_fused(ctx, y, act)


@register("tflite", "TRANSPOSE_CONV", static_inputs=(0,), bias_scale=(1, 3, 2))  # (output_shape, w, x, b)
def TRANSPOSE_CONV(ctx, output_shape, weights, x, bias=None, *, padding="SAME", stride_w=1, stride_h=1,
                   fused_activation_function="NONE", quantized_bias_type=None):
    """TFLite TRANSPOSE_CONV: scatter-style transposed convolution of NHWC
    ``x`` with OHWI ``weights`` to the static ``output_shape``; the padding
    is the forward convolution's TF padding from the output back to ``x``;
    optional bias ``[O]`` and fused activation."""
    return _transpose_conv(ctx, output_shape, weights, x, bias, padding, (int(stride_h), int(stride_w)),
                           ("NHWC", "OHWI", "NHWC"), fused_activation_function)


@register("tflite", "CONV_3D_TRANSPOSE", static_inputs=(0,))
def CONV_3D_TRANSPOSE(ctx, output_shape, weights, x, bias=None, *, padding="SAME", stride_d=1, stride_w=1,
                      stride_h=1, fused_activation_function="NONE", dilation_d_factor=1,
                      dilation_w_factor=1, dilation_h_factor=1):
    """TFLite CONV_3D_TRANSPOSE: NDHWC ``x``, ``weights`` ``[D, H, W, O, I]``,
    static ``output_shape``; TF padding; optional bias; fused activation.
    Dilations other than 1 are refused."""
    if (int(dilation_d_factor), int(dilation_h_factor), int(dilation_w_factor)) != (1, 1, 1):
        raise ctx.error("dilated CONV_3D_TRANSPOSE is not supported")
    return _transpose_conv(ctx, output_shape, weights, x, bias, padding,
                           (int(stride_d), int(stride_h), int(stride_w)), ("NDHWC", "DHWOI", "NDHWC"),
                           fused_activation_function)


@register("tflite", "CONV_3D")
def CONV_3D(ctx, x, w, b=None, *, padding="SAME", stride_d=1, stride_w=1, stride_h=1,
            fused_activation_function="NONE", dilation_d_factor=1, dilation_w_factor=1, dilation_h_factor=1):
    """TFLite CONV_3D: NDHWC ``x`` with DHWIO ``w`` (TF's layout), TF
    SAME/VALID padding, strides, dilations, optional bias, fused activation."""
    require_unquantized(ctx, "CONV_3D")
    strides = (int(stride_d), int(stride_h), int(stride_w))
    dil = (int(dilation_d_factor), int(dilation_h_factor), int(dilation_w_factor))
    pads = _pads(ctx, padding, x.shape[1:4], w.shape[:3], strides, dil)
    y = kernels.conv(x, w, window_strides=strides, padding=pads, rhs_dilation=dil,
                     dimension_numbers=("NDHWC", "DHWIO", "NDHWC"), backend=ctx.backend,
                     options=kernels.kernel_options(ctx))
    if b is not None:
        y = y + b
    return apply_fused(ctx, y, fused_activation_function)


@register("tflite", "RESIZE_NEAREST_NEIGHBOR", static_inputs=(1,))
def RESIZE_NEAREST_NEIGHBOR(ctx, x, size, *, align_corners=False, half_pixel_centers=False):
    """TFLite RESIZE_NEAREST_NEIGHBOR, NHWC, static ``size``; source indices
    from :func:`fbjax.lower.kernels.nearest_resize_indices`."""
    hw = [int(v) for v in np.asarray(size).reshape(-1)]
    idx = [kernels.nearest_resize_indices(x.shape[ax], n, align_corners=bool(align_corners),
                                          half_pixel_centers=bool(half_pixel_centers))
           for ax, n in ((1, hw[0]), (2, hw[1]))]
    return kernels.resize_nearest(x, (1, 2), idx)


@register("tflite", "RFFT2D", static_inputs=(1,))
def RFFT2D(ctx, x, fft_length):
    """TFLite RFFT2D: 2-D real FFT of the last two dims, cropped / zero
    padded to ``fft_length``; complex64 ``[..., L0, L1 // 2 + 1]``."""
    n = tuple(int(v) for v in np.asarray(fft_length).reshape(-1))
    return jnp.fft.rfft2(jnp.asarray(x), s=n, axes=(-2, -1)).astype(ctx.out_dtype(0))


_RW = {"ADD": (lax.add, 0), "MUL": (lax.mul, 1), "MAXIMUM": (lax.max, None),
       "MINIMUM": (lax.min, None), "ALL": (lax.bitwise_and, True), "ANY": (lax.bitwise_or, False)}


def _taps_reduce(fn, x, window, strides, dilations):
    """``fn``-reduce (``lax.max`` / ``lax.min``) of ``x`` over VALID windows
    with strides and dilations, as a fold over the window's taps (one strided
    ``lax.slice`` of ``x`` per tap): reverse-differentiable, unlike a dilated
    max/min ``lax.reduce_window``. None when the output is empty."""
    out = [(n - (k - 1) * d - 1) // s + 1 for n, k, s, d in zip(x.shape, window, strides, dilations)]
    if any(o <= 0 for o in out):
        return None
    red = None
    for tap in np.ndindex(*window):
        start = [t * d for t, d in zip(tap, dilations)]
        limit = [b + (o - 1) * s + 1 for b, o, s in zip(start, out, strides)]
        sl = lax.slice(x, start, limit, strides)
        red = sl if red is None else fn(red, sl)
    return red


@register("tflite", "REDUCE_WINDOW", static_inputs=(1, 2, 3, 4))
def REDUCE_WINDOW(ctx, x, init_value, window_shape, window_strides, window_dilations, *,
                  reduce_function="UNSUPPORTED"):
    """TFLite REDUCE_WINDOW (from StableHLO ``reduce_window``, no padding):
    ``reduce_function`` over windows of ``window_shape`` with strides and
    dilations, starting from ``init_value``. All but the operand are static
    (the init value is a constant, not a trainable param: ``lax.reduce_window``
    has no derivative with respect to it)."""
    if reduce_function not in _RW:
        raise ctx.error(f"unsupported reduce_function {reduce_function!r}")
    fn = _RW[reduce_function][0]
    x = jnp.asarray(x)
    ints = lambda v: tuple(int(t) for t in np.asarray(v).reshape(-1))  # noqa: E731
    init = np.asarray(init_value).astype(x.dtype).reshape(())
    dims = (ints(window_shape), ints(window_strides), "VALID")
    if reduce_function in ("ADD", "MAXIMUM", "MINIMUM") and jnp.issubdtype(x.dtype, jnp.inexact):
        # Reduce from the operation's identity (a concrete constant, so JAX
        # picks its differentiable reduce_window_sum/max/min primitives) and
        # fold the file's init value in afterwards; the ops are associative.
        ident = {"ADD": 0, "MAXIMUM": -np.inf, "MINIMUM": np.inf}[reduce_function]
        if reduce_function != "ADD" and any(d > 1 for d in ints(window_dilations)):
            # JAX has no VJP for a dilated max/min reduce_window: take the
            # extreme over the window's taps, one strided slice each
            red = _taps_reduce(fn, x, *dims[:2], ints(window_dilations))
            if red is not None:
                return fn(red, jnp.asarray(init))
        red = lax.reduce_window(x, np.asarray(ident, x.dtype), fn, *dims,
                                window_dilation=ints(window_dilations))
        return fn(red, jnp.asarray(init))
    return lax.reduce_window(x, init, fn, *dims, window_dilation=ints(window_dilations))
