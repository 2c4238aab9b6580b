"""Quantization ops: DEQUANTIZE, QUANTIZE (float input)."""

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


@register("tflite", "QUANTIZE")
def QUANTIZE(ctx, x):
    """Float to integer with the output tensor's affine parameters, as the
    builtin kernel (kernels/quantize.cc, optimized AffineQuantize) computes it:
    ``clamp(round_half_even(x * float32(1 / scale)) + zero_point)`` in float32
    per tensor; per channel along ``quantized_dimension`` the per-channel
    kernel's ``round_half_away(x / scale) + zero_point`` (ties differ; both
    checked against ai-edge-litert). Integer inputs
    (requantization) belong to the quantized path (op set ``tflite.int``).

    Raises:
        UnsupportedOperatorError: integer input.
        ModelFormatError: the output has no quantization parameters, is not an
            integer type, or its per-channel scales do not fit its shape.
    """
    if not np.issubdtype(x.dtype, np.floating):
        raise UnsupportedOperatorError(
            [ctx.node.key], detail=f"{ctx.node.location}: {x.dtype.name} input (requantization is "
            "on the quantized path, op set tflite.int)")
    out = ctx.outputs[0]
    dt = np.dtype(ctx.out_dtype(0))
    if not np.issubdtype(dt, np.integer):
        raise ctx.error(f"QUANTIZE to {dt.name}: expected an integer output")
    q = out.quant
    if q is None:
        raise ctx.error(f"output {out.name!r} has no quantization parameters")
    inv = (np.float32(1) / np.asarray(q.scale, np.float32).reshape(-1)).astype(np.float32)
    zp = np.asarray(q.zero_point, np.int64).reshape(-1)
    if zp.size == 1 and inv.size > 1:
        zp = np.repeat(zp, inv.size)
    if inv.size > 1:
        dim = q.quantized_dimension
        if not 0 <= dim < x.ndim or x.shape[dim] != inv.size:
            raise ctx.error(
                f"{inv.size} per-channel scales do not match dimension {dim} of shape {list(x.shape)}")
        shape = [1] * x.ndim
        shape[dim] = inv.size
        inv, zp = inv.reshape(shape), zp.reshape(shape)
    info = np.iinfo(dt)
    x = np.asarray(x, np.float32)
    if inv.size > 1:  # reference_ops::PerChannelQuantize: x / scale, ties away from zero
        v = (x / np.asarray(q.scale, np.float32).reshape(inv.shape)).astype(np.float32)
        y = np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))
    else:
        y = np.rint((x * inv).astype(np.float32))
    return (np.clip(y, info.min - zp, info.max - zp).astype(np.int64) + zp).astype(dt)
