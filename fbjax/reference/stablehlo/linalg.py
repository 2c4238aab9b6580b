"""numpy twins of ``stablehlo.dot`` and ``stablehlo.dot_general``."""

from __future__ import annotations

import numpy as np

from ..registry import register
from ._util import ints

OP_SET = "stablehlo"


def _acc(dt):
    dt = np.dtype(dt)
    if dt.kind == "c":
        return np.complex128
    if dt.kind == "f" or dt.name == "bfloat16":  # ml_dtypes' bfloat16 is not np.floating
        return np.float64
    return np.int64 if dt.kind == "i" else np.uint64


@register(OP_SET, "stablehlo.dot")
def dot(ctx, lhs, rhs):
    """Contract the last dim of ``lhs`` with the first of ``rhs``."""
    out = ctx.out_dtype(0)
    return np.tensordot(np.asarray(lhs).astype(_acc(out)), np.asarray(rhs).astype(_acc(out)), axes=([-1], [0])).astype(out)


@register(OP_SET, "stablehlo.dot_general")
def dot_general(ctx, lhs, rhs, *, lhs_batching_dimensions=(), rhs_batching_dimensions=(),
                lhs_contracting_dimensions=(), rhs_contracting_dimensions=()):
    """einsum with result dims batch, lhs free, rhs free (spec order)."""
    a, b = np.asarray(lhs), np.asarray(rhs)
    lb, rb = ints(lhs_batching_dimensions), ints(rhs_batching_dimensions)
    lc, rc = ints(lhs_contracting_dimensions), ints(rhs_contracting_dimensions)
    letters = iter("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    la = [None] * a.ndim
    lb_ = [None] * b.ndim
    batch = []
    for i, j in zip(lb, rb):
        c = next(letters)
        la[i] = lb_[j] = c
        batch.append(c)
    for i, j in zip(lc, rc):
        c = next(letters)
        la[i] = lb_[j] = c
    free_a = []
    for i in range(a.ndim):
        if la[i] is None:
            la[i] = next(letters)
            free_a.append(la[i])
    free_b = []
    for j in range(b.ndim):
        if lb_[j] is None:
            lb_[j] = next(letters)
            free_b.append(lb_[j])
    spec = f"{''.join(la)},{''.join(lb_)}->{''.join(batch + free_a + free_b)}"
    out = ctx.out_dtype(0)
    return np.einsum(spec, a.astype(_acc(out)), b.astype(_acc(out))).astype(out)
