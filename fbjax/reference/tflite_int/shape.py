"""numpy twins of the quantized TFLite data-movement ops with value rules."""

from __future__ import annotations

import numpy as np

from ..registry import register
from .fixedpoint import sz

OP_SET = "tflite.int"


@register(OP_SET, "PAD")
def PAD(ctx, x, paddings):
    """Reference quantized PAD (fill = output zero point)."""
    _, z = sz(ctx, ctx.outputs[0])
    return np.pad(np.asarray(x), np.asarray(paddings).reshape(-1, 2), constant_values=z)


@register(OP_SET, "PADV2")
def PADV2(ctx, x, paddings, constant_values=None):
    """Reference quantized PADV2."""
    if constant_values is None:
        return PAD(ctx, x, paddings)
    return np.pad(np.asarray(x), np.asarray(paddings).reshape(-1, 2),
                  constant_values=np.asarray(constant_values).reshape(-1)[0])


def _nearest(n_in, n_out, align, half):
    scale = np.float32(n_in - 1) / np.float32(n_out - 1) if align and n_out > 1 else \
        np.float32(n_in) / np.float32(n_out)
    idx = []
    for o in range(n_out):
        v = np.float32(np.float32(o + (0.5 if half else 0.0)) * scale)
        i = int(np.floor(abs(v) + 0.5)) if align else int(np.floor(v))
        idx.append(min(max(i, 0), n_in - 1))
    return idx


@register(OP_SET, "RESIZE_NEAREST_NEIGHBOR")
def RESIZE_NEAREST_NEIGHBOR(ctx, x, size, *, align_corners=False, half_pixel_centers=False):
    """Reference quantized RESIZE_NEAREST_NEIGHBOR."""
    x = np.asarray(x)
    h, w = [int(v) for v in np.asarray(size).reshape(-1)]
    iy = _nearest(x.shape[1], h, align_corners, half_pixel_centers)
    ix = _nearest(x.shape[2], w, align_corners, half_pixel_centers)
    return x[:, iy][:, :, ix]


def _c10(n_in, n_out, align, half):
    if align and n_out > 1:
        sc = ((1 << 10) * (n_in - 1) + (n_out - 1) // 2) // (n_out - 1)
    else:
        sc = ((1 << 10) * n_in + n_out // 2) // n_out
    out = []
    for v in range(n_out):
        s = v * sc + sc // 2 - (1 << 9) if half else v * sc
        lo = max(int(s / 1024), 0)  # C division truncates toward zero
        hi = min(int((s + 1023) / 1024), n_in - 1)
        out.append((s, lo, hi))
    return out


@register(OP_SET, "RESIZE_BILINEAR")
def RESIZE_BILINEAR(ctx, x, size, *, align_corners=False, half_pixel_centers=False):
    """Reference quantized RESIZE_BILINEAR (``ResizeBilinearInteger``)."""
    x = np.asarray(x)
    xi = x.astype(np.int64)
    h, w = [int(v) for v in np.asarray(size).reshape(-1)]
    ys = _c10(x.shape[1], h, align_corners, half_pixel_centers)
    xs = _c10(x.shape[2], w, align_corners, half_pixel_centers)
    out = np.zeros((x.shape[0], h, w, x.shape[3]), np.int64)
    for oy, (sy, y0, y1) in enumerate(ys):
        dy = sy - 1024 * y0
        for ox, (sx, x0, x1) in enumerate(xs):
            dx = sx - 1024 * x0
            o = (xi[:, y0, x0] * (1024 - dy) * (1024 - dx) + xi[:, y1, x0] * dy * (1024 - dx)
                 + xi[:, y0, x1] * (1024 - dy) * dx + xi[:, y1, x1] * dy * dx)
            num = o + np.where(o > 0, 1 << 19, -(1 << 19))
            out[:, oy, ox] = np.sign(num) * (np.abs(num) >> 20)
    return out.astype(x.dtype)


@register(OP_SET, "GATHER")
def GATHER(ctx, params, indices, *, axis=0, batch_dims=0):
    """Reference quantized GATHER."""
    p = np.asarray(params)
    return np.take(p, np.asarray(indices), axis=int(axis) % p.ndim)
