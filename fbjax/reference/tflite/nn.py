"""Neural-network ops (numpy reference): batched matmul,
normalizations, L2 pooling, transposed / 3-D convolutions, nearest resize,
RFFT2D and REDUCE_WINDOW. Convolutions loop over kernel taps (strided views,
float64 accumulation), transposed convolutions scatter each input pixel.
"""

from __future__ import annotations

import itertools

import numpy as np

from . import fused_activation, reject_quantized, to_out, window_geometry
from ..registry import register


def _f64(x):
    return np.asarray(x).astype(np.float64)


@register("tflite", "BATCH_MATMUL")
def BATCH_MATMUL(ctx, x, y, *, adj_x=False, adj_y=False, asymmetric_quantize_inputs=False):
    """``x @ y`` with optional transposes of the last two dims."""
    reject_quantized(ctx)
    x, y = _f64(x), _f64(y)
    if adj_x:
        x = np.swapaxes(x, -1, -2)
    if adj_y:
        y = np.swapaxes(y, -1, -2)
    return to_out(ctx, np.matmul(x, y))


@register("tflite", "L2_NORMALIZATION")
def L2_NORMALIZATION(ctx, x, *, fused_activation_function="NONE"):
    """``x / max(||x||, 1e-6)`` over the last axis."""
    reject_quantized(ctx)
    x = _f64(x)
    n = np.sqrt((x * x).sum(-1, keepdims=True))
    return to_out(ctx, fused_activation(ctx, x / np.maximum(n, 1e-6), fused_activation_function))


@register("tflite", "LOCAL_RESPONSE_NORMALIZATION")
def LOCAL_RESPONSE_NORMALIZATION(ctx, x, *, radius=0, bias=0.0, alpha=0.0, beta=0.0):
    """Channel-window normalisation by an explicit loop over channels."""
    reject_quantized(ctx)
    x = _f64(x)
    c = x.shape[-1]
    r = int(radius)
    out = np.empty_like(x)
    for k in range(c):
        s = (x[..., max(0, k - r):min(c, k + r + 1)] ** 2).sum(-1)
        out[..., k] = x[..., k] / (float(bias) + float(alpha) * s) ** float(beta)
    return to_out(ctx, out)


@register("tflite", "L2_POOL_2D")
def L2_POOL_2D(ctx, x, *, padding="SAME", stride_w=1, stride_h=1, filter_width=1, filter_height=1,
               fused_activation_function="NONE"):
    """``sqrt(sum x^2 / in-bounds count)`` over each window."""
    reject_quantized(ctx)
    x = _f64(x)
    n, h, w, c = x.shape
    oh, pt, _ = window_geometry(ctx, padding, h, int(filter_height), int(stride_h))
    ow, pl, _ = window_geometry(ctx, padding, w, int(filter_width), int(stride_w))
    out = np.empty((n, oh, ow, c))
    for i in range(oh):
        for j in range(ow):
            y0, x0 = i * int(stride_h) - pt, j * int(stride_w) - pl
            win = x[:, max(y0, 0):max(y0 + int(filter_height), 0), max(x0, 0):max(x0 + int(filter_width), 0), :]
            out[:, i, j, :] = np.sqrt((win ** 2).sum((1, 2)) / (win.shape[1] * win.shape[2]))
    return to_out(ctx, fused_activation(ctx, out, fused_activation_function))


def _conv_nd(x, w_sio, strides, dil, pads):
    """x [N, *S, C], w [*K, C, O] -> [N, *OS, O] by looping over taps."""
    nsp = x.ndim - 2
    ks = w_sio.shape[:nsp]
    xp = np.pad(x, [(0, 0)] + [tuple(p) for p in pads] + [(0, 0)])
    osz = [(xp.shape[1 + d] - ((ks[d] - 1) * dil[d] + 1)) // strides[d] + 1 for d in range(nsp)]
    out = np.zeros((x.shape[0], *osz, w_sio.shape[-1]))
    for tap in itertools.product(*[range(k) for k in ks]):
        idx = (slice(None),) + tuple(
            slice(t * dil[d], t * dil[d] + (osz[d] - 1) * strides[d] + 1, strides[d]) for d, t in enumerate(tap))
        out += xp[idx] @ w_sio[tap]
    return out


@register("tflite", "CONV_3D")
def CONV_3D(ctx, x, w, b=None, *, padding="SAME", stride_d=1, stride_w=1, stride_h=1,
            fused_activation_function="NONE", dilation_d_factor=1, dilation_w_factor=1, dilation_h_factor=1):
    """NDHWC x DHWIO convolution with TF padding."""
    reject_quantized(ctx)
    x, w = _f64(x), _f64(w)
    st = (int(stride_d), int(stride_h), int(stride_w))
    dl = (int(dilation_d_factor), int(dilation_h_factor), int(dilation_w_factor))
    pads = [window_geometry(ctx, padding, x.shape[1 + d], w.shape[d], st[d], dl[d])[1:] for d in range(3)]
    y = _conv_nd(x, w, st, dl, pads)
    if b is not None:
        y = y + _f64(b)
    return to_out(ctx, fused_activation(ctx, y, fused_activation_function))


def _tconv(ctx, output_shape, w_sio, x, b, padding, strides, act):
    """Scatter: out[n, o*s + k - pad] += x[n, o] @ w[k]; w as [*K, I, O]."""
    out_shape = [int(v) for v in np.asarray(output_shape).reshape(-1)]
    nsp = len(strides)
    ks = w_sio.shape[:nsp]
    pads = [window_geometry(ctx, padding, out_shape[1 + d], ks[d], strides[d])[1] for d in range(nsp)]
    big = [(x.shape[1 + d] - 1) * strides[d] + ks[d] for d in range(nsp)]
    full = np.zeros([x.shape[0]] + [max(bg, pads[d] + out_shape[1 + d]) for d, bg in enumerate(big)]
                    + [w_sio.shape[-1]])
    for tap in itertools.product(*[range(k) for k in ks]):
        idx = (slice(None),) + tuple(
            slice(t, t + (x.shape[1 + d] - 1) * strides[d] + 1, strides[d]) for d, t in enumerate(tap))
        full[idx] += x @ w_sio[tap]
    y = full[(slice(None),) + tuple(slice(pads[d], pads[d] + out_shape[1 + d]) for d in range(nsp))]
    if b is not None:
        y = y + _f64(b)
    return to_out(ctx, fused_activation(ctx, y, act))


@register("tflite", "TRANSPOSE_CONV", static_inputs=(0,))
def TRANSPOSE_CONV(ctx, output_shape, weights, x, bias=None, *, padding="SAME", stride_w=1, stride_h=1,
                   fused_activation_function="NONE", quantized_bias_type=None):
    """Transposed convolution, OHWI weights, NHWC input."""
    reject_quantized(ctx)
    w = np.transpose(_f64(weights), (1, 2, 3, 0))  # -> [KH, KW, I, O]
    return _tconv(ctx, output_shape, w, _f64(x), bias, padding, (int(stride_h), int(stride_w)),
                  fused_activation_function)


@register("tflite", "CONV_3D_TRANSPOSE", static_inputs=(0,))
def CONV_3D_TRANSPOSE(ctx, output_shape, weights, x, bias=None, *, padding="SAME", stride_d=1, stride_w=1,
                      stride_h=1, fused_activation_function="NONE", dilation_d_factor=1,
                      dilation_w_factor=1, dilation_h_factor=1):
    """Transposed 3-D convolution, weights ``[D, H, W, O, I]``."""
    reject_quantized(ctx)
    w = np.swapaxes(_f64(weights), 3, 4)  # -> [D, H, W, I, O]
    return _tconv(ctx, output_shape, w, _f64(x), bias, padding,
                  (int(stride_d), int(stride_h), int(stride_w)), fused_activation_function)


def _nearest(in_size, out_size, align_corners, half_pixel):
    scale = (np.float32(in_size - 1) / np.float32(out_size - 1)) if align_corners and out_size > 1 \
        else np.float32(in_size) / np.float32(out_size)
    x = np.arange(out_size, dtype=np.float32)
    off = np.float32(0.5) if half_pixel else np.float32(0)
    src = (x + off) * scale
    src = np.round(src) if align_corners else np.floor(src)
    return np.minimum(src.astype(np.int64), in_size - 1)


@register("tflite", "RESIZE_NEAREST_NEIGHBOR", static_inputs=(1,))
def RESIZE_NEAREST_NEIGHBOR(ctx, x, size, *, align_corners=False, half_pixel_centers=False):
    """Nearest neighbour: ``src = min(floor((dst + 0.5*hp) * scale), in - 1)``
    (``round`` with align_corners), float32 index arithmetic."""
    h, w = (int(v) for v in np.asarray(size).reshape(-1))
    x = np.asarray(x)
    iy = _nearest(x.shape[1], h, align_corners, half_pixel_centers)
    ix = _nearest(x.shape[2], w, align_corners, half_pixel_centers)
    return x[:, iy][:, :, ix]


@register("tflite", "RFFT2D", static_inputs=(1,))
def RFFT2D(ctx, x, fft_length):
    """``numpy.fft.rfft2`` of the last two dims."""
    n = tuple(int(v) for v in np.asarray(fft_length).reshape(-1))
    return to_out(ctx, np.fft.rfft2(_f64(x), s=n, axes=(-2, -1)))


@register("tflite", "REDUCE_WINDOW", static_inputs=(1, 2, 3, 4))
def REDUCE_WINDOW(ctx, x, init_value, window_shape, window_strides, window_dilations, *,
                  reduce_function="UNSUPPORTED"):
    """Window reduction by an explicit loop over output positions."""
    fn = {"ADD": np.sum, "MUL": np.prod, "MAXIMUM": np.max, "MINIMUM": np.min, "ALL": np.all,
          "ANY": np.any}.get(reduce_function)
    if fn is None:
        raise ctx.error(f"unsupported reduce_function {reduce_function!r}")
    x = np.asarray(x)
    ints = lambda v: [int(t) for t in np.asarray(v).reshape(-1)]  # noqa: E731
    ws, st, dl = ints(window_shape), ints(window_strides), ints(window_dilations)
    osz = [(n - ((k - 1) * d + 1)) // s + 1 for n, k, s, d in zip(x.shape, ws, st, dl)]
    out = np.empty(osz, x.dtype)
    init = np.asarray(init_value).reshape(())
    for o in np.ndindex(*osz):
        win = x[tuple(slice(i * s, i * s + (k - 1) * d + 1, d) for i, s, k, d in zip(o, st, ws, dl))]
        red = fn(np.concatenate([win.reshape(-1), init.reshape(1)]))
        out[o] = red
    return out
