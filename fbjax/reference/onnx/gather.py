"""numpy twins of :mod:`fbjax.lower.onnx.gather`."""

from __future__ import annotations

import itertools

import numpy as np

from ..registry import register
from ._util import OP_SET, axis as norm_axis, out


def _w(i, n):
    i = np.asarray(i).astype(np.int64)
    return np.where(i < 0, i + n, i)


@register(OP_SET, "Gather")
def Gather(ctx, data, indices, *, axis=0):
    """numpy ONNX ``Gather``."""
    x = np.asarray(data)
    a = norm_axis(axis, x.ndim)
    return out(ctx, np.take(x, _w(indices, x.shape[a]), axis=a))


@register(OP_SET, "GatherElements")
def GatherElements(ctx, data, indices, *, axis=0):
    """numpy ONNX ``GatherElements``."""
    x = np.asarray(data)
    a = norm_axis(axis, x.ndim)
    return out(ctx, np.take_along_axis(x, _w(indices, x.shape[a]), axis=a))


@register(OP_SET, "GatherND")
def GatherND(ctx, data, indices, *, batch_dims=0):
    """numpy ONNX ``GatherND`` (loop over batch and index tuples)."""
    x = np.asarray(data)
    idx = np.asarray(indices).astype(np.int64)
    b = int(batch_dims)
    k = idx.shape[-1]
    res = []
    for bi in itertools.product(*[range(s) for s in idx.shape[:b]]):
        xb, ib = x[bi], idx[bi]
        flat = ib.reshape(-1, k)
        rows = [xb[tuple(_w(t, xb.shape[j]) for j, t in enumerate(tup))] for tup in flat]
        res.append(np.array(rows).reshape(ib.shape[:-1] + xb.shape[k:]))
    y = np.array(res).reshape(idx.shape[:b] + res[0].shape) if b else res[0]
    return out(ctx, y)


_RED = {"None": lambda a, b: b, "Add": np.add, "Mul": np.multiply, "Min": np.minimum, "Max": np.maximum}


@register(OP_SET, "ScatterElements")
def ScatterElements(ctx, data, indices, updates, *, axis=0, reduction="None"):
    """numpy ONNX ``ScatterElements`` (sequential element loop)."""
    y = np.array(data, copy=True)
    a = norm_axis(axis, y.ndim)
    idx = _w(indices, y.shape[a])
    upd = np.asarray(updates)
    f = _RED[reduction]
    for pos in np.ndindex(*idx.shape):
        tgt = list(pos)
        tgt[a] = idx[pos]
        y[tuple(tgt)] = f(y[tuple(tgt)], upd[pos])
    return out(ctx, y)


@register(OP_SET, "ScatterND")
def ScatterND(ctx, data, indices, updates, *, reduction="None"):
    """numpy ONNX ``ScatterND``."""
    y = np.array(data, copy=True)
    idx = np.asarray(indices).astype(np.int64)
    upd = np.asarray(updates)
    f = _RED[reduction]
    for pos in np.ndindex(*idx.shape[:-1]):
        t = tuple(_w(v, y.shape[j]) for j, v in enumerate(idx[pos]))
        y[t] = f(y[t], upd[pos])
    return out(ctx, y)
