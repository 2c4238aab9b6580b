"""Array ops (numpy reference): tile, broadcast, shape, pack/unpack, split,
squeeze/expand, transpose, slice, reverse, mirror/constant pad, space/batch/
depth moves, matrix diagonals, dilate. Written from the TFLite kernels'
semantics with explicit index arithmetic where numpy has no one-liner.
"""

from __future__ import annotations

import numpy as np

from ..registry import register


def _ints(v):
    return [int(t) for t in np.asarray(v).reshape(-1)]


def _axis(ctx, a, rank):
    a = int(np.asarray(a).reshape(-1)[0])
    if not -rank <= a < max(rank, 1):
        raise ctx.error(f"axis {a} out of range for rank {rank}")
    return a % max(rank, 1)


@register("tflite", "TILE", static_inputs=(1,))
def TILE(ctx, x, multiples):
    """``np.tile``; one multiple per input dim (np.tile would prepend dims
    for a shorter ``multiples``: a malformed file, ModelFormatError)."""
    m = _ints(multiples)
    if len(m) != np.ndim(x):
        raise ctx.error(f"multiples has {len(m)} entries for a rank-{np.ndim(x)} input")
    return np.tile(x, m)


@register("tflite", "BROADCAST_TO", static_inputs=(1,))
def BROADCAST_TO(ctx, x, shape):
    """numpy broadcasting."""
    return np.broadcast_to(x, tuple(_ints(shape))).copy()


@register("tflite", "BROADCAST_ARGS", static_inputs=(0, 1))
def BROADCAST_ARGS(ctx, s0, s1):
    """Broadcast shape of two shape vectors."""
    return np.asarray(np.broadcast_shapes(tuple(_ints(s0)), tuple(_ints(s1))), ctx.out_dtype(0))


@register("tflite", "SHAPE")
def SHAPE(ctx, x, *, out_type=None):
    """Shape vector."""
    return np.asarray(np.shape(x), ctx.out_dtype(0))


@register("tflite", "RANK")
def RANK(ctx, x):
    """Rank scalar."""
    return np.asarray(np.ndim(x), ctx.out_dtype(0))


@register("tflite", "FILL", static_inputs=(0,))
def FILL(ctx, dims, value):
    """Constant tensor."""
    return np.full(tuple(_ints(dims)), np.asarray(value).reshape(()), ctx.out_dtype(0))


@register("tflite", "RANGE", static_inputs=(0, 1, 2))
def RANGE(ctx, start, limit, delta):
    """``np.arange`` semantics."""
    s, lim, d = (np.asarray(v).reshape(()).item() for v in (start, limit, delta))
    out = []
    v = s
    while (d > 0 and v < lim) or (d < 0 and v > lim):
        out.append(v)
        v = s + d * len(out)
    return np.asarray(out, ctx.out_dtype(0))


@register("tflite", "PACK")
def PACK(ctx, *xs, values_count=0, axis=0):
    """``np.stack``."""
    return np.stack(xs, axis=_axis(ctx, axis, np.ndim(xs[0]) + 1))


@register("tflite", "UNPACK")
def UNPACK(ctx, x, *, num=0, axis=0):
    """Split along ``axis`` dropping it."""
    a = _axis(ctx, axis, np.ndim(x))
    return [np.take(x, i, axis=a) for i in range(np.shape(x)[a])]


@register("tflite", "SPLIT", static_inputs=(0,))
def SPLIT(ctx, axis, x, *, num_splits=0):
    """Equal pieces."""
    return np.split(x, int(num_splits), axis=_axis(ctx, axis, np.ndim(x)))


@register("tflite", "SPLIT_V", static_inputs=(1, 2))
def SPLIT_V(ctx, x, size_splits, axis, *, num_splits=0):
    """Pieces of the given sizes (one -1 inferred)."""
    a = _axis(ctx, axis, np.ndim(x))
    sizes = _ints(size_splits)
    if -1 in sizes:
        sizes[sizes.index(-1)] = np.shape(x)[a] - sum(s for s in sizes if s != -1)
    return np.split(x, np.cumsum(sizes)[:-1], axis=a)


@register("tflite", "SQUEEZE")
def SQUEEZE(ctx, x, *, squeeze_dims=None):
    """Drop size-1 dims."""
    dims = _ints(squeeze_dims) if squeeze_dims is not None else []
    if not dims:
        return np.squeeze(x)
    return np.squeeze(x, axis=tuple(sorted({_axis(ctx, d, np.ndim(x)) for d in dims})))


@register("tflite", "EXPAND_DIMS", static_inputs=(1,))
def EXPAND_DIMS(ctx, x, axis):
    """Insert a size-1 dim."""
    return np.expand_dims(x, _axis(ctx, axis, np.ndim(x) + 1))


@register("tflite", "TRANSPOSE", static_inputs=(1,))
def TRANSPOSE(ctx, x, perm):
    """Permute dims."""
    return np.transpose(x, _ints(perm)).copy()


@register("tflite", "SLICE", static_inputs=(1, 2))
def SLICE(ctx, x, begin, size):
    """``x[b:b+s]`` per dim, -1 = to the end."""
    idx = tuple(slice(b, None if s == -1 else b + s) for b, s in zip(_ints(begin), _ints(size)))
    return np.asarray(x)[idx].copy()


@register("tflite", "REVERSE_V2", static_inputs=(1,))
def REVERSE_V2(ctx, x, axis):
    """``np.flip`` over the axes."""
    return np.flip(x, axis=tuple({_axis(ctx, a, np.ndim(x)) for a in _ints(axis)})).copy()


@register("tflite", "REVERSE_SEQUENCE")
def REVERSE_SEQUENCE(ctx, x, seq_lengths, *, seq_dim=0, batch_dim=0):
    """Reverse each batch entry's prefix of length ``seq_lengths[b]``."""
    x = np.asarray(x)
    out = x.copy()
    sd, bd = _axis(ctx, seq_dim, x.ndim), _axis(ctx, batch_dim, x.ndim)
    for b, n in enumerate(np.asarray(seq_lengths).reshape(-1)):
        n = int(n)
        src = [slice(None)] * x.ndim
        src[bd] = b
        src[sd] = slice(0, n)
        dst = list(src)
        out[tuple(dst)] = np.flip(x[tuple(src)], axis=sd - (1 if bd < sd else 0))
    return out


@register("tflite", "MIRROR_PAD", static_inputs=(1,))
def MIRROR_PAD(ctx, x, paddings, *, mode="REFLECT"):
    """``np.pad`` reflect/symmetric."""
    return np.pad(x, np.asarray(paddings).astype(int), mode="reflect" if mode == "REFLECT" else "symmetric")


@register("tflite", "PADV2", static_inputs=(1,))
def PADV2(ctx, x, paddings, constant_values=None):
    """Constant padding."""
    v = 0 if constant_values is None else np.asarray(constant_values).reshape(()).item()
    return np.pad(x, np.asarray(paddings).astype(int), constant_values=v)


@register("tflite", "SPACE_TO_DEPTH")
def SPACE_TO_DEPTH(ctx, x, *, block_size=0):
    """Explicit index loop over the block offsets."""
    b = int(block_size)
    n, h, w, c = np.shape(x)
    out = np.empty((n, h // b, w // b, b * b * c), np.asarray(x).dtype)
    for i in range(b):
        for j in range(b):
            out[..., (i * b + j) * c:(i * b + j + 1) * c] = np.asarray(x)[:, i::b, j::b, :]
    return out


@register("tflite", "SPACE_TO_BATCH_ND", static_inputs=(1, 2))
def SPACE_TO_BATCH_ND(ctx, x, block_shape, paddings):
    """Pad, then batch ``(offset index) * N + n`` holds the strided sub-grid."""
    x = np.asarray(x)
    bs = _ints(block_shape)
    m = len(bs)
    p = np.asarray(paddings).reshape(m, 2).astype(int).tolist()
    x = np.pad(x, [(0, 0)] + p + [(0, 0)] * (x.ndim - 1 - m))
    n = x.shape[0]
    outs = []
    for off in np.ndindex(*bs):
        idx = (slice(None),) + tuple(slice(o, None, b) for o, b in zip(off, bs))
        outs.append(x[idx])
    return np.concatenate(outs, axis=0) if n else np.stack(outs).reshape((0,) + outs[0].shape[1:])


@register("tflite", "BATCH_TO_SPACE_ND", static_inputs=(1, 2))
def BATCH_TO_SPACE_ND(ctx, x, block_shape, crops):
    """Scatter batch ``offset * N + n`` to the strided sub-grid, then crop."""
    x = np.asarray(x)
    bs = _ints(block_shape)
    m = len(bs)
    c = np.asarray(crops).reshape(m, 2).astype(int)
    n = x.shape[0] // int(np.prod(bs))
    sp = x.shape[1:1 + m]
    out = np.zeros((n,) + tuple(s * b for s, b in zip(sp, bs)) + x.shape[1 + m:], x.dtype)
    for k, off in enumerate(np.ndindex(*bs)):
        idx = (slice(None),) + tuple(slice(o, None, b) for o, b in zip(off, bs))
        out[idx] = x[k * n:(k + 1) * n]
    idx = (slice(None),) + tuple(slice(a, out.shape[1 + i] - e) for i, (a, e) in enumerate(c))
    return out[idx].copy()


@register("tflite", "MATRIX_DIAG")
def MATRIX_DIAG(ctx, d):
    """``[..., N] -> [..., N, N]`` diagonal matrices."""
    d = np.asarray(d)
    n = d.shape[-1]
    out = np.zeros(d.shape + (n,), d.dtype)
    for i in range(n):
        out[..., i, i] = d[..., i]
    return out


@register("tflite", "MATRIX_SET_DIAG")
def MATRIX_SET_DIAG(ctx, x, d):
    """Copy of ``x`` with the main diagonal replaced."""
    out = np.array(x, copy=True)
    for i in range(min(out.shape[-2:])):
        out[..., i, i] = np.asarray(d)[..., i]
    return out


@register("tflite", "DILATE", static_inputs=(1,))
def DILATE(ctx, x, dilations, padding_value):
    """Strided placement into a tensor filled with ``padding_value``."""
    x = np.asarray(x)
    d = _ints(dilations)
    shape = tuple((s - 1) * k + 1 if s else 0 for s, k in zip(x.shape, d))
    out = np.full(shape, np.asarray(padding_value).reshape(()), x.dtype)
    out[tuple(slice(None, None, k) for k in d)] = x
    return out
