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

from ... import op_rules
from ...errors import InputError
from ..layer_slice import LayerSlice
from ..registry import register


def _axis(ctx, a, rank):
    a = int(np.asarray(a).reshape(-1)[0])
    if not -rank <= a < max(rank, 1):
        raise ctx.error(f"axis {a} out of range for rank {rank}")
    return a % max(rank, 1)


@register("tflite", "GATHER", int_passthrough=True, batch=op_rules.axis_not_batch(0))
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


@register("tflite", "GATHER_ND", int_passthrough=True)
def GATHER_ND(ctx, params, indices):
    """TFLite GATHER_ND: ``out[i..] = params[indices[i.., :]]``, the last
    index dim addressing the leading ``k`` params dims."""
    params, indices = jnp.asarray(params), jnp.asarray(indices)
    k = indices.shape[-1]
    if k > params.ndim:
        raise ctx.error(f"index depth {k} exceeds params rank {params.ndim}")
    idx = tuple(jnp.clip(indices[..., j], 0, params.shape[j] - 1) for j in range(k))
    return params[idx]


@register("tflite", "SCATTER_ND", static_inputs=(2,))
def SCATTER_ND(ctx, indices, updates, shape):
    """TFLite SCATTER_ND: zeros of ``shape`` with ``updates`` added at
    ``indices`` (duplicates accumulate, like the reference kernel's ``+=``).
    The output has the updates' dtype, as the kernel requires (so a float64
    trace of a float32 file, as gradient checks run, stays float64)."""
    shape = tuple(int(s) for s in np.asarray(shape).reshape(-1))
    indices, updates = jnp.asarray(indices), jnp.asarray(updates)
    k = indices.shape[-1]
    idx = tuple(indices[..., j] for j in range(k))
    return jnp.zeros(shape, updates.dtype).at[idx].add(updates, mode="drop")


@register("tflite", "ONE_HOT", static_inputs=(1,), batch=op_rules.axis_not_batch())
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


@register("tflite", "TOPK_V2", static_inputs=(1,))
def TOPK_V2(ctx, x, k):
    """TFLite TOPK_V2: the ``k`` largest values of the last dim, descending,
    and their int32 indices (ties: lower index first)."""
    kk = int(np.asarray(k).reshape(()))
    v, i = lax.top_k(jnp.asarray(x), kk)
    return v, i.astype(ctx.out_dtype(1))


def _arg(ctx, fn, x, axis):
    x = jnp.asarray(x)
    a = _axis(ctx, axis, x.ndim)
    if x.shape[a] == 0:  # arg_min_max.cc: "Cannot compute ArgMin/ArgMax over an empty axis"
        raise InputError(f"{ctx.node.location} ({ctx.node.op_name}): the input has shape {tuple(x.shape)}, and "
                         f"there is no index of an extreme over its empty axis {a} (LiteRT refuses it too); "
                         "call the model with a non-empty size there")
    return fn(x, axis=a).astype(ctx.out_dtype(0))


@register("tflite", "ARG_MAX", static_inputs=(1,), differentiable=False,
          int_passthrough=True, batch=op_rules.axis_not_batch())
def ARG_MAX(ctx, x, axis, *, output_type=None):
    """TFLite ARG_MAX: index of the first maximum along ``axis``."""
    return _arg(ctx, jnp.argmax, x, axis)


@register("tflite", "ARG_MIN", static_inputs=(1,), differentiable=False,
          int_passthrough=True, batch=op_rules.axis_not_batch())
def ARG_MIN(ctx, x, axis, *, output_type=None):
    """TFLite ARG_MIN: index of the first minimum along ``axis``."""
    return _arg(ctx, jnp.argmin, x, axis)


@register("tflite", "CUMSUM", static_inputs=(1,), batch=op_rules.axis_not_batch())
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


@register("tflite", "SEGMENT_SUM", static_inputs=(1,))
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
    if kind == "prod" and jnp.issubdtype(data.dtype, jnp.inexact):
        # Dense masked product, [n, N, ...] -> [n, ...]: reverse-differentiable,
        # unlike segment_prod's scatter-multiply (JAX has a VJP for scatter_mul
        # only with unique indices). Memory n * data.size; empty segments are 1.
        mask = ids[None, :] == jnp.arange(n, dtype=ids.dtype)[:, None]
        mask = mask.reshape(mask.shape + (1,) * (data.ndim - 1))
        return jnp.prod(jnp.where(mask, data[None], jnp.ones((), data.dtype)), axis=1)
    fn = {"sum": jax.ops.segment_sum, "prod": jax.ops.segment_prod,
          "max": jax.ops.segment_max, "min": jax.ops.segment_min}[kind]
    y = fn(data, ids, num_segments=n)
    if kind in ("max", "min"):
        count = jax.ops.segment_sum(jnp.ones(ids.shape, jnp.int32), ids, num_segments=n)
        info = jnp.finfo(data.dtype) if jnp.issubdtype(data.dtype, jnp.floating) else jnp.iinfo(data.dtype)
        empty = info.min if kind == "max" else info.max  # numeric_limits lowest() / max()
        y = jnp.where((count == 0).reshape((n,) + (1,) * (y.ndim - 1)), jnp.array(empty, data.dtype), y)
    return y


@register("tflite", "UNSORTED_SEGMENT_SUM", static_inputs=(2,))
def UNSORTED_SEGMENT_SUM(ctx, data, segment_ids, num_segments):
    """TFLite UNSORTED_SEGMENT_SUM: per-segment sums, empty segments 0."""
    return _unsorted(ctx, "sum", data, segment_ids, num_segments)


@register("tflite", "UNSORTED_SEGMENT_PROD", static_inputs=(2,))
def UNSORTED_SEGMENT_PROD(ctx, data, segment_ids, num_segments):
    """TFLite UNSORTED_SEGMENT_PROD: per-segment products, empty segments 1.
    Float data uses a dense masked product (differentiable in both modes);
    integer data a scatter-multiply."""
    return _unsorted(ctx, "prod", data, segment_ids, num_segments)


@register("tflite", "UNSORTED_SEGMENT_MAX", static_inputs=(2,))
def UNSORTED_SEGMENT_MAX(ctx, data, segment_ids, num_segments):
    """TFLite UNSORTED_SEGMENT_MAX: empty segments hold the dtype's lowest value."""
    return _unsorted(ctx, "max", data, segment_ids, num_segments)


@register("tflite", "UNSORTED_SEGMENT_MIN", static_inputs=(2,))
def UNSORTED_SEGMENT_MIN(ctx, data, segment_ids, num_segments):
    """TFLite UNSORTED_SEGMENT_MIN: empty segments hold the dtype's max value."""
    return _unsorted(ctx, "min", data, segment_ids, num_segments)


@register("tflite", "BUCKETIZE", differentiable=False)
def BUCKETIZE(ctx, x, *, boundaries=None):
    """TFLite BUCKETIZE: int32 index of the bucket, i.e. the number of
    (sorted) ``boundaries`` that are ``<= x``."""
    b = jnp.asarray(np.asarray(boundaries if boundaries is not None else [], np.float32))
    return jnp.searchsorted(b, jnp.asarray(x), side="right").astype(ctx.out_dtype(0))


@register("tflite", "DYNAMIC_UPDATE_SLICE", layer_slices=(0,), updates_in_place=(0,))
def DYNAMIC_UPDATE_SLICE(ctx, operand, update, start_indices):
    """TFLite DYNAMIC_UPDATE_SLICE: write ``update`` at ``start_indices``,
    clamped so the update fits (XLA semantics, as the kernel does).

    ``operand`` may be one block of a layer scan's stacked array (a
    :class:`~fbjax.lower.layer_slice.LayerSlice`: an LLM's KV cache): the
    update is written into the stacked array in place, and the result is the
    same block of the updated array."""
    if isinstance(operand, LayerSlice):
        st = operand.stacked
        s = jnp.asarray(start_indices).astype(jnp.int32)
        starts = [jnp.asarray(operand.index, jnp.int32)] + [s[i] for i in range(st.ndim - 1)]
        return LayerSlice(lax.dynamic_update_slice(st, jnp.asarray(update, st.dtype)[None], starts), operand.index)
    operand = jnp.asarray(operand)
    s = jnp.asarray(start_indices)
    starts = [s[i] for i in range(operand.ndim)]
    return lax.dynamic_update_slice(operand, jnp.asarray(update, operand.dtype), starts)


@register("tflite", "EMBEDDING_LOOKUP", table_lookup=True)
def EMBEDDING_LOOKUP(ctx, ids, params):
    """TFLite EMBEDDING_LOOKUP: rows ``params[ids]`` (ids 1-D int32)."""
    return jnp.take(jnp.asarray(params), jnp.asarray(ids), axis=0, mode="clip")


def _hashtable_lookup_batch(node, carrying, batch) -> None:
    """The lookup keys (input 0) may carry the batch; the table may not."""
    if any(op_rules.carries(node, carrying)[1:3]):
        raise op_rules.refusal(node, "looks up in a batch-carrying table (keys or values)")


@register("tflite", "HASHTABLE_LOOKUP", int_passthrough=True, batch=_hashtable_lookup_batch)
def HASHTABLE_LOOKUP(ctx, lookup, keys, values):
    """TFLite HASHTABLE_LOOKUP (``kernels/hashtable_lookup.cc``): for each
    int32 ``lookup[i]`` (shape ``[N]``), the row of ``values`` (``[K, ...]``,
    numeric) whose entry of the sorted int32 ``keys`` (``[K]``) equals it,
    and ``hits[i]`` (uint8) 1; a key not found gives a row of zeros and 0.

    Returns ``(output [N, ...] in the values' dtype, hits [N] uint8)``.
    String tables are not supported (no string tensors in fbjax)."""
    lookup, keys, values = jnp.asarray(lookup), jnp.asarray(keys), jnp.asarray(values)
    if keys.ndim != 1 or values.ndim < 1 or keys.shape[0] != values.shape[0]:
        raise ctx.error(f"keys of shape {tuple(keys.shape)} do not index the rows of values "
                        f"{tuple(values.shape)}")
    k = keys.shape[0]
    pos = jnp.searchsorted(keys, lookup)  # the kernel binary-searches the sorted keys
    row = jnp.clip(pos, 0, max(k - 1, 0))
    hit = (pos < k) & (keys[row] == lookup) if k else jnp.zeros(lookup.shape, bool)
    rows = jnp.take(values, row, axis=0) if k else jnp.zeros(lookup.shape + values.shape[1:], values.dtype)
    mask = hit.reshape(hit.shape + (1,) * (values.ndim - 1))
    return jnp.where(mask, rows, jnp.zeros((), values.dtype)), hit.astype(jnp.uint8)


def _bounded(node, n_out: int, bound):
    """WHERE/UNIQUE's ``static_bound`` rule: only where the input is not
    stored in the file (a stored input's result size is known at load); the
    count named after the first output."""
    x = node.inputs[0] if node.inputs else None
    out = node.outputs[0] if node.outputs else None
    if x is None or x.data is not None or out is None or len(node.outputs) != n_out or not x.static_shape:
        return None
    out.shape = bound(x)
    return out


def _where_bound(node):
    """``[condition size, rank]`` coordinates: one row per element."""
    return _bounded(node, 1, lambda x: (op_rules.size(x), len(x.shape)))


@register("tflite", "WHERE", static_inputs=(0,), differentiable=False, bounded_inputs=(0,),
          static_bound=_where_bound)
def WHERE(ctx, cond):
    """TFLite WHERE (one input, ``kernels/where.cc``): ``[num_true, rank]``
    int64 coordinates of the nonzero elements of ``cond`` (bool or numeric),
    in row-major order. The output size depends on the data, so as loaded
    ``cond`` must be known at load time (refused at load otherwise). In
    static-bound mode (``fbjax.load(..., static_bounds=True)``: the node has
    a trailing ``:valid_count`` output) ``cond`` may be computed by the
    graph: returns the coordinates padded with -1 rows to
    ``[cond.size, rank]`` and the int32 ``num_true``; jittable and
    vmappable."""
    if ctx.bounded:
        c = jnp.asarray(cond) != 0
        n = int(np.prod(c.shape, dtype=np.int64))
        count = jnp.sum(c, dtype=jnp.int32)
        if c.ndim == 0:  # rank 0: one row of no coordinates
            return jnp.zeros((1, 0), ctx.out_dtype(0)), count
        coords = jnp.stack(jnp.nonzero(c, size=n, fill_value=-1), axis=-1)
        return coords.astype(ctx.out_dtype(0)), count
    c = np.asarray(cond)
    return np.argwhere(c != 0).astype(ctx.out_dtype(0))


@register("tflite", "SPARSE_TO_DENSE", static_inputs=(1,))
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


def _unique_bound(node):
    """``[input size]`` values: every element distinct."""
    return _bounded(node, 2, lambda x: (op_rules.size(x),))


@register("tflite", "UNIQUE", static_inputs=(0,), differentiable=False, bounded_inputs=(0,),
          static_bound=_unique_bound)
def UNIQUE(ctx, x, *, idx_out_type=None):
    """TFLite UNIQUE (``kernels/unique.cc``): the distinct values ``y`` of 1-D
    ``x`` in order of first appearance (each the value at its first
    occurrence; values comparing equal, such as -0.0 and 0.0, are one), and
    ``idx`` (int32 or int64, ``x``'s shape) with ``x[i] == y[idx[i]]``. The
    size of ``y`` depends on the data, so as loaded ``x`` must be known at
    load time (refused at load otherwise). In static-bound mode
    (``fbjax.load(..., static_bounds=True)``: a trailing ``:valid_count``
    output) ``x`` may be computed by the graph: ``y`` is padded with zeros
    to ``x.size``, followed by ``idx`` and the int32 number of distinct
    values; jittable and vmappable (a stable sort, O(n log n))."""
    if ctx.bounded:
        return _unique_padded(jnp.asarray(x).reshape(-1), ctx.out_dtype(1))
    x = np.asarray(x).reshape(-1)
    _, first, inv = np.unique(x, return_index=True, return_inverse=True)
    order = np.argsort(first)
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return x[np.sort(first)], rank[inv.reshape(-1)].astype(ctx.out_dtype(1))


def _unique_padded(x, idx_dtype):
    """First-appearance unique of 1-D ``x`` with static shapes: ``(y padded
    with zeros to x.size, idx, int32 count)``. Equal values are adjacent
    after a stable sort; each run's first original position (the smallest,
    a segment minimum) is the first occurrence of that value; ranking the
    first occurrences by position gives the order of ``y``."""
    n = x.shape[0]
    if n == 0:
        return x, jnp.zeros((0,), idx_dtype), jnp.int32(0)
    pos = jnp.arange(n, dtype=jnp.int32)
    perm = jnp.argsort(x, stable=True).astype(jnp.int32)
    xs = x[perm]
    run = jnp.cumsum(jnp.concatenate([jnp.zeros((1,), jnp.int32), (xs[1:] != xs[:-1]).astype(jnp.int32)]))
    first_of_run = jax.ops.segment_min(perm, run, num_segments=n)
    first = jnp.zeros((n,), jnp.int32).at[perm].set(first_of_run[run])  # per element: its first occurrence
    is_first = first == pos
    rank = jnp.cumsum(is_first.astype(jnp.int32)) - 1
    y = jnp.zeros((n,), x.dtype).at[jnp.where(is_first, rank, n)].set(x, mode="drop")
    return y, rank[first].astype(idx_dtype), jnp.sum(is_first, dtype=jnp.int32)


@register("tflite", "EMBEDDING_LOOKUP_SPARSE", static_inputs=(2,))
def EMBEDDING_LOOKUP_SPARSE(ctx, ids, indices, dense_shape, weights, params, *, combiner="SUM"):
    """TFLite EMBEDDING_LOOKUP_SPARSE (``embedding_lookup_sparse.cc``): a
    sparse ``[d0, ..., dk]`` tensor of ids (``indices [N, k + 1]``,
    ``ids [N]``, ``weights [N]``) picks weighted rows of ``params``; entries
    sharing ``indices[:, :-1]`` are combined by SUM, MEAN (divided by the
    sum of weights) or SQRTN (divided by the root of the sum of squared
    weights). Output ``dense_shape[:-1] + params.shape[1:]`` (static)."""
    ds = [int(v) for v in np.asarray(dense_shape).reshape(-1)]
    params = jnp.asarray(params)
    idx = jnp.asarray(indices)[:, :-1]
    nb = int(np.prod(ds[:-1])) if len(ds) > 1 else 1
    strides = np.cumprod([1] + ds[:-1][::-1][:-1])[::-1] if len(ds) > 1 else np.array([], int)
    seg = (idx * jnp.asarray(strides, idx.dtype)).sum(-1) if len(ds) > 1 else jnp.zeros(idx.shape[:1], jnp.int32)
    w = jnp.asarray(weights, params.dtype)
    rows = jnp.take(params, jnp.asarray(ids), axis=0, mode="clip")
    wb = w.reshape((-1,) + (1,) * (params.ndim - 1))
    out = jax.ops.segment_sum(rows * wb, seg, num_segments=nb)
    if combiner in ("MEAN", "SQRTN"):
        d = jax.ops.segment_sum(w if combiner == "MEAN" else w * w, seg, num_segments=nb)
        d = d if combiner == "MEAN" else jnp.sqrt(d)
        out = out / jnp.where(d == 0, 1, d).reshape((-1,) + (1,) * (params.ndim - 1))
    elif combiner != "SUM":
        raise ctx.error(f"unknown combiner {combiner!r}")
    return out.reshape(tuple(ds[:-1]) + params.shape[1:])


@register("tflite", "LSH_PROJECTION", static_inputs=(0,), differentiable=False)
def LSH_PROJECTION(ctx, hash_seeds, x, weight=None, *, type="UNKNOWN"):  # noqa: A002 - schema name
    """TFLite LSH_PROJECTION (``kernels/lsh_projection.cc``): for each seed,
    the sign of ``sum_i weight[i] * Fingerprint64(seed || bytes(x[i]))``;
    SPARSE packs each row of ``num_bits`` signs into one int32 bucket id
    (``+ row * 2**num_bits``), DENSE outputs all the bits. The byte hash runs
    on the host (``jax.pure_callback`` with :mod:`fbjax._farmhash`) when
    ``x`` is traced; keys longer than 32 bytes are refused."""
    from ... import _farmhash

    if type not in ("SPARSE", "DENSE"):
        raise ctx.error(f"unsupported LSH projection type {type!r}")
    seeds = np.asarray(hash_seeds, np.float32)
    x_dt = np.dtype(ctx.inputs[1].dtype)
    item = int(np.prod(jnp.shape(x)[1:])) * x_dt.itemsize
    if 4 + item > 32:
        raise ctx.error(f"input rows of {item} bytes make hash keys over 32 bytes, which are not supported")
    sparse = type == "SPARSE"
    n_out = seeds.shape[0] if sparse else seeds.size

    def host(xv, wv=None):
        return _farmhash.lsh_projection(seeds, np.asarray(xv, x_dt), wv, sparse)

    spec = jax.ShapeDtypeStruct((n_out,), np.int32)
    if weight is None:
        return jax.pure_callback(host, spec, jnp.asarray(x))
    return jax.pure_callback(host, spec, jnp.asarray(x), jnp.asarray(weight, jnp.float32))
