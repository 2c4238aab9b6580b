"""numpy twins of :mod:`fbjax.lower.onnx.norm` (float64)."""

from __future__ import annotations

import numpy as np

from ..registry import register
from ._util import OP_SET, axis as norm_axis, out


def _c(v, nd):
    return np.asarray(v, np.float64).reshape((1, -1) + (1,) * (nd - 2))


@register(OP_SET, "BatchNormalization")
def BatchNormalization(ctx, X, scale, B, input_mean, input_var, *, epsilon=0.0):
    """numpy ONNX ``BatchNormalization`` (inference)."""
    x = np.asarray(X, np.float64)
    y = (x - _c(input_mean, x.ndim)) / np.sqrt(_c(input_var, x.ndim) + epsilon) * _c(scale, x.ndim) + _c(B, x.ndim)
    return out(ctx, y)


@register(OP_SET, "InstanceNormalization")
def InstanceNormalization(ctx, input, scale, B, *, epsilon=0.0):
    """numpy ONNX ``InstanceNormalization``."""
    x = np.asarray(input, np.float64)
    ax = tuple(range(2, x.ndim))
    y = (x - x.mean(ax, keepdims=True)) / np.sqrt(x.var(ax, keepdims=True) + epsilon)
    return out(ctx, y * _c(scale, x.ndim) + _c(B, x.ndim))


@register(OP_SET, "LayerNormalization")
def LayerNormalization(ctx, X, Scale, B=None, *, axis=0, epsilon=0.0):
    """numpy ONNX ``LayerNormalization`` -> (Y, Mean, InvStdDev)."""
    x = np.asarray(X, np.float64)
    ax = tuple(range(norm_axis(axis, x.ndim, ctx), x.ndim))
    m = x.mean(ax, keepdims=True)
    inv = 1.0 / np.sqrt(x.var(ax, keepdims=True) + epsilon)
    y = (x - m) * inv * np.asarray(Scale, np.float64)
    if B is not None:
        y = y + np.asarray(B, np.float64)
    return [out(ctx, v, i) for i, v in enumerate((y, m, inv))][:len(ctx.outputs)]


def _softmax(x, a):
    e = np.exp(x - x.max(axis=a, keepdims=True))
    return e / e.sum(axis=a, keepdims=True)


@register(OP_SET, "Softmax")
def Softmax(ctx, input, *, axis=0):
    """numpy ONNX ``Softmax`` along ``axis``."""
    x = np.asarray(input, np.float64)
    return out(ctx, _softmax(x, norm_axis(axis, x.ndim, ctx)))


@register(OP_SET, "LogSoftmax")
def LogSoftmax(ctx, input, *, axis=0):
    """numpy ONNX ``LogSoftmax`` along ``axis``."""
    x = np.asarray(input, np.float64)
    a = norm_axis(axis, x.ndim, ctx)
    m = x.max(axis=a, keepdims=True)
    return out(ctx, x - m - np.log(np.exp(x - m).sum(axis=a, keepdims=True)))
