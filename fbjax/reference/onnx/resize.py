"""numpy twins of :mod:`fbjax.lower.onnx.resize` (point-by-point, float64)."""

from __future__ import annotations

import itertools

import numpy as np

from ..registry import register
from ._util import OP_SET, out


def _src(mode, o, in_size, out_size, scale):
    if mode in ("HalfPixel", "PytorchHalfPixel"):
        if mode == "PytorchHalfPixel" and out_size == 1:
            return 0.0
        return (o + 0.5) / scale - 0.5
    if mode == "Asymmetric":
        return o / scale
    length = in_size * scale
    return 0.0 if out_size == 1 or length == 1 else o * (in_size - 1) / (length - 1)


def _near(mode, x):
    return {"Floor": np.floor(x), "Ceil": np.ceil(x), "RoundPreferFloor": np.ceil(x - 0.5),
            "RoundPreferCeil": np.floor(x + 0.5)}[mode]


@register(OP_SET, "Resize")
def Resize(ctx, X, roi=None, scales=None, sizes=None, *, mode="Nearest", coord_mode="HalfPixel",
           nearest_mode="Floor"):
    """numpy ONNX ``Resize`` (nearest / linear), separable, one axis at a time."""
    x = np.asarray(X, np.float64)
    r = x.ndim
    if sizes is not None and np.size(sizes):
        outs = [int(v) for v in np.asarray(sizes).reshape(-1)]
        outs = list(x.shape[:r - len(outs)]) + outs
        sc = [o / i for o, i in zip(outs, x.shape)]
    else:
        sc = [float(v) for v in np.asarray(scales, np.float32).reshape(-1)]
        sc = [1.0] * (r - len(sc)) + sc
        outs = [int(np.floor(i * np.float32(s))) for i, s in zip(x.shape, sc)]
    for a in range(r):
        n_in, n_out = x.shape[a], outs[a]
        if n_in == n_out and sc[a] == 1.0:
            continue
        cols = []
        for o in range(n_out):
            c = _src(coord_mode, o, n_in, n_out, float(sc[a]))  # float64 coordinates, as the ONNX reference
            if mode == "Nearest":
                i = int(np.clip(_near(nearest_mode, c), 0, n_in - 1))
                cols.append(np.take(x, i, axis=a))
            else:
                c = min(max(c, 0.0), n_in - 1)
                lo = int(np.floor(c))
                hi = min(lo + 1, n_in - 1)
                f = c - lo
                cols.append(np.take(x, lo, axis=a) * (1 - f) + np.take(x, hi, axis=a) * f)
        x = np.stack(cols, axis=a)
    return out(ctx, x)


@register(OP_SET, "GridSample")
def GridSample(ctx, X, grid, *, align_corners=False):
    """numpy ONNX ``GridSample`` (bilinear, zeros padding)."""
    x = np.asarray(X, np.float64)
    g = np.asarray(grid, np.float64)
    n, c, h, w = x.shape
    y = np.zeros((n, c) + g.shape[1:3])
    for b, i, j in itertools.product(range(n), range(g.shape[1]), range(g.shape[2])):
        gx, gy = g[b, i, j]
        fx = (gx + 1) / 2 * (w - 1) if align_corners else ((gx + 1) * w - 1) / 2
        fy = (gy + 1) / 2 * (h - 1) if align_corners else ((gy + 1) * h - 1) / 2
        x0, y0 = int(np.floor(fx)), int(np.floor(fy))
        for yy, xx, wt in ((y0, x0, (1 - (fx - x0)) * (1 - (fy - y0))), (y0, x0 + 1, (fx - x0) * (1 - (fy - y0))),
                           (y0 + 1, x0, (1 - (fx - x0)) * (fy - y0)), (y0 + 1, x0 + 1, (fx - x0) * (fy - y0))):
            if 0 <= yy < h and 0 <= xx < w:
                y[b, :, i, j] += wt * x[b, :, yy, xx]
    return out(ctx, y)
