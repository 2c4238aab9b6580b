"""numpy twins of :mod:`fbjax.lower.onnx.reduce`."""

from __future__ import annotations

import numpy as np

from ... import op_rules
from ...errors import InputError
from ..registry import register
from ._util import OP_SET, axis as norm_axis, ints, out


def _make(name, f):
    def op(ctx, data, axes_input=None, *, axes=None, keep_dims=False):
        x = np.asarray(data)
        ax = ints(axes_input) if axes_input is not None else (list(axes) if axes is not None else [])
        ax = tuple(sorted({norm_axis(a, x.ndim, ctx) for a in ax})) if ax else tuple(range(x.ndim))
        return out(ctx, f(x, ax, bool(keep_dims)))
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"numpy ONNX ``{name}``."
    register(OP_SET, name)(op)


def _ext(f, ident):
    def g(x, a, k):
        if x.size == 0 or any(x.shape[i] == 0 for i in a):
            init = ident(x.dtype)
            return f(x, axis=a, keepdims=k, initial=init)
        return f(x, axis=a, keepdims=k)
    return g


_make("ReduceSum", lambda x, a, k: np.sum(x, a, keepdims=k))
_make("ReduceMean", lambda x, a, k: np.mean(np.asarray(x, np.float64), a, keepdims=k))
_make("ReduceProd", lambda x, a, k: np.prod(x, a, keepdims=k))
_make("ReduceMin", _ext(np.min, lambda d: np.inf if d.kind == "f" else np.iinfo(d).max))
_make("ReduceMax", _ext(np.max, lambda d: -np.inf if d.kind == "f" else np.iinfo(d).min))
_make("ReduceSumSquare", lambda x, a, k: np.sum(np.square(x, dtype=np.float64), a, keepdims=k))
_make("ReduceL2", lambda x, a, k: np.sqrt(np.sum(np.square(x, dtype=np.float64), a, keepdims=k)))


def _arg(name, f):
    def op(ctx, data, *, axis=0, keep_dims=False):
        x = np.asarray(data)
        a = norm_axis(axis, x.ndim, ctx)
        if x.shape[a] == 0:
            raise InputError(f"{ctx.node.location} ({ctx.node.op_name}): the input has shape {tuple(x.shape)}; "
                             f"no index of an extreme exists over its empty axis {a}")
        y = f(x, axis=a)
        return out(ctx, np.expand_dims(y, a) if keep_dims else y)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"numpy ONNX ``{name}`` (first extreme)."
    register(OP_SET, name, out_dtype=op_rules.int32_out)(op)


_arg("ArgMax", np.argmax)
_arg("ArgMin", np.argmin)


@register(OP_SET, "CumSum")
def CumSum(ctx, x, axis):
    """numpy ONNX ``CumSum``."""
    x = np.asarray(x)
    return out(ctx, np.cumsum(x, axis=norm_axis(ints(axis)[0], x.ndim, ctx)))


def _topk_dtype(node, k, graphs):
    """Output 1 (indices) is int32; output 0 has the input's dtype."""
    return np.dtype(np.int32) if k == 1 else None


@register(OP_SET, "TopK", out_dtype=_topk_dtype)
def TopK(ctx, X, K, *, axis=0, largest=False, sorted=False):
    """numpy ONNX ``TopK`` (stable: ties keep the lower index first). In
    static-bound mode (a trailing ``:valid_count`` output) both outputs have
    the axis' size, 0 / -1 from position ``min(K, size)`` on, and the count
    comes last."""
    x = np.asarray(X)
    a = norm_axis(axis, x.ndim, ctx)
    k = ints(K)[0]
    key = -x if largest else x
    if largest and x.dtype.kind in "iu":
        key = -x.astype(np.int64)
    last = ctx.outputs[-1] if ctx.outputs else None
    if last is not None and last.name.endswith(":valid_count") and last.shape == ():
        n = x.shape[a]
        c = min(max(k, 0), n)
        idx = np.argsort(key, axis=a, kind="stable")
        vals = np.take_along_axis(x, idx, a)
        keep = (np.arange(n) < c).reshape([-1 if d == a else 1 for d in range(x.ndim)])
        return [out(ctx, np.where(keep, vals, 0), 0), out(ctx, np.where(keep, idx, -1), 1), out(ctx, np.int32(c), 2)]
    idx = np.argsort(key, axis=a, kind="stable").take(np.arange(k), axis=a)
    return [out(ctx, np.take_along_axis(x, idx, a), 0), out(ctx, idx, 1)]
