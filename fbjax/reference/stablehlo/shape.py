"""numpy twins of the StableHLO data-movement ops."""

from __future__ import annotations

import builtins

import numpy as np

from ...op_rules import Region, n_in, n_out
from ..registry import register
from ._util import ints, out_shape

OP_SET = "stablehlo"


@register(OP_SET, "stablehlo.reshape")
def reshape(ctx, operand):
    """Row-major reshape to the output shape (ModelFormatError when the
    sizes differ)."""
    shape = out_shape(ctx)
    if int(np.prod(shape)) != np.size(operand):
        raise ctx.error(f"cannot reshape {tuple(np.shape(operand))} to {tuple(shape)}")
    return np.reshape(np.asarray(operand), shape)


@register(OP_SET, "stablehlo.broadcast_in_dim")
def broadcast_in_dim(ctx, operand, *, broadcast_dimensions=()):
    """Place operand dim i at result dim ``broadcast_dimensions[i]``, then broadcast."""
    x = np.asarray(operand)
    shape = out_shape(ctx)
    dims = ints(broadcast_dimensions)
    order = np.argsort(dims)
    x = np.transpose(x, order) if x.ndim else x
    tmp = [1] * len(shape)
    for k, d in enumerate(sorted(dims)):
        tmp[d] = x.shape[k]
    return np.broadcast_to(x.reshape(tmp), shape).copy()


@register(OP_SET, "stablehlo.slice")
def slice(ctx, operand, *, start_indices=(), limit_indices=(), strides=None):  # noqa: A001
    """``operand[start:limit:stride]`` per dimension."""
    st, li = ints(start_indices), ints(limit_indices)
    sd = ints(strides) or (1,) * len(st)
    return np.asarray(operand)[tuple(builtins.slice(a, b, c) for a, b, c in zip(st, li, sd))]


@register(OP_SET, "stablehlo.concatenate")
def concatenate(ctx, *inputs, dimension=0):
    """Join along ``dimension``."""
    return np.concatenate([np.asarray(x) for x in inputs], axis=int(dimension))


@register(OP_SET, "stablehlo.iota")
def iota(ctx, *, iota_dimension=0):
    """Index along ``iota_dimension`` of the output shape."""
    shape = out_shape(ctx)
    d = int(iota_dimension)
    r = [1] * len(shape)
    r[d] = shape[d]
    return np.broadcast_to(np.arange(shape[d]).reshape(r), shape).astype(ctx.out_dtype(0))


@register(OP_SET, "stablehlo.gather")
def gather(ctx, operand, start_indices, *, offset_dims=(), collapsed_slice_dims=(), start_index_map=(),
           index_vector_dim=0, slice_sizes=(), indices_are_sorted=False, operand_batching_dims=(),
           start_indices_batching_dims=()):
    """The spec's per-element definition: batch index -> start index vector
    (clamped so the slice fits) + offset index -> operand element."""
    if ints(operand_batching_dims) or ints(start_indices_batching_dims):
        raise ctx.error("the reference does not implement gather batching dims")
    x, idx = np.asarray(operand), np.asarray(start_indices)
    od, cd, sim = ints(offset_dims), ints(collapsed_slice_dims), ints(start_index_map)
    ss = ints(slice_sizes)
    ivd = int(index_vector_dim)
    shape = out_shape(ctx)
    batch_dims = [d for d in range(len(shape)) if d not in od]
    kept = [d for d in range(x.ndim) if d not in cd]
    out = np.empty(shape, x.dtype)
    for oi in np.ndindex(*shape):
        bi = [oi[d] for d in batch_dims]
        if ivd < idx.ndim:
            sel = list(bi)
            sel.insert(ivd, builtins.slice(None))
            start = idx[tuple(sel)]
        else:
            start = np.array([idx[tuple(bi)]])
        full = [0] * x.ndim
        for k, d in enumerate(sim):
            full[d] = int(np.clip(int(start[k]), 0, x.shape[d] - ss[d]))
        for k, d in enumerate(kept):
            full[d] += oi[od[k]]
        out[oi] = x[tuple(full)]
    return out


@register(OP_SET, "stablehlo.pad")
def pad(ctx, operand, padding_value, *, edge_padding_low=(), edge_padding_high=(), interior_padding=()):
    """Interior cells between elements, then edge padding (negative crops)."""
    from ._util import pad_dilate

    x = np.asarray(operand)
    it = ints(interior_padding) or (0,) * x.ndim
    return pad_dilate(x, np.asarray(padding_value, x.dtype).reshape(()),
                      list(zip(ints(edge_padding_low), ints(edge_padding_high))), it)


@register(OP_SET, "stablehlo.transpose")
def transpose(ctx, operand, *, permutation=()):
    """Result dim ``i`` is operand dim ``permutation[i]``."""
    return np.transpose(np.asarray(operand), ints(permutation))


@register(OP_SET, "stablehlo.reverse")
def reverse(ctx, operand, *, dimensions=()):
    """Reverse along ``dimensions``."""
    return np.flip(np.asarray(operand), ints(dimensions)) if ints(dimensions) else np.asarray(operand)


def _clamped(start_indices, shape, sizes):
    return [builtins.min(builtins.max(int(np.asarray(i).reshape(())), 0), int(n) - int(s))
            for i, n, s in zip(start_indices, shape, sizes)]


@register(OP_SET, "stablehlo.dynamic_slice")
def dynamic_slice(ctx, operand, *start_indices, slice_sizes=()):
    """A ``slice_sizes`` block at the clamped start indices."""
    x = np.asarray(operand)
    sizes = ints(slice_sizes)
    st = _clamped(start_indices, x.shape, sizes)
    return x[tuple(builtins.slice(a, a + s) for a, s in zip(st, sizes))].copy()


@register(OP_SET, "stablehlo.dynamic_update_slice")
def dynamic_update_slice(ctx, operand, update, *start_indices):
    """``operand`` with ``update`` written at the clamped start indices."""
    x = np.array(operand, copy=True)
    u = np.asarray(update, x.dtype)
    st = _clamped(start_indices, x.shape, u.shape)
    x[tuple(builtins.slice(a, a + s) for a, s in zip(st, u.shape))] = u
    return x


@register(OP_SET, "stablehlo.scatter",
          regions={"update_computation": Region(lambda n: (2 * (n_in(n) - 1) // 2, n_out(n)), scalar=True)})
def scatter(ctx, *args, update_window_dims=(), inserted_window_dims=(), scatter_dims_to_operand_dims=(),
            index_vector_dim=0, indices_are_sorted=False, unique_indices=False, input_batching_dims=(),
            scatter_indices_batching_dims=(), update_computation=-1):
    """Per update element, in row-major order: the spec's ``result_index``
    (start index from the index vector, batching index, window index with
    zeros at inserted / batching dims); updates whose window does not lie
    wholly in bounds are skipped; the body ``update_computation(current...,
    update...)`` gives the new operand values."""
    n = (len(args) - 1) // 2
    outs = [np.array(a, copy=True) for a in args[:n]]
    idx = np.asarray(args[n])
    ups = [np.asarray(u) for u in args[n + 1:]]
    uwd, iwd = ints(update_window_dims), ints(inserted_window_dims)
    sdo, obd, sbd = ints(scatter_dims_to_operand_dims), ints(input_batching_dims), ints(scatter_indices_batching_dims)
    ivd = int(index_vector_dim)
    rank = outs[0].ndim
    usd = [d for d in range(ups[0].ndim) if d not in uwd]
    wop = [d for d in range(rank) if d not in iwd and d not in obd]
    wsize = [1] * rank
    for j, d in enumerate(wop):
        wsize[d] = ups[0].shape[uwd[j]]
    for ui in np.ndindex(*ups[0].shape):
        usi = [ui[d] for d in usd]
        if ivd < idx.ndim:
            sl = list(usi)
            sl.insert(ivd, builtins.slice(None))
            sv = idx[tuple(sl)]
        else:
            sv = np.asarray([idx[tuple(usi)]])
        base = [0] * rank
        for k, d in enumerate(sdo):
            base[d] += int(sv[k])
        for i, d in enumerate(obd):
            ds = sbd[i]
            base[d] += usi[ds if ds < ivd else ds - 1]
        if any(base[d] < 0 or base[d] + wsize[d] > outs[0].shape[d] for d in range(rank)):
            continue
        full = list(base)
        for j, d in enumerate(wop):
            full[d] += ui[uwd[j]]
        full = tuple(full)
        new = ctx.call_graph(int(update_computation), *[o[full] for o in outs], *[u[ui] for u in ups])
        for o, v in zip(outs, new):
            o[full] = np.asarray(v, o.dtype)
    return outs
