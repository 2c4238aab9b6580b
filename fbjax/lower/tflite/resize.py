"""TFLite image resizing, float path, NHWC (``kernels/resize_bilinear.cc``)."""

from __future__ import annotations

import numpy as np

from .. import kernels
from ..registry import register
from .elementwise import require_unquantized


@register("tflite", "RESIZE_BILINEAR", static_inputs=(1,))
def RESIZE_BILINEAR(ctx, x, size, *, align_corners=False, half_pixel_centers=False):
    """TFLite RESIZE_BILINEAR (``reference_ops::ResizeBilinear``), NHWC.

    ``size`` is the static ``[new_height, new_width]``. Source coordinates
    follow :func:`fbjax.lower.kernels.linear_resize_coords` (float32, the
    TFLite rules for ``align_corners`` and ``half_pixel_centers``).
    """
    require_unquantized(ctx, "RESIZE_BILINEAR")
    if x.ndim != 4:
        raise ctx.error(f"expected a 4-D NHWC input, got shape {tuple(x.shape)}")
    hw = [int(v) for v in np.asarray(size).reshape(-1)]
    if len(hw) != 2 or min(hw) < 1:
        raise ctx.error(f"size must be two positive ints [new_height, new_width], got {hw}")
    if align_corners and half_pixel_centers:
        raise ctx.error("half_pixel_centers requires align_corners to be False")
    coords = [
        kernels.linear_resize_coords(x.shape[ax], n, align_corners=bool(align_corners),
                                     half_pixel_centers=bool(half_pixel_centers))
        for ax, n in ((1, hw[0]), (2, hw[1]))
    ]
    return kernels.resize_linear(x, (1, 2), coords)
