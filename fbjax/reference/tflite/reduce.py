"""Reductions: MEAN."""

from __future__ import annotations

import numpy as np

from ..registry import register
from . import require_float, to_out


def _axes(ctx, x, axis):
    a = np.asarray(axis)
    if not np.issubdtype(a.dtype, np.integer) or a.ndim > 1:
        raise ctx.error(f"axis must be an integer scalar or vector, got {a.dtype.name}{list(a.shape)}")
    out = []
    for v in a.reshape(-1):
        v = int(v)
        if not -x.ndim <= v < x.ndim:
            raise ctx.error(f"axis {v} is out of range for rank {x.ndim}")
        v = v + x.ndim if v < 0 else v
        if v not in out:  # TFLite resolves repeated axes once
            out.append(v)
    return tuple(out)


@register("tflite", "MEAN", static_inputs=(1,))
def MEAN(ctx, x, axis, *, keep_dims=False):
    """Arithmetic mean over the axes in input 1 (kernels/reduce.cc, float
    path); negative axes count from the end, duplicates count once, and
    ``keep_dims`` keeps reduced axes with length 1. An empty axis list copies
    the input."""
    require_float(ctx, x)
    axes = _axes(ctx, x, axis)
    return to_out(ctx, np.mean(x.astype(np.float64), axis=axes, keepdims=bool(keep_dims)))


# --- the other reductions ----------------------------------------------------

def _reduce(ctx, fn, x, axis, keep_dims):
    x = np.asarray(x)
    axes = _axes(ctx, x, axis)
    acc = x.astype(np.float64) if x.dtype.kind == "f" else x
    return np.asarray(fn(acc, axis=axes, keepdims=bool(keep_dims))).astype(x.dtype)


@register("tflite", "SUM", static_inputs=(1,))
def SUM(ctx, x, axis, *, keep_dims=False):
    """Sum over the axes in input 1 (float64 accumulation)."""
    return _reduce(ctx, np.sum, x, axis, keep_dims)


@register("tflite", "REDUCE_PROD", static_inputs=(1,))
def REDUCE_PROD(ctx, x, axis, *, keep_dims=False):
    """Product over the axes."""
    return _reduce(ctx, np.prod, x, axis, keep_dims)


def _limit(x, lowest: bool):
    info = np.finfo(x.dtype) if x.dtype.kind == "f" else np.iinfo(x.dtype)
    return info.min if lowest else info.max


@register("tflite", "REDUCE_MAX", static_inputs=(1,))
def REDUCE_MAX(ctx, x, axis, *, keep_dims=False):
    """Max over the axes; kernels/reduce.cc starts from the type's lowest
    finite value, which an empty set returns."""
    x = np.asarray(x)
    return _reduce(ctx, lambda a, **k: np.max(a, initial=_limit(x, True), **k) if a.size == 0
                   else np.max(a, **k), x, axis, keep_dims)


@register("tflite", "REDUCE_MIN", static_inputs=(1,))
def REDUCE_MIN(ctx, x, axis, *, keep_dims=False):
    """Min over the axes; an empty set gives the type's largest finite value
    (kernels/reduce.cc's initial value)."""
    x = np.asarray(x)
    return _reduce(ctx, lambda a, **k: np.min(a, initial=_limit(x, False), **k) if a.size == 0
                   else np.min(a, **k), x, axis, keep_dims)


@register("tflite", "REDUCE_ANY", static_inputs=(1,))
def REDUCE_ANY(ctx, x, axis, *, keep_dims=False):
    """Logical or over the axes."""
    return _reduce(ctx, np.any, x, axis, keep_dims)


@register("tflite", "REDUCE_ALL", static_inputs=(1,))
def REDUCE_ALL(ctx, x, axis, *, keep_dims=False):
    """Logical and over the axes."""
    return _reduce(ctx, np.all, x, axis, keep_dims)
