"""StableHLO data-movement ops: reshape, broadcast_in_dim, slice,
concatenate, iota, gather."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import op_rules
from ...op_rules import Region, n_in, n_out
from . import _util
from ._util import ints, out_shape, register

OP_SET = "stablehlo"


@register(OP_SET, "stablehlo.reshape")
def reshape(ctx, operand):
    """``stablehlo.reshape``: row-major reshape to the output tensor's shape."""
    shape = out_shape(ctx, batch=np.shape(operand)[0] if np.ndim(operand) else None)
    if int(np.prod(shape)) != int(np.prod(np.shape(operand))):
        raise ctx.error(f"cannot reshape {tuple(np.shape(operand))} to {shape}")
    return operand.reshape(shape)


def _broadcast_in_dim_batch(node, carrying, batch) -> None:
    dims = op_rules.ints(node.attrs.get("broadcast_dimensions"))
    if not dims or dims[0] != 0:
        raise op_rules.refusal(node, f"moves the batch dimension (broadcast_dimensions {dims})")


@register(OP_SET, "stablehlo.broadcast_in_dim", batch=_broadcast_in_dim_batch)
def broadcast_in_dim(ctx, operand, *, broadcast_dimensions=()):
    """``stablehlo.broadcast_in_dim``: operand dim ``i`` becomes result dim
    ``broadcast_dimensions[i]`` (size equal or 1); result shape from the
    output tensor."""
    dims = ints(broadcast_dimensions)
    if len(dims) != np.ndim(operand):
        raise ctx.error(f"broadcast_dimensions {dims} do not match operand rank {np.ndim(operand)}")
    batch = np.shape(operand)[dims.index(0)] if 0 in dims else None
    return lax.broadcast_in_dim(operand, out_shape(ctx, batch=batch), dims)


def _slice_batch(node, carrying, batch) -> None:
    """slice: ``[0, 1)`` of the batch takes all of it (an int batch only)."""
    a = node.attrs
    st, li = op_rules.ints(a.get("start_indices")), op_rules.ints(a.get("limit_indices"))
    if not st or st[0] != 0 or li[0] != 1:
        raise op_rules.refusal(node, f"slices the batch dimension (start_indices {st}, limit_indices {li})")
    if batch is None:
        raise op_rules.refusal(node, "slices with static bounds; with batch_size=None its limit on the batch "
                               "dimension is unknown (load with an int batch_size)")
    node.attrs = dict(a, limit_indices=np.asarray([batch] + li[1:], np.int64),
                      strides=np.asarray([1] + (op_rules.ints(a.get("strides")) or [1] * len(st))[1:], np.int64))


@register(OP_SET, "stablehlo.slice", batch=_slice_batch)
def slice(ctx, operand, *, start_indices=(), limit_indices=(), strides=None):  # noqa: A001
    """``stablehlo.slice``: static strided slice ``[start, limit)``."""
    st, li = ints(start_indices), ints(limit_indices)
    sd = ints(strides) or (1,) * len(st)
    if not (len(st) == len(li) == len(sd) == np.ndim(operand)):
        raise ctx.error(f"start {st}, limit {li}, strides {sd} do not match operand rank {np.ndim(operand)}")
    return lax.slice(operand, st, li, sd)


@register(OP_SET, "stablehlo.concatenate", batch=_util.dimension_batch(0))
def concatenate(ctx, *inputs, dimension=0):
    """``stablehlo.concatenate``: joins the inputs along ``dimension``."""
    if not inputs:
        raise ctx.error("needs at least one input")
    return lax.concatenate([jnp.asarray(x) for x in inputs], int(dimension))


@register(OP_SET, "stablehlo.iota")
def iota(ctx, *, iota_dimension=0):
    """``stablehlo.iota``: ``0, 1, 2...`` along ``iota_dimension`` of the
    output tensor's shape and type."""
    shape = out_shape(ctx)
    d = int(iota_dimension)
    if not 0 <= d < len(shape):
        raise ctx.error(f"iota_dimension {d} out of range for shape {shape}")
    return lax.broadcasted_iota(ctx.out_dtype(0), shape, d)


@register(OP_SET, "stablehlo.gather", batch=_util.not_followed_batch)
def gather(ctx, operand, start_indices, *, offset_dims=(), collapsed_slice_dims=(), start_index_map=(),
           index_vector_dim=0, slice_sizes=(), indices_are_sorted=False, operand_batching_dims=(),
           start_indices_batching_dims=()):
    """``stablehlo.gather``: slices of ``slice_sizes`` starting at the index
    vectors of ``start_indices`` (along ``index_vector_dim``; equal to the
    rank means an implicit trailing 1), start indices clamped so each slice
    stays in bounds, as the spec says (``GatherScatterMode.CLIP``). The
    index vector dim is moved last (lax's convention), which keeps the order
    of the batch dims."""
    idx = start_indices
    ivd = int(index_vector_dim)
    nd = np.ndim(idx)
    if ivd == nd:
        idx = idx[..., None] if isinstance(idx, np.ndarray) else jnp.expand_dims(idx, -1)
    elif ivd != nd - 1:
        idx = jnp.moveaxis(idx, ivd, -1)
    sib = ints(start_indices_batching_dims)
    if sib:  # renumber for the moved index-vector dim
        sib = tuple(d - 1 if ivd < nd and d > ivd else d for d in sib)
    dn = lax.GatherDimensionNumbers(
        offset_dims=ints(offset_dims), collapsed_slice_dims=ints(collapsed_slice_dims),
        start_index_map=ints(start_index_map), operand_batching_dims=ints(operand_batching_dims),
        start_indices_batching_dims=sib,
    )
    return lax.gather(operand, jnp.asarray(idx), dn, ints(slice_sizes), indices_are_sorted=bool(indices_are_sorted),
                      mode=lax.GatherScatterMode.CLIP)


def _pad_batch(node, carrying, batch) -> None:
    a = node.attrs
    for key in ("edge_padding_low", "edge_padding_high", "interior_padding"):
        if (op_rules.ints(a.get(key))[:1] or [0])[0] != 0:
            raise op_rules.refusal(node, f"pads the batch dimension ({key} {op_rules.ints(a.get(key))})")


@register(OP_SET, "stablehlo.pad", batch=_pad_batch)
def pad(ctx, operand, padding_value, *, edge_padding_low=(), edge_padding_high=(), interior_padding=()):
    """``stablehlo.pad``: ``interior_padding`` cells between elements, then
    low/high edge padding (negative values crop), filled with the scalar
    ``padding_value`` (``lax.pad``)."""
    rank = np.ndim(operand)
    lo, hi, it = ints(edge_padding_low), ints(edge_padding_high), ints(interior_padding) or (0,) * rank
    if not (len(lo) == len(hi) == len(it) == rank):
        raise ctx.error(f"padding {lo} / {hi} / {it} does not match operand rank {rank}")
    if any(i < 0 for i in it):
        raise ctx.error(f"interior_padding {it} is negative")
    x = jnp.asarray(operand)
    return lax.pad(x, jnp.asarray(padding_value, x.dtype).reshape(()), list(zip(lo, hi, it)))


def _transpose_batch(node, carrying, batch) -> None:
    perm = op_rules.ints(node.attrs.get("permutation"))
    if perm and perm[0] != 0:
        raise op_rules.refusal(node, f"moves the batch dimension (permutation {perm})")


@register(OP_SET, "stablehlo.transpose", batch=_transpose_batch)
def transpose(ctx, operand, *, permutation=()):
    """``stablehlo.transpose``: result dim ``i`` is operand dim ``permutation[i]``."""
    perm = ints(permutation)
    if sorted(perm) != list(range(np.ndim(operand))):
        raise ctx.error(f"permutation {perm} is not a permutation of the operand's {np.ndim(operand)} dims")
    return lax.transpose(operand, perm)


@register(OP_SET, "stablehlo.reverse", batch=_util.dimensions_batch)
def reverse(ctx, operand, *, dimensions=()):
    """``stablehlo.reverse``: reverses the element order along ``dimensions``."""
    dims = ints(dimensions)
    if any(not 0 <= d < np.ndim(operand) for d in dims):
        raise ctx.error(f"dimensions {dims} out of range for rank {np.ndim(operand)}")
    return lax.rev(operand, dims)


def _start(ctx, indices, shape, sizes):
    """Scalar start indices clamped to ``[0, shape - size]`` as int32 (the
    spec's clamping for dynamic_slice / dynamic_update_slice)."""
    if len(indices) != len(shape):
        raise ctx.error(f"{len(indices)} start indices for an operand of rank {len(shape)}")
    out = []
    for i, n, s in zip(indices, shape, sizes):
        i = jnp.asarray(i).reshape(())
        hi = max(int(n) - int(s), 0)
        if np.issubdtype(np.dtype(i.dtype), np.unsignedinteger):
            i = jnp.minimum(i, jnp.asarray(hi, i.dtype))
        else:
            i = jnp.clip(i, 0, jnp.asarray(hi).astype(i.dtype) if hi <= np.iinfo(np.dtype(i.dtype)).max else None)
        out.append(i.astype(jnp.int32))
    return out


@register(OP_SET, "stablehlo.dynamic_slice", batch=_util.not_followed_batch)
def dynamic_slice(ctx, operand, *start_indices, slice_sizes=()):
    """``stablehlo.dynamic_slice``: a ``slice_sizes`` block at the scalar
    ``start_indices``, each clamped to ``[0, dim - size]``."""
    sizes = ints(slice_sizes)
    x = jnp.asarray(operand)
    if len(sizes) != x.ndim or any(s > n for s, n in zip(sizes, x.shape)):
        raise ctx.error(f"slice_sizes {sizes} do not fit operand shape {x.shape}")
    return lax.dynamic_slice(x, _start(ctx, start_indices, x.shape, sizes), sizes)


@register(OP_SET, "stablehlo.dynamic_update_slice", batch=_util.not_followed_batch)
def dynamic_update_slice(ctx, operand, update, *start_indices):
    """``stablehlo.dynamic_update_slice``: ``operand`` with ``update``
    written at the scalar ``start_indices`` (clamped so it fits)."""
    x, u = jnp.asarray(operand), jnp.asarray(update)
    if u.ndim != x.ndim or any(a > b for a, b in zip(u.shape, x.shape)):
        raise ctx.error(f"update of shape {u.shape} does not fit operand {x.shape}")
    return lax.dynamic_update_slice(x, u.astype(x.dtype), _start(ctx, start_indices, x.shape, u.shape))


def scatter_indices_of(operand_shape, updates_shape, indices, *, update_window_dims, inserted_window_dims,
                       scatter_dims_to_operand_dims, index_vector_dim, input_batching_dims=(),
                       scatter_indices_batching_dims=(), xp=jnp):
    """Full operand index of every update element (the spec's
    ``result_index``): a tuple, one integer array of ``updates_shape`` per
    operand dim, and a mask of the elements whose whole update window lies in
    bounds (XLA skips the others, window by window)."""
    rank = len(operand_shape)
    uwd, iwd = tuple(update_window_dims), tuple(inserted_window_dims)
    sdo, obd, sbd = tuple(scatter_dims_to_operand_dims), tuple(input_batching_dims), tuple(scatter_indices_batching_dims)
    usd = [d for d in range(len(updates_shape)) if d not in uwd]
    idx = xp.asarray(indices)
    ivd = int(index_vector_dim)
    if ivd == idx.ndim:
        idx = idx[..., None]
    else:
        idx = xp.moveaxis(idx, ivd, -1)
    # int64 where the arrays hold it (numpy, or JAX with x64 on), else JAX's int32 (asking jnp for int64
    # there truncates with a warning on every trace)
    it = np.int64 if xp is np else jax.dtypes.canonicalize_dtype(np.int64)
    idx = idx.astype(it)
    grids = [xp.broadcast_to(xp.arange(n, dtype=it).reshape([-1 if k == d else 1 for k in range(len(updates_shape))]),
                             updates_shape) for d, n in enumerate(updates_shape)]
    start = idx[tuple(grids[d] for d in usd)] if usd else xp.broadcast_to(idx, tuple(updates_shape) + idx.shape[-1:])
    zero = xp.zeros(tuple(updates_shape), it)
    base = [zero] * rank
    for k, d in enumerate(sdo):
        base[d] = base[d] + start[..., k]
    for i, d in enumerate(obd):
        ds = int(sbd[i])
        pos = ds if ds < ivd else ds - 1
        base[d] = base[d] + grids[usd[pos]]
    wop = [d for d in range(rank) if d not in iwd and d not in obd]
    wsize = [1] * rank
    full = list(base)
    for j, d in enumerate(wop):
        full[d] = full[d] + grids[uwd[j]]
        wsize[d] = int(updates_shape[uwd[j]])
    ok = xp.ones(tuple(updates_shape), bool)
    for d in range(rank):
        ok = ok & (base[d] >= 0) & (base[d] + wsize[d] <= int(operand_shape[d]))
    return tuple(full), ok


_SCATTER_MONOIDS = {"stablehlo.add": "add", "stablehlo.multiply": "multiply", "stablehlo.maximum": "max",
                    "stablehlo.minimum": "min"}


def _scatter_kind(model, index: int, n: int):
    """``"set"`` for a body returning its update argument, the ``.at`` method
    for a single-monoid body, else None (general body)."""
    from .reduce import monoid_of

    if n != 1 or not 0 <= index < len(model.graphs):
        return None
    g = model.graphs[index]
    if len(g.inputs) == 2 and len(g.outputs) == 1 and not g.nodes and g.outputs[0] is g.inputs[1]:
        return "set"
    m = monoid_of(model, index, 1)
    return _SCATTER_MONOIDS.get(m)


@register(OP_SET, "stablehlo.scatter",
          regions={"update_computation": Region(lambda n: (2 * (n_in(n) - 1) // 2, n_out(n)), scalar=True)},
          batch=_util.not_followed_batch)
def scatter(ctx, *args, update_window_dims=(), inserted_window_dims=(), scatter_dims_to_operand_dims=(),
            index_vector_dim=0, indices_are_sorted=False, unique_indices=False, input_batching_dims=(),
            scatter_indices_batching_dims=(), update_computation=-1):
    """``stablehlo.scatter``: N operands, the scatter indices, N updates.

    Each update element goes to the operand element the spec's index
    arithmetic names (``scatter_dims_to_operand_dims``, inserted window and
    batching dims); update windows not wholly in bounds are skipped (XLA's
    behaviour, implementation-defined in the spec). A body returning its
    update argument becomes ``.at[].set``, a single add / multiply / maximum /
    minimum body the matching ``.at[]`` scatter (the order of combining
    duplicates is unspecified, as in the spec); any other body runs element
    by element in row-major update order (``lax.fori_loop``).

    Raises:
        ModelFormatError: the operand / update counts do not match.
    """
    if len(args) < 3 or len(args) % 2 == 0:
        raise ctx.error(f"takes N operands, the indices and N updates, got {len(args)} inputs")
    n = (len(args) - 1) // 2
    operands = [jnp.asarray(a) for a in args[:n]]
    updates = [jnp.asarray(u).astype(o.dtype) for u, o in zip(args[n + 1:], operands)]
    full, ok = scatter_indices_of(
        operands[0].shape, updates[0].shape, args[n], update_window_dims=ints(update_window_dims),
        inserted_window_dims=ints(inserted_window_dims), scatter_dims_to_operand_dims=ints(scatter_dims_to_operand_dims),
        index_vector_dim=int(index_vector_dim), input_batching_dims=ints(input_batching_dims),
        scatter_indices_batching_dims=ints(scatter_indices_batching_dims))
    kind = _scatter_kind(ctx.model, int(update_computation), n)
    if kind is not None and not (kind != "set" and operands[0].dtype == jnp.bool_):
        # out-of-bounds windows get an index past the end: dropped
        idx = tuple(jnp.where(ok, f, operands[0].shape[d]) for d, f in enumerate(full))
        ref = operands[0].at[idx]
        fn = getattr(ref, kind)
        return fn(updates[0], mode="drop", indices_are_sorted=bool(indices_are_sorted),
                  unique_indices=bool(unique_indices))
    flat = [f.reshape(-1) for f in full]
    okf = ok.reshape(-1)
    ups = [u.reshape(-1) for u in updates]
    comp = int(update_computation)

    def step(k, ops):
        where = tuple(jnp.clip(f[k], 0, max(int(s) - 1, 0)) for f, s in zip(flat, operands[0].shape))
        cur = [o[where] for o in ops]
        new = ctx.call_graph(comp, *cur, *[u[k] for u in ups])
        return tuple(o.at[where].set(jnp.where(okf[k], jnp.asarray(v, o.dtype).reshape(()), c))
                     for o, v, c in zip(ops, new, cur))

    if okf.shape[0] == 0:
        return operands
    return list(lax.fori_loop(0, okf.shape[0], step, tuple(operands)))
