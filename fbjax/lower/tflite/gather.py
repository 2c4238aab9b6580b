"""TFLite indexing ops: gathers, scatters, one-hot, top-k, arg-max/min,
cumulative sums, segment reductions, bucketize, dynamic update slice,
embedding lookup and WHERE.

Reference kernels: TFLite ``kernels/gather.cc``, ``gather_nd.cc``,
``scatter_nd.cc``, ``one_hot.cc``, ``topk_v2.cc``, ``arg_min_max.cc``,
``cumsum.cc``, ``segment_sum.cc``, ``unsorted_segment.cc``, ``bucketize.cc``,
``dynamic_update_slice.cc``, ``embedding_lookup.cc``, ``where.cc``.
Index tensors may be computed at run time except where an output *shape*
depends on them (SEGMENT_SUM's ids, WHERE's condition), which must be
static. Out-of-range indices, an error in LiteRT, are clamped here (XLA
gather semantics): jitted code cannot raise on data.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._new import builtin


def _axis(ctx, a, rank):
    a = int(np.asarray(a).reshape(-1)[0])
    if not -rank <= a < max(rank, 1):
        raise ctx.error(f"axis {a} out of range for rank {rank}")
    return a % max(rank, 1)


@builtin("GATHER")
def GATHER(ctx, params, indices, *, axis=0, batch_dims=0):
    """TFLite GATHER: ``out[b.., i.., r..] = params[b.., indices[b.., i..], r..]``
    along ``axis`` with the first ``batch_dims`` dims shared (TF semantics)."""
    params, indices = jnp.asarray(params), jnp.asarray(indices)
    bd = int(batch_dims)
    if bd < 0:
        bd += indices.ndim
    ax = _axis(ctx, axis, params.ndim)
    if not 0 <= bd <= min(ax, indices.ndim):
        raise ctx.error(f"batch_dims {batch_dims} must be in [0, min(axis, indices rank)]")

    def take(p, i, a):
        return jnp.take(p, i, axis=a, mode="clip")

    f = take
    for _ in range(bd):
        f = jax.vmap(f, in_axes=(0, 0, None))
    return f(params, indices, ax - bd)


@builtin("GATHER_ND")
def GATHER_ND(ctx, params, indices):
    """TFLite GATHER_ND: ``out[i..] = params[indices[i.., :]]``, the last
    index dim addressing the leading ``k`` params dims."""
    params, indices = jnp.asarray(params), jnp.asarray(indices)
    k = indices.shape[-1]
    if k > params.ndim:
        raise ctx.error(f"index depth {k} exceeds params rank {params.ndim}")
    idx = tuple(jnp.clip(indices[..., j], 0, params.shape[j] - 1) for j in range(k))
    return params[idx]


@builtin("SCATTER_ND", static_inputs=(2,))
def SCATTER_ND(ctx, indices, updates, shape):
    """TFLite SCATTER_ND: zeros of ``shape`` with ``updates`` added at
    ``indices`` (duplicates accumulate, like the reference kernel's ``+=``)."""
    shape = tuple(int(s) for s in np.asarray(shape).reshape(-1))
    indices = jnp.asarray(indices)
    k = indices.shape[-1]
    idx = tuple(indices[..., j] for j in range(k))
    return jnp.zeros(shape, ctx.out_dtype(0)).at[idx].add(jnp.asarray(updates), mode="drop")


@builtin("ONE_HOT", static_inputs=(1,))
def ONE_HOT(ctx, indices, depth, on_value, off_value, *, axis=-1):
    """TFLite ONE_HOT: ``on_value`` where ``indices == j``, else
    ``off_value``; the new depth dim is inserted at ``axis`` (-1 = last)."""
    indices = jnp.asarray(indices)
    d = int(np.asarray(depth).reshape(()))
    ax = int(axis)
    ax = indices.ndim if ax == -1 else _axis(ctx, ax, indices.ndim + 1)
    shape = [1] * (indices.ndim + 1)
    shape[ax] = d
    hot = jnp.expand_dims(indices, ax) == jnp.arange(d).reshape(shape)
    return jnp.where(hot, jnp.reshape(on_value, ()), jnp.reshape(off_value, ())).astype(ctx.out_dtype(0))


@builtin("TOPK_V2", static_inputs=(1,))
def TOPK_V2(ctx, x, k):
    """TFLite TOPK_V2: the ``k`` largest values of the last dim, descending,
    and their int32 indices (ties: lower index first)."""
    kk = int(np.asarray(k).reshape(()))
    v, i = lax.top_k(jnp.asarray(x), kk)
    return v, i.astype(ctx.out_dtype(1))


def _arg(ctx, fn, x, axis):
    x = jnp.asarray(x)
    return fn(x, axis=_axis(ctx, axis, x.ndim)).astype(ctx.out_dtype(0))


@builtin("ARG_MAX", static_inputs=(1,), differentiable=False)
def ARG_MAX(ctx, x, axis, *, output_type=None):
    """TFLite ARG_MAX: index of the first maximum along ``axis``."""
    return _arg(ctx, jnp.argmax, x, axis)


@builtin("ARG_MIN", static_inputs=(1,), differentiable=False)
def ARG_MIN(ctx, x, axis, *, output_type=None):
    """TFLite ARG_MIN: index of the first minimum along ``axis``."""
    return _arg(ctx, jnp.argmin, x, axis)


@builtin("CUMSUM", static_inputs=(1,))
def CUMSUM(ctx, x, axis, *, exclusive=False, reverse=False):
    """TFLite CUMSUM along ``axis``; ``exclusive`` shifts by one (first
    element 0), ``reverse`` sums from the end."""
    x = jnp.asarray(x)
    a = _axis(ctx, axis, x.ndim)
    if reverse:
        x = lax.rev(x, (a,))
    y = jnp.cumsum(x, axis=a, dtype=x.dtype)
    if exclusive:
        y = y - x
    if reverse:
        y = lax.rev(y, (a,))
    return y


@builtin("SEGMENT_SUM", static_inputs=(1,))
def SEGMENT_SUM(ctx, data, segment_ids):
    """TFLite SEGMENT_SUM: sorted ``segment_ids`` (static); output has
    ``max(ids) + 1`` rows, missing segments are 0."""
    ids = np.asarray(segment_ids).reshape(-1)
    if ids.size and (np.diff(ids) < 0).any():
        raise ctx.error("segment_ids are not sorted")
    n = int(ids.max()) + 1 if ids.size else 0
    return jax.ops.segment_sum(jnp.asarray(data), jnp.asarray(ids), num_segments=n)


def _unsorted(ctx, kind, data, ids, num_segments):
    data = jnp.asarray(data)
    ids = jnp.asarray(ids)
    n = int(np.asarray(num_segments).reshape(()))
    if ids.ndim > 1:  # ids may cover several leading dims of data
        data = data.reshape((-1,) + data.shape[ids.ndim:])
        ids = ids.reshape(-1)
    fn = {"sum": jax.ops.segment_sum, "prod": jax.ops.segment_prod,
          "max": jax.ops.segment_max, "min": jax.ops.segment_min}[kind]
    y = fn(data, ids, num_segments=n)
    if kind in ("max", "min"):
        count = jax.ops.segment_sum(jnp.ones(ids.shape, jnp.int32), ids, num_segments=n)
        info = jnp.finfo(data.dtype) if jnp.issubdtype(data.dtype, jnp.floating) else jnp.iinfo(data.dtype)
        empty = info.min if kind == "max" else info.max  # numeric_limits lowest() / max()
        y = jnp.where((count == 0).reshape((n,) + (1,) * (y.ndim - 1)), jnp.array(empty, data.dtype), y)
    return y


@builtin("UNSORTED_SEGMENT_SUM", static_inputs=(2,))
def UNSORTED_SEGMENT_SUM(ctx, data, segment_ids, num_segments):
    """TFLite UNSORTED_SEGMENT_SUM: per-segment sums, empty segments 0."""
    return _unsorted(ctx, "sum", data, segment_ids, num_segments)


@builtin("UNSORTED_SEGMENT_PROD", static_inputs=(2,))
def UNSORTED_SEGMENT_PROD(ctx, data, segment_ids, num_segments):
    """TFLite UNSORTED_SEGMENT_PROD: per-segment products, empty segments 1."""
    return _unsorted(ctx, "prod", data, segment_ids, num_segments)


@builtin("UNSORTED_SEGMENT_MAX", static_inputs=(2,))
def UNSORTED_SEGMENT_MAX(ctx, data, segment_ids, num_segments):
    """TFLite UNSORTED_SEGMENT_MAX: empty segments hold the dtype's lowest value."""
    return _unsorted(ctx, "max", data, segment_ids, num_segments)


@builtin("UNSORTED_SEGMENT_MIN", static_inputs=(2,))
def UNSORTED_SEGMENT_MIN(ctx, data, segment_ids, num_segments):
    """TFLite UNSORTED_SEGMENT_MIN: empty segments hold the dtype's max value."""
    return _unsorted(ctx, "min", data, segment_ids, num_segments)


@builtin("BUCKETIZE", differentiable=False)
def BUCKETIZE(ctx, x, *, boundaries=None):
    """TFLite BUCKETIZE: int32 index of the bucket, i.e. the number of
    (sorted) ``boundaries`` that are ``<= x``."""
    b = jnp.asarray(np.asarray(boundaries if boundaries is not None else [], np.float32))
    return jnp.searchsorted(b, jnp.asarray(x), side="right").astype(ctx.out_dtype(0))


@builtin("DYNAMIC_UPDATE_SLICE")
def DYNAMIC_UPDATE_SLICE(ctx, operand, update, start_indices):
    """TFLite DYNAMIC_UPDATE_SLICE: write ``update`` at ``start_indices``,
    clamped so the update fits (XLA semantics, as the kernel does)."""
    operand = jnp.asarray(operand)
    s = jnp.asarray(start_indices)
    starts = [s[i] for i in range(operand.ndim)]
    return lax.dynamic_update_slice(operand, jnp.asarray(update, operand.dtype), starts)


@builtin("EMBEDDING_LOOKUP")
def EMBEDDING_LOOKUP(ctx, ids, params):
    """TFLite EMBEDDING_LOOKUP: rows ``params[ids]`` (ids 1-D int32)."""
    return jnp.take(jnp.asarray(params), jnp.asarray(ids), axis=0, mode="clip")


@builtin("WHERE", static_inputs=(0,), differentiable=False)
def WHERE(ctx, cond):
    """TFLite WHERE (one input): ``[num_true, rank]`` int64 coordinates of
    the true elements in row-major order. The output size depends on the
    data, so the condition must be known at load time."""
    c = np.asarray(cond)
    return np.argwhere(c != 0).astype(ctx.out_dtype(0))


@builtin("SPARSE_TO_DENSE", static_inputs=(1,))
def SPARSE_TO_DENSE(ctx, indices, output_shape, values, default_value, *, validate_indices=False):
    """TFLite SPARSE_TO_DENSE: ``default_value`` everywhere except
    ``out[indices[k]] = values[k]`` (``values`` may be a scalar; 1-D
    ``indices`` address a 1-D output)."""
    shape = tuple(int(v) for v in np.asarray(output_shape).reshape(-1))
    idx = jnp.asarray(indices)
    if idx.ndim < 2:
        idx = idx.reshape(-1, 1)
    vals = jnp.broadcast_to(jnp.asarray(values), idx.shape[:1])
    out = jnp.full(shape, jnp.reshape(jnp.asarray(default_value), ()), ctx.out_dtype(0))
    return out.at[tuple(idx[:, j] for j in range(idx.shape[1]))].set(vals.astype(out.dtype), mode="drop")


@builtin("UNIQUE", static_inputs=(0,), differentiable=False)
def UNIQUE(ctx, x, *, idx_out_type=None):
    """TFLite UNIQUE: the distinct values of 1-D ``x`` in order of first
    appearance, and for each element its index into them. The output size
    depends on the data, so ``x`` must be known at load time."""
    x = np.asarray(x).reshape(-1)
    _, first, inv = np.unique(x, return_index=True, return_inverse=True)
    order = np.argsort(first)
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return x[np.sort(first)], rank[inv.reshape(-1)].astype(ctx.out_dtype(1))
