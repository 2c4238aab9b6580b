"""Helpers for the numpy ONNX (RTen) reference ops. numpy only."""

from __future__ import annotations

import numpy as np

OP_SET = "onnx"


def axis(a, rank: int, ctx=None) -> int:
    a = int(a)
    if not -rank <= a < max(rank, 1):
        raise (ctx.error if ctx is not None else ValueError)(f"axis {a} is out of range for rank {rank}")
    return a % max(rank, 1)


def ints(x) -> list:
    return [] if x is None else [int(v) for v in np.asarray(x).reshape(-1)]


def out(ctx, y, i: int = 0):
    """``y`` as the dtype the model declares for output ``i``."""
    o = ctx.outputs[i] if i < len(ctx.outputs) else None
    y = np.asarray(y)
    return y.astype(o.dtype) if o is not None and y.dtype != o.dtype else y


def per_dim(v, n):
    v = ints(v) or [1] * n
    if len(v) != n and all(x == v[0] for x in v):
        v = [v[0]] * n
    return v


def pad_pairs(auto_pad, pads, in_sizes, k_sizes, strides, dilations):
    """(before, after) per spatial dim; ``Same`` is SAME_UPPER (extra at the end)."""
    n = len(in_sizes)
    if auto_pad == "Same":
        res = []
        for i, k, s, d in zip(in_sizes, k_sizes, strides, dilations):
            o = -(-i // s)
            t = max((o - 1) * s + (k - 1) * d + 1 - i, 0)
            res.append((t // 2, t - t // 2))
        return res
    p = ints(pads)
    if not any(p):
        p = [0] * (2 * n)
    return [(p[i], p[i + n]) for i in range(n)]
