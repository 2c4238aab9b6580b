"""numpy twins of :mod:`fbjax.lower.onnx.shape`."""

from __future__ import annotations

import numpy as np

from ... import op_rules
from ..registry import register
from ._util import OP_SET, axis as norm_axis, ints, out


@register(OP_SET, "Shape", out_dtype=op_rules.int32_out)
def Shape(ctx, data, *, start=None, end=None):
    """numpy ONNX ``Shape`` (int32, optional clamped ``[start:end]``)."""
    shp = list(np.shape(data))
    r = len(shp)
    s = 0 if start is None else int(start)
    e = r if end is None else int(end)
    s = min(max(s + r if s < 0 else s, 0), r)
    e = min(max(e + r if e < 0 else e, 0), r)
    return out(ctx, np.array(shp[s:e], np.int32))


@register(OP_SET, "Size", out_dtype=op_rules.int32_out)
def Size(ctx, data):
    """numpy ONNX ``Size``."""
    return out(ctx, np.int32(np.size(data)))


@register(OP_SET, "Reshape")
def Reshape(ctx, data, shape, *, allow_zero=False):
    """numpy ONNX ``Reshape`` (0 copies unless ``allow_zero``; one -1
    inferred); ModelFormatError for a shape the input cannot take."""
    x = np.asarray(data)
    tgt = [x.shape[i] if (d == 0 and not allow_zero) else d for i, d in enumerate(ints(shape))]
    known = int(np.prod([d for d in tgt if d != -1]))
    if tgt.count(-1) > 1 or (-1 in tgt and (known == 0 or x.size % known)) or (-1 not in tgt and known != x.size):
        raise ctx.error(f"cannot reshape {x.shape} to {ints(shape)}")
    return out(ctx, x.reshape(tgt))


@register(OP_SET, "Flatten")
def Flatten(ctx, input, *, axis=0):
    """numpy ONNX ``Flatten``."""
    x = np.asarray(input)
    a = int(axis) + x.ndim if int(axis) < 0 else int(axis)
    return out(ctx, x.reshape(int(np.prod(x.shape[:a])), -1) if x.size else x.reshape(
        int(np.prod(x.shape[:a])), int(np.prod(x.shape[a:]))))


@register(OP_SET, "Squeeze")
def Squeeze(ctx, data, axes=None):
    """numpy ONNX ``Squeeze``."""
    x = np.asarray(data)
    return out(ctx, np.squeeze(x) if axes is None else np.squeeze(x, tuple(norm_axis(a, x.ndim) for a in ints(axes))))


@register(OP_SET, "Unsqueeze")
def Unsqueeze(ctx, data, axes):
    """numpy ONNX ``Unsqueeze``."""
    x = np.asarray(data)
    r = x.ndim + len(ints(axes))
    return out(ctx, np.expand_dims(x, tuple(sorted(norm_axis(a, r) for a in ints(axes)))))


@register(OP_SET, "Transpose")
def Transpose(ctx, data, *, perm=None):
    """numpy ONNX ``Transpose``."""
    return out(ctx, np.transpose(data, None if not perm else tuple(perm)))


@register(OP_SET, "Concat")
def Concat(ctx, *inputs, axis=0):
    """numpy ONNX ``Concat``."""
    xs = [np.asarray(x) for x in inputs if x is not None]
    return out(ctx, np.concatenate(xs, axis=norm_axis(axis, xs[0].ndim)))


@register(OP_SET, "Split")
def Split(ctx, input, split=None, *, axis=0, num_outputs=None):
    """numpy ONNX ``Split``."""
    x = np.asarray(input)
    a = norm_axis(axis, x.ndim)
    n = x.shape[a]
    if split is not None and np.size(split):
        sizes = ints(split)
    else:
        parts = int(num_outputs) if num_outputs else len(ctx.outputs)
        c = -(-n // parts)
        sizes = [min(c, n - i * c) for i in range(parts)]
    return [out(ctx, p, i) for i, p in enumerate(np.split(x, np.cumsum(sizes)[:-1], axis=a))]


@register(OP_SET, "Slice")
def Slice(ctx, data, starts, ends, axes=None, steps=None):
    """numpy ONNX ``Slice`` via explicit index lists (clamping as the spec says)."""
    x = np.asarray(data)
    st, en = ints(starts), ints(ends)
    ax = ints(axes) if axes is not None else list(range(len(st)))
    sp = ints(steps) if steps is not None else [1] * len(st)
    for s, e, a, k in zip(st, en, ax, sp):
        a = norm_axis(a, x.ndim)
        d = x.shape[a]
        s, e = (s + d if s < 0 else s), (e + d if e < 0 else e)
        if k > 0:
            idx = np.arange(min(max(s, 0), d), min(max(e, 0), d), k)
        else:
            idx = np.arange(min(max(s, 0), d - 1), min(max(e, -1), d - 1), k)
        x = np.take(x, idx, axis=a)
    return out(ctx, x)


@register(OP_SET, "Expand")
def Expand(ctx, input, shape):
    """numpy ONNX ``Expand``."""
    x = np.asarray(input)
    return out(ctx, x * np.ones(ints(shape), x.dtype))


@register(OP_SET, "Tile")
def Tile(ctx, input, repeats):
    """numpy ONNX ``Tile``."""
    return out(ctx, np.tile(input, ints(repeats)))


@register(OP_SET, "Pad")
def Pad(ctx, data, pads, constant_value=None, axes=None, *, mode="Constant"):
    """numpy ONNX ``Pad`` (negative pads crop)."""
    x = np.asarray(data)
    p = ints(pads)
    ax = [norm_axis(a, x.ndim) for a in ints(axes)] if axes is not None else list(range(x.ndim))
    cfg = [[0, 0] for _ in range(x.ndim)]
    for i, a in enumerate(ax):
        cfg[a] = [p[i], p[i + len(ax)]]
    x = x[tuple(slice(max(-b, 0), x.shape[i] - max(-e, 0)) for i, (b, e) in enumerate(cfg))]
    cfg = [(max(b, 0), max(e, 0)) for b, e in cfg]
    if mode == "Constant":
        cv = 0 if constant_value is None else np.asarray(constant_value).reshape(())
        return out(ctx, np.pad(x, cfg, constant_values=cv))
    return out(ctx, np.pad(x, cfg, mode={"Reflect": "reflect", "Edge": "edge", "Wrap": "wrap"}[mode]))


def _constantofshape_dtype(node, k, graphs):
    """The dtype of ``value`` (absent: float32 0)."""
    return np.asarray(node.attrs.get("value", np.float32(0))).dtype


@register(OP_SET, "ConstantOfShape", out_dtype=_constantofshape_dtype)
def ConstantOfShape(ctx, input, *, value=None):
    """numpy ONNX ``ConstantOfShape``."""
    v = np.float32(0) if value is None else value
    return out(ctx, np.full(ints(input), v, np.asarray(v).dtype))


@register(OP_SET, "Range")
def Range(ctx, start, limit, delta):
    """numpy ONNX ``Range``."""
    s, l, d = (np.asarray(v).reshape(()) for v in (start, limit, delta))
    n = max(int(np.ceil((float(l) - float(s)) / float(d))), 0)
    return out(ctx, s + np.arange(n) * d)


def _eyelike_dtype(node, k, graphs):
    """``dtype`` (absent: the input's)."""
    return node.attrs.get("dtype") or None


@register(OP_SET, "EyeLike", out_dtype=_eyelike_dtype)
def EyeLike(ctx, input, *, dtype=None, k=0):
    """numpy ONNX ``EyeLike``."""
    r, c = np.shape(input)
    return out(ctx, np.eye(r, c, int(k), dtype=np.dtype(dtype) if dtype is not None else np.asarray(input).dtype))


@register(OP_SET, "Trilu")
def Trilu(ctx, input, k=None, *, upper=False):
    """numpy ONNX ``Trilu``."""
    kk = ints(k)[0] if k is not None else 0
    return out(ctx, np.triu(input, kk) if upper else np.tril(input, kk))


@register(OP_SET, "OneHot")
def OneHot(ctx, indices, depth, values, *, axis=0):
    """numpy ONNX ``OneHot``."""
    d = ints(depth)[0]
    idx = np.asarray(indices).astype(np.int64)
    idx = np.where(idx < 0, idx + d, idx)
    a = norm_axis(axis, idx.ndim + 1)
    hit = np.expand_dims(idx, a) == np.arange(d).reshape([d if i == a else 1 for i in range(idx.ndim + 1)])
    v = np.asarray(values)
    return out(ctx, np.where(hit, v[1], v[0]))


@register(OP_SET, "DepthToSpace")
def DepthToSpace(ctx, input, *, mode="DCR", block_size=0):
    """numpy ONNX ``DepthToSpace``."""
    x = np.asarray(input)
    b = int(block_size)
    n, c, h, w = x.shape
    if mode == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return out(ctx, y.reshape(n, c // (b * b), h * b, w * b))


@register(OP_SET, "NonZero", out_dtype=op_rules.int32_out)
def NonZero(ctx, X):
    """numpy ONNX ``NonZero``."""
    x = np.asarray(X)
    idx = np.array(np.nonzero(x)).reshape(x.ndim, -1)
    if len(ctx.outputs) == 2:  # static-bound mode: padded with -1 columns to X.size, and the count
        padded = np.full((x.ndim, x.size), -1, np.int64)
        padded[:, :idx.shape[1]] = idx
        return out(ctx, padded), out(ctx, np.int32(idx.shape[1]), 1)
    return out(ctx, idx)
