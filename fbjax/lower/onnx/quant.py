"""ONNX linear quantization: ``QuantizeLinear``, ``DequantizeLinear``,
``DynamicQuantizeLinear`` (``MatMulInteger`` and ``ConvInteger`` live with
their float twins in :mod:`.conv`).

``axis`` is the per-axis dimension when the scale is a 1-D tensor of more
than one element (schema default 0; rten-convert writes ONNX's 1).
Rounding is half to even, results saturate to the target type.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ... import op_rules
from ..registry import register
from ._util import OP_SET, axis as norm_axis


def _bcast(v, x, axis, ctx):
    v = jnp.asarray(v)
    if v.ndim == 1 and v.size > 1:
        a = norm_axis(axis, x.ndim, ctx)
        shape = [1] * x.ndim
        shape[a] = v.size
        return v.reshape(shape)
    return v


def _quantizelinear_dtype(node, k, graphs):
    """``output_dtype``, else the zero point's dtype, else uint8 (the ONNX default)."""
    zp = node.inputs[2] if len(node.inputs) > 2 else None
    return node.attrs.get("output_dtype") or (zp.dtype if zp is not None and zp.dtype else np.dtype(np.uint8))


@register(OP_SET, "QuantizeLinear", out_dtype=_quantizelinear_dtype, differentiable=False)
def QuantizeLinear(ctx, x, y_scale, y_zero_point=None, *, axis=0, output_dtype=None):
    """ONNX ``QuantizeLinear``: ``saturate(round(x / scale) + zero_point)``.

    Output type: ``output_dtype``, else the zero point's, else uint8.
    """
    x = jnp.asarray(x, jnp.float32)
    dt = np.dtype(output_dtype) if output_dtype is not None else (
        np.dtype(jnp.asarray(y_zero_point).dtype) if y_zero_point is not None else np.dtype(np.uint8))
    info = np.iinfo(dt)
    q = jnp.round(x / _bcast(y_scale, x, axis, ctx))
    if y_zero_point is not None:
        q = q + _bcast(y_zero_point, x, axis, ctx).astype(jnp.float32)
    return jnp.clip(q, info.min, info.max).astype(dt)


@register(OP_SET, "DequantizeLinear", out_dtype=op_rules.float32_out)
def DequantizeLinear(ctx, x, x_scale, x_zero_point=None, *, axis=0):
    """ONNX ``DequantizeLinear``: ``(x - zero_point) * scale`` in float32."""
    xi = jnp.asarray(x).astype(jnp.int32)
    if x_zero_point is not None:
        xi = xi - _bcast(x_zero_point, xi, axis, ctx).astype(jnp.int32)
    return xi.astype(jnp.float32) * _bcast(x_scale, xi, axis, ctx).astype(jnp.float32)


def _dynamicquantizelinear_dtype(node, k, graphs):
    """(y uint8, y_scale float32, y_zero_point uint8)."""
    return np.dtype(np.float32) if k == 1 else np.dtype(np.uint8)


@register(OP_SET, "DynamicQuantizeLinear", out_dtype=_dynamicquantizelinear_dtype, differentiable=False)
def DynamicQuantizeLinear(ctx, x):
    """ONNX ``DynamicQuantizeLinear``: uint8 ``(y, y_scale, y_zero_point)`` from the
    data range extended to include 0."""
    x = jnp.asarray(x, jnp.float32)
    lo = jnp.minimum(jnp.min(x), 0.0)
    hi = jnp.maximum(jnp.max(x), 0.0)
    scale = (hi - lo) / 255.0
    safe = jnp.where(scale == 0, 1.0, scale)
    zp = jnp.clip(jnp.round(-lo / safe), 0, 255)
    y = jnp.clip(jnp.round(x / safe) + zp, 0, 255).astype(jnp.uint8)
    return y, scale.astype(jnp.float32), zp.astype(jnp.uint8)
