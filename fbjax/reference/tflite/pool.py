"""2-D pooling TFLite ops: AVERAGE_POOL_2D, MAX_POOL_2D (NHWC)."""

from __future__ import annotations

import numpy as np

from ..registry import register
from . import fused_activation, positive_int, require_float, to_out, window_geometry


def _geometry(ctx, x, padding, stride_w, stride_h, filter_width, filter_height):
    if x.ndim != 4:
        raise ctx.error(f"expected a 4-D NHWC input, got shape {x.shape}")
    sh, sw = positive_int(ctx, "stride_h", stride_h), positive_int(ctx, "stride_w", stride_w)
    kh, kw = positive_int(ctx, "filter_height", filter_height), positive_int(ctx, "filter_width", filter_width)
    oh, pt, _ = window_geometry(ctx, padding, x.shape[1], kh, sh)
    ow, pl, _ = window_geometry(ctx, padding, x.shape[2], kw, sw)
    return (kh, kw), (sh, sw), (oh, ow), (pt, pl)


def _pool(x, k, s, out, before, ufunc):
    """Combine every window of NHWC ``x`` with ``ufunc`` (``np.add`` or ``np.maximum``).

    Out-of-bounds taps read the ufunc's identity (0 for add, -inf for max), so
    they never contribute. Loops over whichever is fewer, the kernel taps or
    the output positions, so 3x3 pools and near-global pools are both quick.
    """
    (kh, kw), (sh, sw), (oh, ow), (pt, pl) = k, s, out, before
    n, h, w, c = x.shape
    fill = 0.0 if ufunc is np.add else -np.inf
    bottom = max((oh - 1) * sh + kh - pt - h, 0)
    right = max((ow - 1) * sw + kw - pl - w, 0)
    xp = np.pad(x.astype(np.float64), ((0, 0), (pt, bottom), (pl, right), (0, 0)), constant_values=fill)
    res = np.full((n, oh, ow, c), fill)
    if kh * kw <= oh * ow:
        for i in range(kh):
            for j in range(kw):
                ufunc(res, xp[:, i:i + (oh - 1) * sh + 1:sh, j:j + (ow - 1) * sw + 1:sw, :], out=res)
    else:
        for y in range(oh):
            for z in range(ow):
                res[:, y, z, :] = ufunc.reduce(xp[:, y * sh:y * sh + kh, z * sw:z * sw + kw, :], axis=(1, 2))
    return res


def _in_bounds_count(size, k, s, out, before):
    """Number of taps of each output position that fall inside ``[0, size)``."""
    starts = np.arange(out) * s - before
    return np.maximum(np.minimum(starts + k, size) - np.maximum(starts, 0), 0)


@register("tflite", "AVERAGE_POOL_2D")
def AVERAGE_POOL_2D(ctx, x, *, padding="SAME", stride_w=1, stride_h=1, filter_width=1,
                    filter_height=1, fused_activation_function="NONE"):
    """Average over each window (kernels/pooling.cc, reference_ops::AveragePool).

    The divisor is the number of in-bounds taps: padding is excluded.
    """
    require_float(ctx, x)
    k, s, out, before = _geometry(ctx, x, padding, stride_w, stride_h, filter_width, filter_height)
    total = _pool(x, k, s, out, before, np.add)
    count = np.outer(_in_bounds_count(x.shape[1], k[0], s[0], out[0], before[0]),
                     _in_bounds_count(x.shape[2], k[1], s[1], out[1], before[1]))
    with np.errstate(invalid="ignore", divide="ignore"):
        avg = total / count[None, :, :, None]
    return to_out(ctx, fused_activation(ctx, avg, fused_activation_function))


@register("tflite", "MAX_POOL_2D")
def MAX_POOL_2D(ctx, x, *, padding="SAME", stride_w=1, stride_h=1, filter_width=1,
                filter_height=1, fused_activation_function="NONE"):
    """Maximum over each window's in-bounds taps (kernels/pooling.cc,
    reference_ops::MaxPool)."""
    require_float(ctx, x)
    k, s, out, before = _geometry(ctx, x, padding, stride_w, stride_h, filter_width, filter_height)
    best = _pool(x, k, s, out, before, np.maximum)
    return to_out(ctx, fused_activation(ctx, best, fused_activation_function))
