"""MediaPipe custom ops (numpy reference): the geometry ops at the end; the pooling ops with XNNPACK conventions:
raw TfLitePoolParams options; argmax = uint32 window-relative index (column-major)
stored in a float32 tensor's bits. Explicit loops over output pixels."""

from __future__ import annotations

import struct

import numpy as np

from ..registry import register
from . import window_geometry


def _params(ctx, raw):
    pad, sw, sh, fw, fh = struct.unpack("<5i", bytes(raw)[:20])
    return ("SAME" if pad == 1 else "VALID"), sh, sw, fh, fw


@register("tflite.custom", "MaxPoolingWithArgmax2D")
def MaxPoolingWithArgmax2D(ctx, x, *, custom_options=b""):
    """Per output pixel: max over in-bounds taps, first index of the max."""
    padding, sh, sw, fh, fw = _params(ctx, custom_options)
    x = np.asarray(x, np.float32)
    n, h, w, c = x.shape
    oh, pt, _ = window_geometry(ctx, padding, h, fh, sh)
    ow, pl, _ = window_geometry(ctx, padding, w, fw, sw)
    vals = np.zeros((n, oh, ow, c), np.float32)
    idx = np.zeros((n, oh, ow, c), np.uint32)
    for b in range(n):
        for i in range(oh):
            for j in range(ow):
                for ch in range(c):
                    best, bi = -np.inf, 0
                    for dx in range(fw):  # column-major window order, as XNNPACK
                        for dy in range(fh):
                            y, xx = i * sh + dy - pt, j * sw + dx - pl
                            if 0 <= y < h and 0 <= xx < w and x[b, y, xx, ch] > best:
                                best, bi = x[b, y, xx, ch], dx * fh + dy
                    vals[b, i, j, ch], idx[b, i, j, ch] = best, bi
    return vals, idx.view(np.float32)


@register("tflite.custom", "MaxUnpooling2D")
def MaxUnpooling2D(ctx, x, indices, *, custom_options=b""):
    """Write each value at ``window origin + (k % fh, k // fh)``."""
    padding, sh, sw, fh, fw = _params(ctx, custom_options)
    x = np.asarray(x, np.float32)
    k = np.ascontiguousarray(indices, np.float32).view(np.uint32)
    n, ih, iw, c = x.shape
    oh, ow = ctx.outputs[0].shape[1:3]
    _, pt, _ = window_geometry(ctx, padding, oh, fh, sh)
    _, pl, _ = window_geometry(ctx, padding, ow, fw, sw)
    out = np.zeros((n, oh, ow, c), np.float32)
    for b, i, j, ch in np.ndindex(n, ih, iw, c):
        y = i * sh + int(k[b, i, j, ch]) % fh - pt
        xx = j * sw + int(k[b, i, j, ch]) // fh - pl
        if 0 <= y < oh and 0 <= xx < ow:
            out[b, y, xx, ch] = x[b, i, j, ch]
    return out


# --- geometry ops (Landmarks2TransformMatrix, TransformLandmarks, TransformTensorBilinear) ----
# float32 scalars throughout, as MediaPipe's kernels; matrices built and multiplied one by one
# (the lowering multiplies version 2's out in closed form); explicit loops over pixels.

_F = np.float32


def _indices(raw):
    return [int(i) for i in np.asarray(raw if raw is not None else [], np.int64).reshape(-1)]


def _rot2(x, y, a):
    c, s = _F(np.cos(a)), _F(np.sin(a))
    return _F(x * c - y * s), _F(x * s + y * c)


def _check(ctx, idx, n):
    if not idx or min(idx) < 0 or max(idx) >= n:
        raise ctx.error(f"landmark indices {idx} are empty or outside [0, {n})")


@register("tflite.custom", "Landmarks2TransformMatrix")
def Landmarks2TransformMatrix(ctx, landmarks, *, input_hw=None, output_hw=None, dimensions=3,
                              landmarks_range=0, bbox_size_multiplier=1.0, left_rotation_idx=0,
                              right_rotation_idx=1, subset=None, subset_idxs=None,
                              target_rotation_radians=0.0, output_height=0, output_width=0,
                              scale_x=1.0, scale_y=1.0):
    """Loop over the subset tracking the rotated bounding box, then compose
    the version's matrices (see the lowering's docstring)."""
    x = np.asarray(landmarks, _F)
    v2 = ctx.node.version >= 2
    pts = x.reshape(-1, x.shape[-1] if v2 else 3)
    n = pts.shape[0]
    idx = _indices(subset_idxs if v2 else subset)
    li, ri = int(left_rotation_idx), int(right_rotation_idx)
    _check(ctx, idx + [li, ri], n)
    (xl, yl), (xr, yr) = pts[li, :2], pts[ri, :2]
    if v2:
        r = _F(_F(target_rotation_radians) - _F(np.arctan2(_F(yr - yl), _F(xr - xl))))
    else:
        a = _F(-np.arctan(_F(_F(yr - yl) / _F(xr - xl))))
        r = a
    lo_x = lo_y = _F(1e5)
    hi_x = hi_y = _F(-1e5)
    for i in idx:
        px, py = _rot2(pts[i, 0], pts[i, 1], r)
        lo_x, hi_x = min(lo_x, px), max(hi_x, px)
        lo_y, hi_y = min(lo_y, py), max(hi_y, py)
    mx, my = _rot2(_F((lo_x + hi_x) / _F(2)), _F((lo_y + hi_y) / _F(2)), _F(-r))
    if v2:
        ow, oh = _F(output_width), _F(output_height)
        if not (ow > 0 and oh > 0):
            raise ctx.error(f"output size {output_height}x{output_width} must be positive")

        def shift(tx, ty):
            t = np.eye(4, dtype=_F)
            t[0, 3], t[1, 3] = tx, ty
            return t

        rot = np.eye(4, dtype=_F)
        rot[:2, :2] = [[np.cos(-r), -np.sin(-r)], [np.sin(-r), np.cos(-r)]]
        scl = np.diag([_F(scale_x) * _F(hi_x - lo_x) / ow, _F(scale_y) * _F(hi_y - lo_y) / oh, 1, 1]).astype(_F)
        t = np.eye(4, dtype=_F)
        for step in (shift(mx, my), rot, scl, shift(-ow / 2, -oh / 2)):
            t = (t @ step).astype(_F)
        return t.reshape(1, 4, 4)
    if int(dimensions) != 3:
        raise ctx.error(f"dimensions={dimensions}; version 1 supports 3 only")
    (ih, iw), (oh, ow) = _indices(input_hw), _indices(output_hw)
    rng = _F(landmarks_range)
    k = _F(bbox_size_multiplier)
    s_m = np.array([[_F(hi_x - lo_x) * k / rng, 0, 0], [0, _F(hi_y - lo_y) * k / rng, 0], [0, 0, 1]], _F)
    c, s = _F(np.cos(-a)), _F(np.sin(-a))
    r_m = np.array([[c, -s, mx / rng * 2 - 1], [s, c, my / rng * 2 - 1], [0, 0, 1]], _F)
    rel = np.array([[2 / (ow - 1), 0, -1], [0, 2 / (oh - 1), -1], [0, 0, 1]], _F)
    ab = np.array([[(iw - 1) / 2, 0, (iw - 1) / 2], [0, (ih - 1) / 2, (ih - 1) / 2], [0, 0, 1]], _F)
    m3 = ab @ r_m @ s_m @ rel
    out = np.zeros((4, 4), _F)
    out[0, [0, 1, 3]] = m3[0]
    out[1, [0, 1, 3]] = m3[1]
    out[2, :3] = m3[2]
    out[3, 3] = 1
    return out.reshape(1, 4, 4)


@register("tflite.custom", "TransformLandmarks")
def TransformLandmarks(ctx, landmarks, matrix, *, dimensions=None, scale=1.0):
    """Per landmark: ``(x, y) <- rows 0 and 1 of the matrix applied to
    (x, y, 0, scale)`` (version 2: scale 1); other coordinates copied."""
    x = np.asarray(landmarks, _F)
    m = np.asarray(matrix, _F).reshape(16)
    d = x.shape[-1] if ctx.node.version >= 2 else int(dimensions)
    k = _F(1) if ctx.node.version >= 2 else _F(scale)
    pts = x.reshape(-1, d).copy()
    for p in pts:
        v = np.array([p[0], p[1], 0, k], _F)
        p[0], p[1] = np.dot(m[0:4], v), np.dot(m[4:8], v)
    return pts.reshape(x.shape)


@register("tflite.custom", ["TransformTensorBilinear", "TransformTensor"])
def TransformTensorBilinear(ctx, data, matrix, *, mode="bilinear", output_size=None):
    """Per output pixel: map through the matrix (version 2 after the
    half-pixel shift of the translation), zero outside the image, else
    bilinear with zero-valued neighbours past the edge."""
    x = np.asarray(data, _F)
    m = np.asarray(matrix, _F).reshape(16)
    rec = ctx.outputs[0].shape
    if rec is not None and None not in rec[1:3]:
        oh, ow = int(rec[1]), int(rec[2])
    else:
        oh, ow = _indices(output_size)
    xrow, yrow = m[0:4].copy(), m[4:8].copy()
    if ctx.node.version >= 2:
        xrow[3] += xrow[0] * _F(0.5) + xrow[1] * _F(0.5) - _F(0.5)
        yrow[3] += yrow[0] * _F(0.5) + yrow[1] * _F(0.5) - _F(0.5)
    b, h, w, c = x.shape
    out = np.zeros((b, oh, ow, c), _F)

    def q(n, yy, xx):
        return x[n, yy, xx] if 0 <= yy < h and 0 <= xx < w else np.zeros(c, _F)

    for n in range(b):
        for oy in range(oh):
            for ox in range(ow):
                v = np.array([ox, oy, 0, 1], _F)
                tx, ty = np.dot(xrow, v), np.dot(yrow, v)
                if tx < 0 or tx > w - 1 or ty < 0 or ty > h - 1:
                    continue
                x0, y0 = int(np.floor(tx)), int(np.floor(ty))
                fx, fy = _F(tx - x0), _F(ty - y0)
                up = (1 - fx) * q(n, y0, x0) + fx * q(n, y0, x0 + 1)
                lo = (1 - fx) * q(n, y0 + 1, x0) + fx * q(n, y0 + 1, x0 + 1)
                out[n, oy, ox] = fy * lo + (1 - fy) * up
    return out
