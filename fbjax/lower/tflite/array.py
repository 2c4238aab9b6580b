"""TFLite array ops: tiling, broadcasting, shapes, packing, splitting,
transposes, slices, reversals, paddings, space/batch/depth rearrangements,
diagonals and dilation, float and integer tensors alike.

Shape-like inputs (multiples, perms, axes, paddings, block shapes, sizes) are
``static_inputs``: they arrive as numpy arrays at trace time, as in models
from the converter where they are constants or computed from static shapes.
Reference kernels: TFLite ``kernels/tile.cc``, ``broadcast_to.cc``,
``broadcast_args.cc``, ``shape.cc``, ``rank.cc``, ``fill.cc``, ``range.cc``,
``pack.cc``, ``unpack.cc``, ``split.cc``, ``split_v.cc``, ``squeeze.cc``,
``expand_dims.cc``, ``transpose.cc``, ``slice.cc``, ``reverse.cc``,
``reverse_sequence.cc``, ``mirror_pad.cc``, ``pad.cc``, ``space_to_depth.cc``,
``batch_to_space_nd.cc``, ``space_to_batch_nd.cc``, ``matrix_diag.cc``,
``matrix_set_diag.cc``, ``dilate.cc``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import op_rules
from ..registry import register


def _ints(v):
    return [int(t) for t in np.asarray(v).reshape(-1)]


def _axis(ctx, a, rank):
    a = int(np.asarray(a).reshape(-1)[0]) if np.ndim(a) else int(a)
    if not -rank <= a < max(rank, 1):
        raise ctx.error(f"axis {a} out of range for rank {rank}")
    return a % max(rank, 1)


@register("tflite", "TILE", static_inputs=(1,), int_passthrough=True)
def TILE(ctx, x, multiples):
    """TFLite TILE: repeat ``x`` ``multiples[i]`` times along dim ``i``."""
    m = _ints(multiples)
    if len(m) != jnp.ndim(x):
        raise ctx.error(f"multiples has {len(m)} entries for a rank-{jnp.ndim(x)} input")
    return jnp.tile(x, m)


@register("tflite", "BROADCAST_TO", static_inputs=(1,), int_passthrough=True)
def BROADCAST_TO(ctx, x, shape):
    """TFLite BROADCAST_TO: numpy broadcasting to the static ``shape``."""
    try:
        return jnp.broadcast_to(x, tuple(_ints(shape)))
    except ValueError as e:
        raise ctx.error(str(e)) from None


@register("tflite", "BROADCAST_ARGS", static_inputs=(0, 1))
def BROADCAST_ARGS(ctx, s0, s1):
    """TFLite BROADCAST_ARGS: the broadcast shape of two shape vectors."""
    try:
        out = np.broadcast_shapes(tuple(_ints(s0)), tuple(_ints(s1)))
    except ValueError as e:
        raise ctx.error(str(e)) from None
    return np.asarray(out, ctx.out_dtype(0))


@register("tflite", "SHAPE", int_passthrough=True, shape_only=True)
def SHAPE(ctx, x, *, out_type=None):
    """TFLite SHAPE: the input's shape as a 1-D ``out_type`` vector (static)."""
    return np.asarray(jnp.shape(x), ctx.out_dtype(0))


@register("tflite", "RANK", shape_only=True)
def RANK(ctx, x):
    """TFLite RANK: the input's rank as an int32 scalar (static)."""
    return np.asarray(jnp.ndim(x), ctx.out_dtype(0))


@register("tflite", "FILL", static_inputs=(0,))
def FILL(ctx, dims, value):
    """TFLite FILL: a tensor of shape ``dims`` filled with scalar ``value``."""
    return jnp.full(tuple(_ints(dims)), jnp.reshape(jnp.asarray(value), ()), ctx.out_dtype(0))


@register("tflite", "RANGE", static_inputs=(0, 1, 2))
def RANGE(ctx, start, limit, delta):
    """TFLite RANGE: ``start, start + delta, ...`` up to (excluding) ``limit``."""
    d = np.asarray(delta).reshape(())
    if d == 0:
        raise ctx.error("delta is 0")
    dt = ctx.out_dtype(0)
    s, lim = np.asarray(start).reshape(()), np.asarray(limit).reshape(())
    if not all(np.isfinite(float(v)) for v in (s, lim, d)):
        raise ctx.error(f"start {s}, limit {lim} and delta {d} must be finite")
    n = int(np.ceil(np.abs((lim - s) / d))) if np.issubdtype(dt, np.floating) else \
        int(-(-abs(int(lim) - int(s)) // abs(int(d))))
    ctx.check_size((max(n, 0),), dt)
    return (s + d * np.arange(max(n, 0))).astype(dt)


@register("tflite", "PACK", int_passthrough=True, batch=op_rules.axis_not_batch())
def PACK(ctx, *xs, values_count=0, axis=0):
    """TFLite PACK: stack the inputs along a new ``axis``."""
    return jnp.stack([jnp.asarray(x) for x in xs], axis=_axis(ctx, axis, jnp.ndim(xs[0]) + 1))


@register("tflite", "UNPACK", int_passthrough=True, batch=op_rules.axis_not_batch())
def UNPACK(ctx, x, *, num=0, axis=0):
    """TFLite UNPACK: split along ``axis`` into ``num`` tensors, dropping it."""
    x = jnp.asarray(x)
    a = _axis(ctx, axis, x.ndim)
    return [lax.index_in_dim(x, i, a, keepdims=False) for i in range(x.shape[a])]


def _split_batch(node, carrying, batch) -> None:
    """SPLIT (axis, x): the constant axis is not 0."""
    op_rules.refuse_axis0(node, op_rules.const(node.inputs[0]), op_rules.rank(node.inputs[1]))


@register("tflite", "SPLIT", static_inputs=(0,), int_passthrough=True, batch=_split_batch)
def SPLIT(ctx, axis, x, *, num_splits=0):
    """TFLite SPLIT (axis first): ``num_splits`` equal pieces along ``axis``."""
    x = jnp.asarray(x)
    a = _axis(ctx, axis, x.ndim)
    if int(num_splits) < 1 or x.shape[a] % int(num_splits):
        raise ctx.error(f"cannot split dim of size {x.shape[a]} into {num_splits} equal parts")
    return jnp.split(x, int(num_splits), axis=a)


def _split_v_batch(node, carrying, batch) -> None:
    """SPLIT_V (x, sizes, axis): the constant axis is not 0."""
    op_rules.refuse_axis0(node, op_rules.const(node.inputs[2]), op_rules.rank(node.inputs[0] if node.inputs else None))


@register("tflite", "SPLIT_V", static_inputs=(1, 2), int_passthrough=True, batch=_split_v_batch)
def SPLIT_V(ctx, x, size_splits, axis, *, num_splits=0):
    """TFLite SPLIT_V: pieces of ``size_splits`` along ``axis`` (one -1 inferred)."""
    x = jnp.asarray(x)
    a = _axis(ctx, axis, x.ndim)
    sizes = _ints(size_splits)
    if sizes.count(-1) == 1:
        sizes[sizes.index(-1)] = x.shape[a] - (sum(sizes) + 1)
    if sum(sizes) != x.shape[a] or min(sizes) < 0:
        raise ctx.error(f"size_splits {sizes} do not add up to {x.shape[a]}")
    return jnp.split(x, np.cumsum(sizes)[:-1].tolist(), axis=a)


@register("tflite", "SQUEEZE", int_passthrough=True)
def SQUEEZE(ctx, x, *, squeeze_dims=None):
    """TFLite SQUEEZE: drop the listed size-1 dims (all size-1 dims if none)."""
    x = jnp.asarray(x)
    dims = _ints(squeeze_dims) if squeeze_dims is not None else []
    if not dims:
        dims = [i for i, d in enumerate(x.shape) if d == 1]
    dims = sorted({_axis(ctx, d, x.ndim) for d in dims})
    if any(x.shape[d] != 1 for d in dims):
        raise ctx.error(f"squeeze_dims {dims} are not all size 1 in shape {x.shape}")
    return lax.squeeze(x, dims)


@register("tflite", "EXPAND_DIMS", static_inputs=(1,), int_passthrough=True)
def EXPAND_DIMS(ctx, x, axis):
    """TFLite EXPAND_DIMS: insert a size-1 dim at ``axis`` (negative from the end)."""
    return jnp.expand_dims(x, _axis(ctx, axis, jnp.ndim(x) + 1))


def _transpose_batch(node, carrying, batch) -> None:
    """TRANSPOSE: dimension 0 must stay first."""
    perm = op_rules.const(node.inputs[1])
    if perm is None or int(np.asarray(perm).reshape(-1)[0]) != 0:
        raise op_rules.refusal(node, f"moves the batch dimension (perm {None if perm is None else perm.tolist()})")


@register("tflite", "TRANSPOSE", static_inputs=(1,), int_passthrough=True, batch=_transpose_batch)
def TRANSPOSE(ctx, x, perm):
    """TFLite TRANSPOSE: permute dims by ``perm``."""
    p = _ints(perm)
    if sorted(p) != list(range(jnp.ndim(x))):
        raise ctx.error(f"perm {p} is not a permutation of {jnp.ndim(x)} dims")
    return jnp.transpose(x, p)


def _slice_batch(node, carrying, batch) -> None:
    """SLICE: taking ``[0, 1)`` of the batch dimension takes all of it."""
    ins = node.inputs
    begin, size = op_rules.const(ins[1]), op_rules.const(ins[2])
    if begin is None or size is None:
        raise op_rules.refusal(node, "has computed begin/size")
    if int(begin[0]) != 0 or int(size[0]) not in (1, -1):
        raise op_rules.refusal(node, f"slices the batch dimension (begin {begin.tolist()}, size {size.tolist()})")
    new = size.copy()
    new[0] = -1
    ins[2] = op_rules.new_const(ins[2], new)


@register("tflite", "SLICE", static_inputs=(2,), int_passthrough=True, batch=_slice_batch)
def SLICE(ctx, x, begin, size):
    """TFLite SLICE: ``x[begin : begin + size]`` per dim; size -1 = to the end.
    ``size`` must be static; a ``begin`` computed at run time (e.g. from a
    loop counter) becomes ``lax.dynamic_slice``, which clamps like XLA."""
    x = jnp.asarray(x)
    s = _ints(size)
    if len(s) != x.ndim:
        raise ctx.error(f"size {s} does not match rank {x.ndim}")
    if not isinstance(begin, np.ndarray):
        if -1 in s:
            raise ctx.error("size -1 needs a static begin")
        b = jnp.asarray(begin).reshape(-1)
        return lax.dynamic_slice(x, [b[i] for i in range(x.ndim)], s)
    b = _ints(begin)
    end = [n if sz == -1 else bb + sz for bb, sz, n in zip(b, s, x.shape)]
    if len(b) != x.ndim or any(bb < 0 or e > n or e < bb for bb, e, n in zip(b, end, x.shape)):
        raise ctx.error(f"slice begin {b} size {s} is outside shape {x.shape}")
    return lax.slice(x, b, end)


@register("tflite", "REVERSE_V2", static_inputs=(1,), int_passthrough=True, batch=op_rules.axis_not_batch())
def REVERSE_V2(ctx, x, axis):
    """TFLite REVERSE_V2: reverse along the listed axes."""
    return lax.rev(jnp.asarray(x), sorted({_axis(ctx, a, jnp.ndim(x)) for a in _ints(axis)}))


@register("tflite", "REVERSE_SEQUENCE")
def REVERSE_SEQUENCE(ctx, x, seq_lengths, *, seq_dim=0, batch_dim=0):
    """TFLite REVERSE_SEQUENCE: for each batch ``b``, reverse the first
    ``seq_lengths[b]`` elements along ``seq_dim``."""
    x = jnp.asarray(x)
    sd, bd = _axis(ctx, seq_dim, x.ndim), _axis(ctx, batch_dim, x.ndim)
    n = x.shape[sd]
    i = jnp.arange(n)
    shape = [1] * x.ndim
    shape[sd] = n
    i = i.reshape(shape)
    lshape = [1] * x.ndim
    lshape[bd] = x.shape[bd]
    L = jnp.asarray(seq_lengths).reshape(lshape).astype(jnp.int32)
    idx = jnp.where(i < L, L - 1 - i, i)
    idx = jnp.broadcast_to(idx, x.shape)
    return jnp.take_along_axis(x, idx, axis=sd)


@register("tflite", "MIRROR_PAD", static_inputs=(1,))
def MIRROR_PAD(ctx, x, paddings, *, mode="REFLECT"):
    """TFLite MIRROR_PAD: REFLECT (edge not repeated) or SYMMETRIC."""
    p = np.asarray(paddings).reshape(-1, 2).astype(int).tolist()
    return jnp.pad(x, p, mode="reflect" if mode == "REFLECT" else "symmetric")


@register("tflite", "PADV2", static_inputs=(1,))
def PADV2(ctx, x, paddings, constant_values=None):
    """TFLite PADV2: constant padding with ``constant_values`` (default 0)."""
    x = jnp.asarray(x)
    p = np.asarray(paddings).reshape(-1, 2).astype(int)
    v = jnp.zeros((), x.dtype) if constant_values is None else jnp.reshape(constant_values, ()).astype(x.dtype)
    return lax.pad(x, v, [(int(a), int(b), 0) for a, b in p])


@register("tflite", "SPACE_TO_DEPTH", int_passthrough=True)
def SPACE_TO_DEPTH(ctx, x, *, block_size=0):
    """TFLite SPACE_TO_DEPTH, NHWC: ``out[n, h, w, (i*b + j)*C + c] = in[n, h*b+i, w*b+j, c]``."""
    b = int(block_size)
    n, h, w, c = x.shape
    if b < 1 or h % b or w % b:
        raise ctx.error(f"block_size {b} does not divide {h}x{w}")
    y = jnp.reshape(x, (n, h // b, b, w // b, b, c)).transpose(0, 1, 3, 2, 4, 5)
    return y.reshape(n, h // b, w // b, b * b * c)


@register("tflite", "SPACE_TO_BATCH_ND", static_inputs=(1, 2), int_passthrough=True)
def SPACE_TO_BATCH_ND(ctx, x, block_shape, paddings):
    """TFLite SPACE_TO_BATCH_ND: zero-pad the spatial dims, then move
    ``block_shape`` blocks into the batch (batch index = block offset * N + n)."""
    x = jnp.asarray(x)
    bs = _ints(block_shape)
    m = len(bs)
    p = np.asarray(paddings).reshape(m, 2).astype(int)
    cfg = [(0, 0, 0)] + [(int(a), int(b), 0) for a, b in p] + [(0, 0, 0)] * (x.ndim - 1 - m)
    x = lax.pad(x, jnp.zeros((), x.dtype), cfg)
    n = x.shape[0]
    sp = x.shape[1:1 + m]
    rest = x.shape[1 + m:]
    if any(s % b for s, b in zip(sp, bs)):
        raise ctx.error(f"padded spatial shape {sp} is not divisible by block_shape {bs}")
    shape = [n]
    for s, b in zip(sp, bs):
        shape += [s // b, b]
    y = x.reshape(shape + list(rest))
    perm = [2 + 2 * i for i in range(m)] + [0] + [1 + 2 * i for i in range(m)] + \
        list(range(1 + 2 * m, 1 + 2 * m + len(rest)))
    y = y.transpose(perm)
    return y.reshape([n * int(np.prod(bs))] + [s // b for s, b in zip(sp, bs)] + list(rest))


@register("tflite", "BATCH_TO_SPACE_ND", static_inputs=(1, 2), int_passthrough=True)
def BATCH_TO_SPACE_ND(ctx, x, block_shape, crops):
    """TFLite BATCH_TO_SPACE_ND: inverse of SPACE_TO_BATCH_ND, then crop."""
    x = jnp.asarray(x)
    bs = _ints(block_shape)
    m = len(bs)
    c = np.asarray(crops).reshape(m, 2).astype(int)
    nb = x.shape[0]
    prod = int(np.prod(bs))
    if nb % prod:
        raise ctx.error(f"batch {nb} is not divisible by prod(block_shape) = {prod}")
    n = nb // prod
    sp = x.shape[1:1 + m]
    rest = x.shape[1 + m:]
    y = x.reshape(bs + [n] + list(sp) + list(rest))
    perm = [m]
    for i in range(m):
        perm += [m + 1 + i, i]
    perm += list(range(2 * m + 1, 2 * m + 1 + len(rest)))
    y = y.transpose(perm).reshape([n] + [s * b for s, b in zip(sp, bs)] + list(rest))
    start = [0] + [int(a) for a, _ in c] + [0] * len(rest)
    end = [n] + [s * b - int(e) for (s, b), (_, e) in zip(zip(sp, bs), c)] + list(rest)
    return lax.slice(y, start, end)


@register("tflite", "MATRIX_DIAG")
def MATRIX_DIAG(ctx, d):
    """TFLite MATRIX_DIAG: ``[..., N] -> [..., N, N]`` with ``d`` on the diagonal."""
    d = jnp.asarray(d)
    n = d.shape[-1]
    return d[..., :, None] * jnp.eye(n, dtype=d.dtype) if d.dtype != jnp.bool_ else \
        jnp.where(jnp.eye(n, dtype=bool), d[..., :, None], False)


@register("tflite", "MATRIX_SET_DIAG")
def MATRIX_SET_DIAG(ctx, x, d):
    """TFLite MATRIX_SET_DIAG: replace the main diagonal of the last two dims
    of ``x`` (``[..., M, N]``) by ``d`` (``[..., min(M, N)]``)."""
    x = jnp.asarray(x)
    m, n = x.shape[-2:]
    k = min(m, n)
    mask = jnp.eye(m, n, dtype=bool)
    dd = jnp.zeros(x.shape[:-2] + (m, n), x.dtype)
    i = jnp.arange(k)
    dd = dd.at[..., i, i].set(jnp.asarray(d, x.dtype))
    return jnp.where(mask, dd, x)


@register("tflite", "DILATE", static_inputs=(1,))
def DILATE(ctx, x, dilations, padding_value):
    """TFLite DILATE: insert ``dilations[i] - 1`` copies of ``padding_value``
    between neighbouring elements along each dim."""
    x = jnp.asarray(x)
    d = _ints(dilations)
    if len(d) != x.ndim or min(d, default=1) < 1:
        raise ctx.error(f"dilations {d} must be >= 1, one per dim of rank {x.ndim}")
    v = jnp.reshape(jnp.asarray(padding_value), ()).astype(x.dtype)
    return lax.pad(x, v, [(0, 0, k - 1) for k in d])
