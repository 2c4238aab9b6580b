"""TFLite 2-D pooling, float path, NHWC (``kernels/pooling.cc``)."""

from __future__ import annotations

from .. import kernels
from ..registry import register
from .elementwise import apply_fused, require_unquantized


def _geometry(ctx, x, padding, stride_w, stride_h, filter_width, filter_height):
    if x.ndim != 4:
        raise ctx.error(f"expected a 4-D NHWC input, got shape {tuple(x.shape)}")
    for name, v in (("stride_w", stride_w), ("stride_h", stride_h),
                    ("filter_width", filter_width), ("filter_height", filter_height)):
        if int(v) < 1:
            raise ctx.error(f"{name} must be >= 1, got {v}")
    window = (int(filter_height), int(filter_width))
    strides = (int(stride_h), int(stride_w))
    try:
        pads = kernels.explicit_padding(padding, x.shape[1:3], window, strides)
    except ValueError as e:
        raise ctx.error(str(e)) from None
    return dict(window=window, strides=strides, padding=pads, spatial_axes=(1, 2))


@register("tflite", "MAX_POOL_2D")
def MAX_POOL_2D(ctx, x, *, padding="SAME", stride_w=1, stride_h=1, filter_width=1, filter_height=1,
                fused_activation_function="NONE"):
    """TFLite MAX_POOL_2D (``reference_ops::MaxPool``): NHWC max over
    ``filter_height x filter_width`` windows; padded positions are ignored."""
    require_unquantized(ctx, "MAX_POOL_2D")
    g = _geometry(ctx, x, padding, stride_w, stride_h, filter_width, filter_height)
    return apply_fused(ctx, kernels.max_pool(x, **g), fused_activation_function)


@register("tflite", "AVERAGE_POOL_2D", full_precision=True)
def AVERAGE_POOL_2D(ctx, x, *, padding="SAME", stride_w=1, stride_h=1, filter_width=1, filter_height=1,
                    fused_activation_function="NONE"):
    """TFLite AVERAGE_POOL_2D (``reference_ops::AveragePool``): NHWC mean over
    windows, dividing by the number of in-bounds taps (padding excluded)."""
    require_unquantized(ctx, "AVERAGE_POOL_2D")
    g = _geometry(ctx, x, padding, stride_w, stride_h, filter_width, filter_height)
    return apply_fused(ctx, kernels.avg_pool(x, **g), fused_activation_function)
