"""numpy twins of :mod:`fbjax.lower.onnx.pool` (window loops, float64)."""

from __future__ import annotations

import itertools

import numpy as np

from ..registry import register
from ._util import OP_SET, ints, out, pad_pairs, per_dim


def _geometry(shape, kernel_size, auto_pad, pads, strides, ceil_mode):
    n = len(shape) - 2
    k = ints(kernel_size)
    s = per_dim(strides, n)
    pp = pad_pairs(auto_pad, pads, shape[2:], k, s, [1] * n)
    outs = []
    for i, kk, ss, (a, b) in zip(shape[2:], k, s, pp):
        span = i + a + b - kk
        o = (-(-span // ss) if ceil_mode else span // ss) + 1
        if ceil_mode and (o - 1) * ss >= i + a:
            o -= 1
        outs.append(o)
    return k, s, pp, outs


def _pool(X, kernel_size, auto_pad, pads, strides, ceil_mode, fn):
    X = np.asarray(X, np.float64)
    k, s, pp, outs = _geometry(X.shape, kernel_size, auto_pad, pads, strides, ceil_mode)
    y = np.zeros(X.shape[:2] + tuple(outs))
    for pos in itertools.product(*[range(o) for o in outs]):
        lo = [p * st - a for p, st, (a, _) in zip(pos, s, pp)]
        y[(slice(None), slice(None)) + pos] = fn(X, lo, k, pp)
    return y


@register(OP_SET, "MaxPool")
def MaxPool(ctx, X, *, kernel_size=(), auto_pad="Same", pads=None, strides=None, ceil_mode=False):
    """numpy ONNX ``MaxPool`` (padding ignored); optional Indices: flat index of the
    first maximum of each window."""
    def f(x, lo, k, pp):
        sl = tuple(slice(max(l, 0), min(l + kk, x.shape[2 + i])) for i, (l, kk) in enumerate(zip(lo, k)))
        return x[(slice(None), slice(None)) + sl].max(axis=tuple(range(2, x.ndim)))
    y = out(ctx, _pool(X, kernel_size, auto_pad, pads, strides, ceil_mode, f))
    if not (len(ctx.outputs) > 1 and ctx.outputs[1] is not None):
        return y
    x = np.asarray(X)
    flat = np.arange(x.size).reshape(x.shape)

    def g(xx, lo, k, pp):
        sl = tuple(slice(max(l, 0), min(l + kk, x.shape[2 + i])) for i, (l, kk) in enumerate(zip(lo, k)))
        win = x[(slice(None), slice(None)) + sl].reshape(x.shape[0], x.shape[1], -1)
        ids = flat[(slice(None), slice(None)) + sl].reshape(x.shape[0], x.shape[1], -1)
        return np.take_along_axis(ids, win.argmax(-1)[..., None], -1)[..., 0]
    return [y, out(ctx, _pool(X, kernel_size, auto_pad, pads, strides, ceil_mode, g), 1)]


@register(OP_SET, "AveragePool")
def AveragePool(ctx, X, *, kernel_size=(), auto_pad="Same", pads=None, strides=None, count_include_pad=False,
                ceil_mode=False):
    """numpy ONNX ``AveragePool``: in-bounds taps, or taps inside the explicit padding."""
    def f(x, lo, k, pp):
        sl = tuple(slice(max(l, 0), min(l + kk, x.shape[2 + i])) for i, (l, kk) in enumerate(zip(lo, k)))
        total = x[(slice(None), slice(None)) + sl].sum(axis=tuple(range(2, x.ndim)))
        if count_include_pad:
            cnt = np.prod([min(l + kk, x.shape[2 + i] + pp[i][1]) - max(l, -pp[i][0])
                           for i, (l, kk) in enumerate(zip(lo, k))])
        else:
            cnt = np.prod([s.stop - s.start for s in sl])
        return total / max(cnt, 1)
    return out(ctx, _pool(X, kernel_size, auto_pad, pads, strides, ceil_mode, f))


@register(OP_SET, "GlobalAveragePool")
def GlobalAveragePool(ctx, X):
    """numpy ONNX ``GlobalAveragePool``."""
    X = np.asarray(X, np.float64)
    return out(ctx, X.mean(axis=tuple(range(2, X.ndim)), keepdims=True))
