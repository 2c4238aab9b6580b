"""numpy twins of :mod:`fbjax.lower.onnx.quant`."""

from __future__ import annotations

import numpy as np

from ... import op_rules
from ..registry import register
from ._util import OP_SET, axis as norm_axis, out


def _b(v, x, axis):
    v = np.asarray(v)
    if v.ndim == 1 and v.size > 1:
        shape = [1] * x.ndim
        shape[norm_axis(axis, x.ndim)] = v.size
        return v.reshape(shape)
    return v


def _quantizelinear_dtype(node, k, graphs):
    """``output_dtype``, else the zero point's dtype, else uint8 (the ONNX default)."""
    zp = node.inputs[2] if len(node.inputs) > 2 else None
    return node.attrs.get("output_dtype") or (zp.dtype if zp is not None and zp.dtype else np.dtype(np.uint8))


@register(OP_SET, "QuantizeLinear", out_dtype=_quantizelinear_dtype)
def QuantizeLinear(ctx, x, y_scale, y_zero_point=None, *, axis=0, output_dtype=None):
    """numpy ONNX ``QuantizeLinear`` (round half to even, saturate)."""
    x = np.asarray(x, np.float32)
    dt = np.dtype(output_dtype) if output_dtype is not None else (
        np.asarray(y_zero_point).dtype if y_zero_point is not None else np.dtype(np.uint8))
    q = np.rint(x / _b(y_scale, x, axis).astype(np.float32))
    if y_zero_point is not None:
        q = q + _b(y_zero_point, x, axis)
    i = np.iinfo(dt)
    return out(ctx, np.clip(q, i.min, i.max).astype(dt))


@register(OP_SET, "DequantizeLinear", out_dtype=op_rules.float32_out)
def DequantizeLinear(ctx, x, x_scale, x_zero_point=None, *, axis=0):
    """numpy ONNX ``DequantizeLinear``."""
    xi = np.asarray(x, np.int64)
    if x_zero_point is not None:
        xi = xi - _b(x_zero_point, xi, axis).astype(np.int64)
    return out(ctx, xi * _b(x_scale, xi, axis).astype(np.float64))


def _dynamicquantizelinear_dtype(node, k, graphs):
    """(y uint8, y_scale float32, y_zero_point uint8)."""
    return np.dtype(np.float32) if k == 1 else np.dtype(np.uint8)


@register(OP_SET, "DynamicQuantizeLinear", out_dtype=_dynamicquantizelinear_dtype)
def DynamicQuantizeLinear(ctx, x):
    """numpy ONNX ``DynamicQuantizeLinear`` (uint8)."""
    x = np.asarray(x, np.float32)
    lo, hi = min(float(x.min(initial=0)), 0.0), max(float(x.max(initial=0)), 0.0)
    scale = np.float32((hi - lo) / 255.0)
    s = scale if scale != 0 else np.float32(1)
    zp = np.clip(np.rint(-lo / s), 0, 255)
    y = np.clip(np.rint(x / s) + zp, 0, 255).astype(np.uint8)
    return [out(ctx, y, 0), out(ctx, scale, 1), out(ctx, np.uint8(zp), 2)]
