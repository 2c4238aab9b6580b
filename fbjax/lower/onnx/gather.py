"""ONNX gather and scatter ops. Negative indices count from the end."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ... import op_rules
from ..registry import register
from ._util import OP_SET, axis as norm_axis


def _wrap(idx, n):
    idx = jnp.asarray(idx).astype(jnp.int32)
    return jnp.where(idx < 0, idx + n, idx)


def _gather_batch(node, carrying, batch) -> None:
    a = node.attrs
    carries = op_rules.carries(node, carrying)
    rank = op_rules.rank(node.inputs[0] if node.inputs else None)
    if carries[1:2] == [True] and (carries[0] or not op_rules.axis_is_batch(a.get("axis", 0), rank)):
        raise op_rules.refusal(node, "takes batch-carrying indices (followed only into a table that does not carry "
                               "the batch, along axis 0)")
    if carries[0] and op_rules.axis_is_batch(a.get("axis", 0), rank):
        raise op_rules.refusal(node, "gathers along the batch dimension (axis 0)")


@register(OP_SET, "Gather", batch=_gather_batch)
def Gather(ctx, data, indices, *, axis=0):
    """ONNX ``Gather``: ``take(data, indices, axis)``."""
    x = jnp.asarray(data)
    a = norm_axis(axis, x.ndim, ctx)
    if isinstance(indices, np.ndarray):
        idx = np.where(indices < 0, indices + x.shape[a], indices).astype(np.int32)
        return jnp.take(x, idx, axis=a)
    return jnp.take(x, _wrap(indices, x.shape[a]), axis=a, mode="clip")


@register(OP_SET, "GatherElements", batch=op_rules.axis_not_batch(0))
def GatherElements(ctx, data, indices, *, axis=0):
    """ONNX ``GatherElements``: ``take_along_axis``."""
    x = jnp.asarray(data)
    a = norm_axis(axis, x.ndim, ctx)
    return jnp.take_along_axis(x, _wrap(indices, x.shape[a]), axis=a, mode="clip")


@register(OP_SET, "GatherND")
def GatherND(ctx, data, indices, *, batch_dims=0):
    """ONNX ``GatherND`` with ``batch_dims`` leading batch dimensions."""
    x = jnp.asarray(data)
    idx = jnp.asarray(indices).astype(jnp.int32)
    b = int(batch_dims)
    k = idx.shape[-1]

    def one(xb, ib):
        dims = xb.shape[:k]
        ib = jnp.where(ib < 0, ib + jnp.asarray(dims, jnp.int32), ib)
        return xb[tuple(ib[..., j] for j in range(k))]

    f = one
    for _ in range(b):
        f = jax.vmap(f)
    return f(x, idx)


def _scatter(ref, reduction, ctx):
    if reduction == "None":
        return ref.set
    m = {"Add": ref.add, "Mul": ref.multiply, "Min": ref.min, "Max": ref.max}.get(reduction)
    if m is None:
        raise ctx.error(f"unknown scatter reduction {reduction!r}")
    return m


@register(OP_SET, "ScatterElements")
def ScatterElements(ctx, data, indices, updates, *, axis=0, reduction="None"):
    """ONNX ``ScatterElements`` along ``axis`` with ``reduction`` None/Add/Mul/Min/Max."""
    x = jnp.asarray(data)
    a = norm_axis(axis, x.ndim, ctx)
    idx = _wrap(indices, x.shape[a])
    grid = list(jnp.meshgrid(*[jnp.arange(s) for s in idx.shape], indexing="ij"))
    grid[a] = idx
    return _scatter(x.at[tuple(grid)], reduction, ctx)(jnp.asarray(updates, x.dtype))


@register(OP_SET, "ScatterND")
def ScatterND(ctx, data, indices, updates, *, reduction="None"):
    """ONNX ``ScatterND`` with ``reduction`` None/Add/Mul/Min/Max."""
    x = jnp.asarray(data)
    idx = jnp.asarray(indices).astype(jnp.int32)
    k = idx.shape[-1]
    dims = jnp.asarray(x.shape[:k], jnp.int32)
    idx = jnp.where(idx < 0, idx + dims, idx)
    ref = x.at[tuple(idx[..., j] for j in range(k))]
    return _scatter(ref, reduction, ctx)(jnp.asarray(updates, x.dtype))
