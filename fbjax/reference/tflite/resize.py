"""Image resizing: RESIZE_BILINEAR (NHWC)."""

from __future__ import annotations

import numpy as np

from ..registry import register
from . import require_float, to_out


def _source_coords(in_size, out_size, align_corners, half_pixel_centers):
    """Low/high source indices and the weight of the high one, per output index.

    TFLite (reference_ops::ResizeBilinear, ComputeInterpolationValues) works
    in float32: ``scale = in / out``, or ``(in - 1) / (out - 1)`` with
    ``align_corners`` and ``out > 1``; the source coordinate is
    ``(x + 0.5) * scale - 0.5`` with ``half_pixel_centers``, else
    ``x * scale``; ``lo = max(floor(src), 0)``, ``hi = min(ceil(src), in - 1)``
    and the weight of ``hi`` is ``src - lo`` (so below 0 and above ``in - 1``
    the result is the edge value).
    """
    f32 = np.float32
    if align_corners and out_size > 1:
        scale = f32(in_size - 1) / f32(out_size - 1)
    else:
        scale = f32(in_size) / f32(out_size)
    o = np.arange(out_size, dtype=f32)
    src = (o + f32(0.5)) * scale - f32(0.5) if half_pixel_centers else o * scale
    lo = np.maximum(np.floor(src), 0).astype(np.int64)
    hi = np.minimum(np.ceil(src), in_size - 1).astype(np.int64)
    return lo, hi, (src - lo.astype(f32)).astype(np.float64)


@register("tflite", "RESIZE_BILINEAR", static_inputs=(1,))
def RESIZE_BILINEAR(ctx, x, size, *, align_corners=False, half_pixel_centers=False):
    """Bilinear resize of NHWC ``x`` to ``size = [new_height, new_width]``
    (kernels/resize_bilinear.cc, float path)."""
    require_float(ctx, x)
    if align_corners and half_pixel_centers:
        raise ctx.error("align_corners and half_pixel_centers cannot both be set")
    size = np.asarray(size).reshape(-1)
    if x.ndim != 4 or size.size != 2 or not np.issubdtype(size.dtype, np.integer) or np.any(size < 1):
        raise ctx.error(f"expected NHWC input and a positive [2] integer size, got {x.shape} and {size.tolist()}")
    oh, ow = int(size[0]), int(size[1])
    y0, y1, dy = _source_coords(x.shape[1], oh, align_corners, half_pixel_centers)
    x0, x1, dx = _source_coords(x.shape[2], ow, align_corners, half_pixel_centers)
    v = x.astype(np.float64)
    dy, dx = dy[None, :, None, None], dx[None, None, :, None]
    top = v[:, y0][:, :, x0] * (1 - dx) + v[:, y0][:, :, x1] * dx
    bottom = v[:, y1][:, :, x0] * (1 - dx) + v[:, y1][:, :, x1] * dx
    return to_out(ctx, top * (1 - dy) + bottom * dy)
