"""ONNX shape and data-movement ops.

Inputs that ONNX made tensors but that fix output shapes (Reshape's shape,
Slice's starts/ends/axes/steps, Split sizes, Squeeze/Unsqueeze axes, Pad
amounts, Tile repeats, Expand's shape, ConstantOfShape's shape, OneHot's
depth, Trilu's k) are ``static_inputs``: they must be known at load time (a
constant, or computed from constants and static shapes, which the graph
builder folds while tracing). Otherwise loading raises a clear error.
Shape and Size return numpy int32 (shapes are static under ``jit``).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import op_rules
from ..registry import register
from ._util import OP_SET, axis as norm_axis, ints, require_concrete


def _shape_of_batch(node, carrying, batch) -> None:
    """Shape, Size: the batch would become a value."""
    raise op_rules.refusal(node, "reads the batch size as a value (shape arithmetic on the batch is not rewritten)")


@register(OP_SET, "Shape", out_dtype=op_rules.int32_out, differentiable=False, shape_only=True,
          batch=_shape_of_batch)
def Shape(ctx, data, *, start=None, end=None):
    """ONNX ``Shape``: int32 shape (optionally ``[start:end]``, clamped)."""
    shp = np.asarray(np.shape(data), np.int32)
    r = len(shp)
    s = 0 if start is None else int(start)
    e = r if end is None else int(end)
    s = min(max(s + r if s < 0 else s, 0), r)
    e = min(max(e + r if e < 0 else e, 0), r)
    return shp[s:e]


@register(OP_SET, "Size", out_dtype=op_rules.int32_out, differentiable=False, shape_only=True,
          batch=_shape_of_batch)
def Size(ctx, data):
    """ONNX ``Size``: number of elements, int32 scalar."""
    return np.int32(np.prod(np.shape(data), dtype=np.int64))


def reshape_target(ctx, in_shape, shape, allow_zero):
    """Resolve ONNX Reshape's 0 (copy) and -1 (infer) entries.

    ``in_shape`` may hold symbolic dims (``jax.export`` with a symbolic
    batch): the sizes are then symbolic expressions, checked for equality
    (a reshape valid only for some batches is refused)."""
    shape = ints(shape)
    out = []
    for i, d in enumerate(shape):
        if d == 0 and not allow_zero:
            if i >= len(in_shape):
                raise ctx.error(f"shape {shape} copies dim {i}, but the input has rank {len(in_shape)}")
            d = in_shape[i]
        out.append(d)
    total = math.prod(in_shape)
    if out.count(-1) > 1:
        raise ctx.error(f"shape {shape} has more than one -1")
    if -1 in out:
        known = math.prod(d for d in out if not _is_int(d) or d != -1)
        if _is_int(known) and known == 0:
            raise ctx.error(f"cannot reshape {tuple(in_shape)} to {shape}")
        if _is_int(total) and _is_int(known):
            if total % known:
                raise ctx.error(f"cannot reshape {tuple(in_shape)} to {shape}")
            out[out.index(-1)] = total // known
        else:
            try:
                out[out.index(-1)] = total // known  # exact when the symbolic sizes divide
            except Exception:  # noqa: BLE001 - jax's symbolic division refused it
                raise ctx.error(f"cannot reshape {tuple(in_shape)} to {shape} for every batch size") from None
    if not math.prod(out) == total:
        raise ctx.error(f"cannot reshape {tuple(in_shape)} ({total} elements) to {shape}")
    return tuple(out)


def _is_int(d) -> bool:
    return isinstance(d, (int, np.integer))


def _reshape_batch(node, carrying, batch) -> None:
    """Reshape: a constant target gets -1 as its leading entry (0 copies)."""
    a, ins = node.attrs, node.inputs
    x = ins[0] if ins else None
    shape = op_rules.const(ins[1]) if len(ins) > 1 else None
    if shape is None or shape.ndim != 1:
        raise op_rules.refusal(node, "takes its target shape from a computed tensor")
    target = shape.astype(np.int64).tolist()
    if not a.get("allow_zero") and target and target[0] == 0:
        return  # copies the batch dimension
    if not a.get("allow_zero") and x.shape is not None:
        target = [x.shape[i] if d == 0 and i < len(x.shape) and x.shape[i] is not None else d
                  for i, d in enumerate(target)]
    ins[1] = op_rules.new_const(ins[1], np.asarray(op_rules.batch_target(node, target, x), shape.dtype))


@register(OP_SET, "Reshape", static_inputs=(1,), batch=_reshape_batch)
def Reshape(ctx, data, shape, *, allow_zero=False):
    """ONNX ``Reshape`` to a load-time-constant ``shape`` (0 copies a dim unless ``allow_zero``)."""
    return jnp.reshape(data, reshape_target(ctx, np.shape(data), shape, allow_zero))


def _flatten_batch(node, carrying, batch) -> None:
    rank = op_rules.rank(node.inputs[0] if node.inputs else None)
    if rank is not None and int(node.attrs.get("axis", 0)) % (rank + 1) == 0:
        raise op_rules.refusal(node, "flattens the batch dimension into the others (axis 0)")


@register(OP_SET, "Flatten", batch=_flatten_batch)
def Flatten(ctx, input, *, axis=0):
    """ONNX ``Flatten`` to 2-D at ``axis`` (schema default 0; rten-convert writes ONNX's 1)."""
    shp = np.shape(input)
    a = int(axis) + len(shp) if int(axis) < 0 else int(axis)
    if not 0 <= a <= len(shp):
        raise ctx.error(f"axis {axis} is out of range for rank {len(shp)}")
    return jnp.reshape(input, (math.prod(shp[:a]), math.prod(shp[a:])))  # dims may be symbolic (jax.export)


def _squeeze_batch(node, carrying, batch) -> None:
    """Squeeze, Unsqueeze: no axis at the batch dimension."""
    op, a, ins = node.op_name, node.attrs, node.inputs
    axes = op_rules.const(ins[1]) if len(ins) > 1 else None
    if axes is None and a.get("axes") is not None:
        axes = np.asarray(a["axes"])
    out_rank = op_rules.rank(node.outputs[0]) if op == "Unsqueeze" else op_rules.rank(ins[0] if ins else None)
    if axes is None or out_rank is None or any(int(v) % out_rank == 0 for v in axes.reshape(-1)):
        raise op_rules.refusal(node, f"{'removes' if op == 'Squeeze' else 'inserts'} an axis at the batch dimension "
                               f"(axes {None if axes is None else axes.reshape(-1).tolist()})")


@register(OP_SET, "Squeeze", static_inputs=(1,), batch=_squeeze_batch)
def Squeeze(ctx, data, axes=None):
    """ONNX ``Squeeze`` the constant ``axes`` (all size-1 dims when omitted)."""
    shp = np.shape(data)
    if axes is None:
        ax = tuple(i for i, d in enumerate(shp) if d == 1)
    else:
        ax = tuple(norm_axis(a, len(shp), ctx) for a in ints(axes))
        for a in ax:
            if shp[a] != 1:
                raise ctx.error(f"cannot squeeze axis {a} of size {shp[a]}")
    return jnp.squeeze(data, ax)


@register(OP_SET, "Unsqueeze", static_inputs=(1,), batch=_squeeze_batch)
def Unsqueeze(ctx, data, axes):
    """ONNX ``Unsqueeze``: insert size-1 dims at the constant ``axes`` (of the output)."""
    r = np.ndim(data) + len(ints(axes))
    ax = sorted(norm_axis(a, r, ctx) for a in ints(axes))
    shp = list(np.shape(data))
    for a in ax:
        shp.insert(a, 1)
    return jnp.reshape(data, shp)


def _transpose_batch(node, carrying, batch) -> None:
    perm = node.attrs.get("perm")
    rank = op_rules.rank(node.inputs[0] if node.inputs else None)
    if (perm is None or len(perm) == 0) and (rank or 0) > 1 or perm is not None and len(perm) and \
            int(perm[0]) != 0:
        raise op_rules.refusal(node, f"moves the batch dimension (perm {None if perm is None else list(perm)})")


@register(OP_SET, "Transpose", batch=_transpose_batch)
def Transpose(ctx, data, *, perm=None):
    """ONNX ``Transpose`` by ``perm`` (reversed dims when absent)."""
    return jnp.transpose(data, None if not perm else tuple(int(p) for p in perm))


@register(OP_SET, "Concat", batch=op_rules.axis_not_batch(0))
def Concat(ctx, *inputs, axis=0):
    """ONNX ``Concat`` along ``axis``."""
    xs = [x for x in inputs if x is not None]
    r = np.ndim(xs[0])
    return jnp.concatenate([jnp.asarray(x) for x in xs], axis=norm_axis(axis, r, ctx))


@register(OP_SET, "Split", static_inputs=(1,), batch=op_rules.axis_not_batch(0))
def Split(ctx, input, split=None, *, axis=0, num_outputs=None):
    """ONNX ``Split`` along ``axis`` into the constant ``split`` sizes, or into
    ``num_outputs`` (default: the node's output count) parts of ``ceil(n / parts)``."""
    x = jnp.asarray(input)
    a = norm_axis(axis, x.ndim, ctx)
    n = x.shape[a]
    if split is not None and np.size(split):
        sizes = ints(split)
    else:
        parts = int(num_outputs) if num_outputs else len(ctx.outputs)
        chunk = -(-n // parts)
        sizes = [min(chunk, n - i * chunk) for i in range(parts)]
    if sum(sizes) != n:
        raise ctx.error(f"split sizes {sizes} do not add up to dim {a} of size {n}")
    offs = np.cumsum([0] + sizes)
    return [lax.slice_in_dim(x, int(offs[i]), int(offs[i + 1]), axis=a) for i in range(len(sizes))]


def _slice_batch(node, carrying, batch) -> None:
    """Slice: ``[0, end >= 1)`` of dimension 0 takes all of it."""
    ins = node.inputs
    rank = op_rules.rank(ins[0] if ins else None)
    starts, ends = op_rules.const(ins[1]), op_rules.const(ins[2])
    axes = op_rules.const(ins[3]) if len(ins) > 3 and ins[3] is not None else None
    steps = op_rules.const(ins[4]) if len(ins) > 4 and ins[4] is not None else None
    if starts is None or ends is None or (len(ins) > 3 and ins[3] is not None and axes is None) or \
            (len(ins) > 4 and ins[4] is not None and steps is None):
        raise op_rules.refusal(node, "has computed starts/ends/axes/steps")
    axes = np.arange(len(starts)) if axes is None else axes.reshape(-1)
    new_ends = ends.copy()
    for k, ax in enumerate(axes):
        if rank and int(ax) % rank == 0:
            step = 1 if steps is None else int(steps[k])
            if int(starts[k]) != 0 or step != 1 or int(ends[k]) < 1:
                raise op_rules.refusal(node, f"slices the batch dimension (start {int(starts[k])}, end {int(ends[k])}, "
                                       f"step {step})")
            new_ends[k] = np.iinfo(ends.dtype).max
    ins[2] = op_rules.new_const(ins[2], new_ends)


@register(OP_SET, "Slice", static_inputs=(1, 2, 3, 4), batch=_slice_batch)
def Slice(ctx, data, starts, ends, axes=None, steps=None):
    """ONNX ``Slice`` with constant starts/ends/axes/steps (clamped as the spec says)."""
    x = jnp.asarray(data)
    st, en = ints(starts), ints(ends)
    ax = ints(axes) if axes is not None else list(range(len(st)))
    sp = ints(steps) if steps is not None else [1] * len(st)
    idx = [slice(None)] * x.ndim
    for s, e, a, k in zip(st, en, ax, sp):
        a = norm_axis(a, x.ndim, ctx)
        d = x.shape[a]
        if k == 0:
            raise ctx.error("Slice step 0")
        s = s + d if s < 0 else s
        e = e + d if e < 0 else e
        # d may be a symbolic batch (jax.export), which has no known upper
        # bound: an index at or past INT32_MAX ("to the end") clamps to it
        big = (lambda v: v >= _INT32_MAX) if not _is_int(d) else (lambda v: False)
        if k > 0:
            s, e = (d if big(s) else min(max(s, 0), d)), (d if big(e) else min(max(e, 0), d))
            idx[a] = slice(s, e, k)
        else:
            s, e = (d - 1 if big(s) else min(max(s, 0), d - 1)), (d - 1 if big(e) else min(max(e, -1), d - 1))
            idx[a] = slice(s, None if _is_int(e) and e < 0 else e, k)
    return x[tuple(idx)]


_INT32_MAX = 2 ** 31 - 1


def _expand_batch(node, carrying, batch) -> None:
    """Expand, Tile: a constant shape/repeats leaving dimension 0 at 1."""
    ins = node.inputs
    rank = op_rules.rank(ins[0] if ins else None)
    shape = op_rules.const(ins[1]) if len(ins) > 1 else None
    if shape is None or rank is None or len(shape) > rank or (len(shape) == rank and int(shape[0]) != 1):
        raise op_rules.refusal(node, f"expands or repeats the batch dimension ({node.op_name} "
                               f"{None if shape is None else shape.tolist()})")


@register(OP_SET, "Expand", static_inputs=(1,), batch=_expand_batch)
def Expand(ctx, input, shape):
    """ONNX ``Expand``: bidirectional broadcast of ``input`` with the constant ``shape``."""
    try:  # jnp's rules accept symbolic dims (a batch under jax.export)
        out = jnp.broadcast_shapes(np.shape(input), tuple(ints(shape)))
    except ValueError as e:
        raise ctx.error(str(e)) from None
    return jnp.broadcast_to(input, out)


@register(OP_SET, "Tile", static_inputs=(1,), batch=_expand_batch)
def Tile(ctx, input, repeats):
    """ONNX ``Tile`` by the constant ``repeats``."""
    return jnp.tile(input, tuple(ints(repeats)))


def _pad_batch(node, carrying, batch) -> None:
    ins = node.inputs
    rank = op_rules.rank(ins[0] if ins else None)
    pads = op_rules.const(ins[1]) if len(ins) > 1 else None
    axes = op_rules.const(ins[3]) if len(ins) > 3 and ins[3] is not None else None
    if pads is None or rank is None:
        raise op_rules.refusal(node, "has computed pads")
    axes = np.arange(rank) if axes is None else axes.reshape(-1)
    n = len(axes)
    for k, ax in enumerate(axes):
        if int(ax) % rank == 0 and (int(pads[k]) or int(pads[k + n])):
            raise op_rules.refusal(node, f"pads the batch dimension (pads {pads.tolist()})")


@register(OP_SET, "Pad", static_inputs=(1, 3), batch=_pad_batch)
def Pad(ctx, data, pads, constant_value=None, axes=None, *, mode="Constant"):
    """ONNX ``Pad`` (``Constant``, ``Reflect``, ``Edge``, ``Wrap``) by constant
    ``pads`` ``[begin..., end...]`` over ``axes`` (all when omitted); negative
    pads crop."""
    x = jnp.asarray(data)
    p = ints(pads)
    ax = [norm_axis(a, x.ndim, ctx) for a in ints(axes)] if axes is not None else list(range(x.ndim))
    if len(p) != 2 * len(ax):
        raise ctx.error(f"pads has {len(p)} values for {len(ax)} axes")
    cfg = [(0, 0)] * x.ndim
    for i, a in enumerate(ax):
        cfg[a] = (p[i], p[i + len(ax)])
    crop = [slice(max(-b, 0), x.shape[i] - max(-e, 0)) for i, (b, e) in enumerate(cfg)]
    x = x[tuple(crop)]
    cfg = [(max(b, 0), max(e, 0)) for b, e in cfg]
    if mode == "Constant":
        cv = 0 if constant_value is None else jnp.asarray(constant_value, x.dtype).reshape(())
        return jnp.pad(x, cfg, mode="constant", constant_values=cv)
    jmode = {"Reflect": "reflect", "Edge": "edge", "Wrap": "wrap"}.get(mode)
    if jmode is None:
        raise ctx.error(f"unknown pad mode {mode!r}")
    return jnp.pad(x, cfg, mode=jmode)


def _constantofshape_dtype(node, k, graphs):
    """The dtype of ``value`` (absent: float32 0)."""
    return np.asarray(node.attrs.get("value", np.float32(0))).dtype


@register(OP_SET, "ConstantOfShape", out_dtype=_constantofshape_dtype, static_inputs=(0,))
def ConstantOfShape(ctx, input, *, value=None):
    """ONNX ``ConstantOfShape``: a tensor of the constant shape ``input`` filled with
    ``value`` (float32 0 when absent)."""
    v = np.float32(0) if value is None else value
    y = jnp.full(tuple(ints(input)), v, np.asarray(v).dtype)
    if y.dtype.kind == "f" and y.size > 1:
        # Float fills feeding convolutions/matmuls (the ONNX "light" models
        # build every weight this way) must not be folded into them: XLA's
        # algebraic simplifier rewrites conv(x, broadcast(c)) in a way that
        # overflows float32 where the unfolded computation does not.
        y = lax.optimization_barrier(y)
    return y


@register(OP_SET, "Range", static_inputs=(0, 1, 2), differentiable=False)
def Range(ctx, start, limit, delta):
    """ONNX ``Range``: ``start, start + delta, ...`` below ``limit``; inputs must be
    known at load time (the length depends on them)."""
    s, l, d = (np.asarray(v).reshape(()) for v in (start, limit, delta))
    if float(d) == 0 or not all(np.isfinite(float(v)) for v in (s, l, d)):
        raise ctx.error(f"start {s}, limit {l} and delta {d} must be finite, delta not 0")
    n = max(int(np.ceil((float(l) - float(s)) / float(d))), 0)
    dt = np.result_type(s, l, d)
    ctx.check_size((n,), dt)
    return (s + np.arange(n, dtype=dt) * d).astype(dt)


def _eyelike_dtype(node, k, graphs):
    """``dtype`` (absent: the input's)."""
    return node.attrs.get("dtype") or None


@register(OP_SET, "EyeLike", out_dtype=_eyelike_dtype, differentiable=False)
def EyeLike(ctx, input, *, dtype=None, k=0):
    """ONNX ``EyeLike``: 2-D identity with ones on diagonal ``k``, ``input``'s shape."""
    r, c = np.shape(input)
    dt = np.dtype(dtype) if dtype is not None else np.asarray(input).dtype if isinstance(input, np.ndarray) \
        else jnp.asarray(input).dtype
    return jnp.eye(r, c, int(k), dtype=dt)


@register(OP_SET, "Trilu", static_inputs=(1,))
def Trilu(ctx, input, k=None, *, upper=False):
    """ONNX ``Trilu``: upper (``upper``) or lower triangle of the last two dims, offset ``k``."""
    kk = ints(k)[0] if k is not None else 0
    return jnp.triu(input, kk) if upper else jnp.tril(input, kk)


@register(OP_SET, "OneHot", static_inputs=(1,))
def OneHot(ctx, indices, depth, values, *, axis=0):
    """ONNX ``OneHot``: ``values[1]`` where the index (negative wraps) hits, else ``values[0]``."""
    d = int(np.asarray(depth).reshape(-1)[0])
    idx = jnp.asarray(indices)
    idx = jnp.where(idx < 0, idx + d, idx).astype(jnp.int32)
    r = idx.ndim + 1
    a = norm_axis(axis, r, ctx)
    rng = jnp.arange(d, dtype=jnp.int32).reshape([d if i == a else 1 for i in range(r)])
    hit = jnp.expand_dims(idx, a) == rng
    vals = jnp.asarray(values)
    return jnp.where(hit, vals[1], vals[0])


@register(OP_SET, "DepthToSpace")
def DepthToSpace(ctx, input, *, mode="DCR", block_size=0):
    """ONNX ``DepthToSpace`` (NCHW), ``DCR`` or ``CRD`` ordering."""
    x = jnp.asarray(input)
    b = int(block_size)
    if b <= 0:
        raise ctx.error("block_size must be positive")
    n, c, h, w = x.shape
    if mode == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


def _nonzero_bound(node):
    """``[rank, X.size]`` indices: every element nonzero."""
    if len(node.outputs) != 1 or node.outputs[0] is None:
        return None
    out, x = node.outputs[0], node.inputs[0] if node.inputs else None
    if x is not None and x.static_shape:
        out.shape = (len(x.shape), op_rules.size(x))
    return out


@register(OP_SET, "NonZero", out_dtype=op_rules.int32_out, static_inputs=(0,), differentiable=False,
          bounded_inputs=(0,), static_bound=_nonzero_bound)
def NonZero(ctx, X):
    """ONNX ``NonZero``: int32 ``[rank, count]`` indices of nonzero elements.

    The output shape depends on the values, so as loaded ``X`` must be known
    at load time (a constant or folded from constants); otherwise ``load``
    refuses the model (:class:`~fbjax.errors.UnsupportedOperatorError`, as
    for every ``static_inputs`` operand). In static-bound mode (``fbjax.load(..., static_bounds=True)``:
    the node has a second, count output) ``X`` may be computed by the graph:
    returns ``([rank, X.size]`` indices in row-major order, then -1 columns,
    and the int32 number of nonzero elements)``, jittable and vmappable.
    """
    if len(ctx.outputs) == 2:
        xj = jnp.asarray(X)
        idx = jnp.nonzero(xj.reshape(xj.shape or (1,)), size=max(int(np.prod(xj.shape)), 1), fill_value=-1)
        idx = jnp.stack(idx).astype(jnp.int32)[:xj.ndim, :int(np.prod(xj.shape))]
        return idx, jnp.sum(xj != 0, dtype=jnp.int32)
    x = require_concrete(ctx, X, "NonZero's input")
    return np.stack(np.nonzero(x)).astype(np.int32).reshape(x.ndim, -1)
