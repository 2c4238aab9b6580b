"""Quantization ops: DEQUANTIZE."""

from __future__ import annotations

import numpy as np

from ...errors import UnsupportedOperatorError
from ..registry import register
from . import to_out


@register("tflite", "DEQUANTIZE")
def DEQUANTIZE(ctx, x):
    """To float (kernels/dequantize.cc).

    float16 inputs are widened exactly. Integer inputs use the input tensor's
    affine parameters: ``(q - zero_point) * scale``, per tensor or per channel
    along ``quantized_dimension``; the product is formed in float64 and
    rounded once, which equals TFLite's float32 arithmetic for these operands.
    """
    if np.issubdtype(x.dtype, np.floating):
        return to_out(ctx, x)
    if not np.issubdtype(x.dtype, np.integer):
        raise UnsupportedOperatorError(
            [ctx.node.key], detail=f"{ctx.node.location}: cannot dequantize {x.dtype.name}")
    q = ctx.inputs[0].quant
    if q is None:
        raise ctx.error(f"integer input {ctx.inputs[0].name!r} has no quantization parameters")
    scale = q.scale.astype(np.float64).reshape(-1)
    zp = q.zero_point.astype(np.int64).reshape(-1)
    if scale.size > 1:
        dim = q.quantized_dimension
        if not 0 <= dim < x.ndim or x.shape[dim] != scale.size:
            raise ctx.error(
                f"{scale.size} per-channel scales do not match dimension {dim} of shape {list(x.shape)}")
        bshape = [1] * x.ndim
        bshape[dim] = scale.size
        scale, zp = scale.reshape(bshape), zp.reshape(bshape)
    return to_out(ctx, (x.astype(np.int64) - zp) * scale)
