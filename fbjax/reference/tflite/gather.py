"""Indexing ops (numpy reference): gathers, scatters, one-hot, top-k,
arg-max/min, cumsum, segment reductions, bucketize, dynamic update slice,
embedding lookup and WHERE, written with explicit loops or fancy indexing.
"""

from __future__ import annotations

import numpy as np

from ...errors import InputError
from ..registry import register


def _axis(ctx, a, rank):
    a = int(np.asarray(a).reshape(-1)[0])
    if not -rank <= a < max(rank, 1):
        raise ctx.error(f"axis {a} out of range for rank {rank}")
    return a % max(rank, 1)


@register("tflite", "GATHER")
def GATHER(ctx, params, indices, *, axis=0, batch_dims=0):
    """Gather along ``axis`` looping over the ``batch_dims`` leading dims."""
    params, indices = np.asarray(params), np.asarray(indices)
    bd = int(batch_dims) % (indices.ndim + 1) if int(batch_dims) < 0 else int(batch_dims)
    ax = _axis(ctx, axis, params.ndim)
    if bd == 0:
        return np.take(params, indices, axis=ax)
    bshape = params.shape[:bd]
    outs = [np.take(params[b], indices[b], axis=ax - bd) for b in np.ndindex(*bshape)]
    return np.stack(outs).reshape(bshape + outs[0].shape)


@register("tflite", "GATHER_ND")
def GATHER_ND(ctx, params, indices):
    """``params[tuple(indices[..., j])]``."""
    params, indices = np.asarray(params), np.asarray(indices)
    return params[tuple(np.moveaxis(indices, -1, 0))]


@register("tflite", "SCATTER_ND", static_inputs=(2,))
def SCATTER_ND(ctx, indices, updates, shape):
    """Accumulate ``updates`` into zeros at ``indices``."""
    out = np.zeros(tuple(int(s) for s in np.asarray(shape).reshape(-1)), ctx.out_dtype(0))
    indices = np.asarray(indices)
    k = indices.shape[-1]
    flat_i = indices.reshape(-1, k)
    flat_u = np.asarray(updates).reshape((flat_i.shape[0],) + out.shape[k:])
    for i, u in zip(flat_i, flat_u):
        out[tuple(i)] += u
    return out


@register("tflite", "ONE_HOT", static_inputs=(1,))
def ONE_HOT(ctx, indices, depth, on_value, off_value, *, axis=-1):
    """One-hot encoding with the depth dim at ``axis``."""
    indices = np.asarray(indices)
    d = int(np.asarray(depth).reshape(()))
    hot = indices[..., None] == np.arange(d)
    out = np.where(hot, np.asarray(on_value).reshape(()), np.asarray(off_value).reshape(()))
    if int(axis) != -1:
        out = np.moveaxis(out, -1, int(axis))
    return out.astype(ctx.out_dtype(0))


@register("tflite", "TOPK_V2", static_inputs=(1,))
def TOPK_V2(ctx, x, k):
    """Stable descending sort of the last dim, first ``k``."""
    x = np.asarray(x)
    kk = int(np.asarray(k).reshape(()))
    idx = np.argsort(-x.astype(np.float64), axis=-1, kind="stable")[..., :kk]
    return np.take_along_axis(x, idx, axis=-1), idx.astype(ctx.out_dtype(1))


@register("tflite", "ARG_MAX", static_inputs=(1,))
def ARG_MAX(ctx, x, axis, *, output_type=None):
    """First index of the max (an empty axis: InputError, as LiteRT refuses it)."""
    return np.argmax(x, axis=_nonempty(ctx, x, _axis(ctx, axis, np.ndim(x)))).astype(ctx.out_dtype(0))


@register("tflite", "ARG_MIN", static_inputs=(1,))
def ARG_MIN(ctx, x, axis, *, output_type=None):
    """First index of the min (an empty axis: InputError)."""
    return np.argmin(x, axis=_nonempty(ctx, x, _axis(ctx, axis, np.ndim(x)))).astype(ctx.out_dtype(0))


def _nonempty(ctx, x, a: int) -> int:
    if np.shape(x)[a] == 0:
        raise InputError(f"{ctx.node.location} ({ctx.node.op_name}): the input has shape {tuple(np.shape(x))}; "
                         f"no index of an extreme exists over its empty axis {a}")
    return a


@register("tflite", "CUMSUM", static_inputs=(1,))
def CUMSUM(ctx, x, axis, *, exclusive=False, reverse=False):
    """Running sums by an explicit loop along ``axis`` (float64)."""
    x = np.asarray(x)
    a = _axis(ctx, axis, x.ndim)
    xm = np.moveaxis(x.astype(np.float64) if x.dtype.kind == "f" else x, a, 0)
    out = np.zeros_like(xm)
    order = range(xm.shape[0] - 1, -1, -1) if reverse else range(xm.shape[0])
    acc = np.zeros_like(xm[0]) if xm.shape[0] else None
    for i in order:
        if exclusive:
            out[i] = acc
            acc = acc + xm[i]
        else:
            acc = acc + xm[i]
            out[i] = acc
    return np.moveaxis(out, 0, a).astype(x.dtype)


def _segments(ctx, kind, data, ids, n):
    data = np.asarray(data)
    ids = np.asarray(ids)
    data = data.reshape((-1,) + data.shape[ids.ndim:])
    ids = ids.reshape(-1)
    acc = data.astype(np.float64) if data.dtype.kind == "f" else data
    info = np.finfo(data.dtype) if data.dtype.kind == "f" else np.iinfo(data.dtype)
    init = {"sum": 0, "prod": 1, "max": info.min, "min": info.max}[kind]
    out = np.full((n,) + data.shape[1:], init, acc.dtype)
    for i, s in enumerate(ids):
        if 0 <= s < n:
            out[s] = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[kind](out[s], acc[i])
    return out.astype(data.dtype)


@register("tflite", "SEGMENT_SUM", static_inputs=(1,))
def SEGMENT_SUM(ctx, data, segment_ids):
    """Sum rows per (sorted) segment id; ``max(id) + 1`` rows."""
    ids = np.asarray(segment_ids)
    return _segments(ctx, "sum", data, ids, int(ids.max()) + 1 if ids.size else 0)


@register("tflite", "UNSORTED_SEGMENT_SUM", static_inputs=(2,))
def UNSORTED_SEGMENT_SUM(ctx, data, segment_ids, num_segments):
    """Per-segment sum."""
    return _segments(ctx, "sum", data, segment_ids, int(np.asarray(num_segments).reshape(())))


@register("tflite", "UNSORTED_SEGMENT_PROD", static_inputs=(2,))
def UNSORTED_SEGMENT_PROD(ctx, data, segment_ids, num_segments):
    """Per-segment product."""
    return _segments(ctx, "prod", data, segment_ids, int(np.asarray(num_segments).reshape(())))


@register("tflite", "UNSORTED_SEGMENT_MAX", static_inputs=(2,))
def UNSORTED_SEGMENT_MAX(ctx, data, segment_ids, num_segments):
    """Per-segment max (lowest value when empty)."""
    return _segments(ctx, "max", data, segment_ids, int(np.asarray(num_segments).reshape(())))


@register("tflite", "UNSORTED_SEGMENT_MIN", static_inputs=(2,))
def UNSORTED_SEGMENT_MIN(ctx, data, segment_ids, num_segments):
    """Per-segment min (max value when empty)."""
    return _segments(ctx, "min", data, segment_ids, int(np.asarray(num_segments).reshape(())))


@register("tflite", "BUCKETIZE")
def BUCKETIZE(ctx, x, *, boundaries=None):
    """Count of boundaries ``<= x``."""
    b = np.asarray(boundaries if boundaries is not None else [], np.float32)
    x = np.asarray(x)
    return (x[..., None] >= b).sum(-1).astype(ctx.out_dtype(0))


@register("tflite", "DYNAMIC_UPDATE_SLICE")
def DYNAMIC_UPDATE_SLICE(ctx, operand, update, start_indices):
    """Copy with ``update`` written at the clamped start."""
    out = np.array(operand, copy=True)
    update = np.asarray(update)
    s = [min(max(int(v), 0), n - u) for v, n, u in zip(np.asarray(start_indices).reshape(-1), out.shape, update.shape)]
    out[tuple(slice(a, a + u) for a, u in zip(s, update.shape))] = update
    return out


@register("tflite", "EMBEDDING_LOOKUP")
def EMBEDDING_LOOKUP(ctx, ids, params):
    """Rows of ``params``."""
    return np.asarray(params)[np.asarray(ids)]


@register("tflite", "HASHTABLE_LOOKUP")
def HASHTABLE_LOOKUP(ctx, lookup, keys, values):
    """Each lookup key's row of ``values`` by binary search in the sorted
    ``keys`` (zeros and hit 0 when absent), and the uint8 hits."""
    lookup, keys, values = np.asarray(lookup), np.asarray(keys), np.asarray(values)
    if keys.ndim != 1 or values.ndim < 1 or keys.shape[0] != values.shape[0]:
        raise ctx.error(f"keys of shape {keys.shape} do not index the rows of values {values.shape}")
    out = np.zeros(lookup.shape + values.shape[1:], values.dtype)
    hits = np.zeros(lookup.shape, np.uint8)
    for i, key in enumerate(lookup.tolist()):
        lo, hi = 0, len(keys)
        while lo < hi:  # bisection, one probe at a time
            mid = (lo + hi) // 2
            if keys[mid] < key:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(keys) and keys[lo] == key:
            out[i], hits[i] = values[lo], 1
    return out, hits


@register("tflite", "WHERE", static_inputs=(0,))
def WHERE(ctx, cond):
    """Coordinates of true elements; static-bound mode: padded with -1 rows
    to one per element, and the count."""
    c = np.asarray(cond)
    idx = np.argwhere(c != 0).astype(ctx.out_dtype(0))
    if ctx.bounded:
        padded = np.full((c.size, c.ndim), -1, idx.dtype)
        padded[:len(idx)] = idx
        return padded, np.int32(len(idx))
    return idx


@register("tflite", "SPARSE_TO_DENSE", static_inputs=(1,))
def SPARSE_TO_DENSE(ctx, indices, output_shape, values, default_value, *, validate_indices=False):
    """Fill with the default, then write each value at its index."""
    out = np.full(tuple(int(v) for v in np.asarray(output_shape).reshape(-1)),
                  np.asarray(default_value).reshape(()), ctx.out_dtype(0))
    idx = np.asarray(indices)
    idx = idx.reshape(-1, 1) if idx.ndim < 2 else idx
    vals = np.broadcast_to(np.asarray(values), idx.shape[:1])
    for i, v in zip(idx, vals):
        out[tuple(i)] = v
    return out


@register("tflite", "UNIQUE", static_inputs=(0,))
def UNIQUE(ctx, x, *, idx_out_type=None):
    """First-appearance order, by a Python loop."""
    seen, vals, idx = {}, [], []
    for v in np.asarray(x).reshape(-1).tolist():
        if v not in seen:
            seen[v] = len(vals)
            vals.append(v)
        idx.append(seen[v])
    y = np.asarray(vals, np.asarray(x).dtype)
    if ctx.bounded:  # static-bound mode: values padded with zeros to one per element, and the count
        padded = np.zeros(np.asarray(x).size, y.dtype)
        padded[:len(y)] = y
        return padded, np.asarray(idx, ctx.out_dtype(1)), np.int32(len(y))
    return y, np.asarray(idx, ctx.out_dtype(1))


@register("tflite", "EMBEDDING_LOOKUP_SPARSE", static_inputs=(2,))
def EMBEDDING_LOOKUP_SPARSE(ctx, ids, indices, dense_shape, weights, params, *, combiner="SUM"):
    """Loop over sparse entries, accumulate weighted rows per bucket, combine."""
    ds = [int(v) for v in np.asarray(dense_shape).reshape(-1)]
    params = np.asarray(params, np.float64)
    out = np.zeros(tuple(ds[:-1]) + params.shape[1:])
    wsum = np.zeros(tuple(ds[:-1]))
    w2sum = np.zeros(tuple(ds[:-1]))
    for i, row, w in zip(np.asarray(ids), np.asarray(indices), np.asarray(weights, np.float64)):
        key = tuple(int(v) for v in row[:-1])
        out[key] += params[int(i)] * w
        wsum[key] += w
        w2sum[key] += w * w
    if combiner == "MEAN":
        out = out / np.where(wsum == 0, 1, wsum).reshape(wsum.shape + (1,) * (params.ndim - 1))
    elif combiner == "SQRTN":
        d = np.sqrt(w2sum)
        out = out / np.where(d == 0, 1, d).reshape(d.shape + (1,) * (params.ndim - 1))
    return out.astype(ctx.out_dtype(0))


@register("tflite", "LSH_PROJECTION", static_inputs=(0,))
def LSH_PROJECTION(ctx, hash_seeds, x, weight=None, *, type="UNKNOWN"):  # noqa: A002
    """Sign bits of weighted Fingerprint64 sums (see :mod:`fbjax._farmhash`)."""
    from ... import _farmhash

    return _farmhash.lsh_projection(hash_seeds, np.asarray(x), weight, type == "SPARSE")
