"""numpy twins of ``stablehlo.convolution`` and ``stablehlo.resize_bilinear``."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..registry import register
from ._util import ints, out_shape, pad_dilate, pairs

OP_SET = "stablehlo"
_L = "abcdefghijklmnopqrstuvwxyz"


def _plain_conv(x: np.ndarray, w: np.ndarray, strides) -> np.ndarray:
    """x [B, C, S...], w [O, C, K...] (already dilated/padded) -> [B, O, P...]."""
    n = x.ndim - 2
    ks = w.shape[2:]
    if any(x.shape[2 + k] < ks[k] for k in range(n)):
        return np.zeros((x.shape[0], w.shape[0]) + tuple(
            max((x.shape[2 + k] - ks[k]) // strides[k] + 1, 0) for k in range(n)), x.dtype)
    win = sliding_window_view(x, ks, axis=tuple(range(2, 2 + n)))  # [B, C, P..., K...]
    win = win[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)]
    p, k = _L[:n], _L[n:2 * n]
    return np.einsum(f"yz{p}{k},oz{k}->yo{p}", win, w)


@register(OP_SET, "stablehlo.convolution")
def convolution(ctx, lhs, rhs, *, window_strides=None, padding=None, lhs_dilation=None, rhs_dilation=None,
                window_reversal=None, input_batch_dimension=0, input_feature_dimension=1,
                input_spatial_dimensions=(), kernel_input_feature_dimension=0,
                kernel_output_feature_dimension=1, kernel_spatial_dimensions=(), output_batch_dimension=0,
                output_feature_dimension=1, output_spatial_dimensions=(), feature_group_count=1,
                batch_group_count=1):
    """Spec steps: canonical layouts, window reversal, lhs dilation and
    padding with zeros, rhs dilation, per-group windowed dot products
    (float64 / int64 accumulation), result in the output layout."""
    isd, ksd, osd = ints(input_spatial_dimensions), ints(kernel_spatial_dimensions), ints(output_spatial_dimensions)
    n = len(isd)
    out_dt = ctx.out_dtype(0)
    acc = np.float64 if np.issubdtype(out_dt, np.floating) else np.int64
    x = np.transpose(np.asarray(lhs), (int(input_batch_dimension), int(input_feature_dimension)) + isd).astype(acc)
    w = np.transpose(np.asarray(rhs), (int(kernel_output_feature_dimension),
                                       int(kernel_input_feature_dimension)) + ksd).astype(acc)
    rev = [bool(b) for b in np.asarray(window_reversal if window_reversal is not None else [], bool).reshape(-1)]
    for k, r in enumerate(rev):
        if r:
            w = np.flip(w, axis=2 + k)
    ws = ints(window_strides) or (1,) * n
    ld = ints(lhs_dilation) or (1,) * n
    rd = ints(rhs_dilation) or (1,) * n
    x = pad_dilate(x, 0, [(0, 0), (0, 0)] + pairs(padding, n), [0, 0] + [d - 1 for d in ld])
    w = pad_dilate(w, 0, [(0, 0)] * (n + 2), [0, 0] + [d - 1 for d in rd])
    fg, bg = int(feature_group_count) or 1, int(batch_group_count) or 1
    B, C, O = x.shape[0], x.shape[1], w.shape[0]
    if bg > 1:
        bo, og = B // bg, O // bg
        parts = [_plain_conv(x[h * bo:(h + 1) * bo], w[h * og:(h + 1) * og], ws) for h in range(bg)]
    else:
        cg, og = C // fg, O // fg
        parts = [_plain_conv(x[:, g * cg:(g + 1) * cg], w[g * og:(g + 1) * og], ws) for g in range(fg)]
    y = np.concatenate(parts, axis=1)
    perm = (int(output_batch_dimension), int(output_feature_dimension)) + osd
    return np.transpose(y, np.argsort(perm)).astype(out_dt)


def _coords(in_size: int, out_size: int, align_corners: bool, half_pixel: bool):
    if align_corners and out_size > 1:
        scale = np.float32(in_size - 1) / np.float32(out_size - 1)
    else:
        scale = np.float32(in_size) / np.float32(out_size)
    x = np.arange(out_size, dtype=np.float32)
    src = ((x + np.float32(0.5)) * scale - np.float32(0.5)) if half_pixel else x * scale
    src = src.astype(np.float32)
    lo = np.maximum(np.floor(src), 0).astype(np.int64)
    hi = np.minimum(np.ceil(src), in_size - 1).astype(np.int64)
    return lo, hi, (src - lo).astype(np.float32)


@register(OP_SET, "stablehlo.resize_bilinear")
def resize_bilinear(ctx, images, size=None, *, align_corners=False, half_pixel_centers=False):
    """TensorFlow ResizeBilinear on NHWC: one output pixel at a time from its
    four source pixels (float32 weights, as TFLite's reference kernel)."""
    x = np.asarray(images)
    _, oh, ow, _ = out_shape(ctx)
    ylo, yhi, yf = _coords(x.shape[1], oh, bool(align_corners), bool(half_pixel_centers))
    xlo, xhi, xf = _coords(x.shape[2], ow, bool(align_corners), bool(half_pixel_centers))
    out = np.empty((x.shape[0], oh, ow, x.shape[3]), np.float64)
    xd = x.astype(np.float64)
    for i in range(oh):
        for j in range(ow):
            top = xd[:, ylo[i], xlo[j]] * (1 - xf[j]) + xd[:, ylo[i], xhi[j]] * xf[j]
            bot = xd[:, yhi[i], xlo[j]] * (1 - xf[j]) + xd[:, yhi[i], xhi[j]] * xf[j]
            out[:, i, j] = top * (1 - yf[i]) + bot * yf[i]
    return out.astype(ctx.out_dtype(0))
