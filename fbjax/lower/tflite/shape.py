"""TFLite data-movement ops: reshape, concatenation, padding, slicing,
depth-to-space and densify.

These move elements without arithmetic, so they also accept integer and
quantized tensors whose quantization parameters do not change. Static inputs
(shapes, paddings, begin/end/strides) arrive as numpy arrays. Reference
kernels: TFLite ``kernels/reshape.cc``, ``concatenation.cc``, ``pad.cc``,
``strided_slice.cc`` with ``internal/strided_slice_logic.h``,
``depth_to_space.cc``, ``densify.cc``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import op_rules
from ..registry import register


def _same_quant(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return (np.array_equal(a.scale, b.scale) and np.array_equal(a.zero_point, b.zero_point)
            and a.quantized_dimension == b.quantized_dimension)


@register("tflite", "CONCATENATION", batch=op_rules.axis_not_batch())
def CONCATENATION(ctx, *xs, axis=0, fused_activation_function="NONE"):
    """TFLite CONCATENATION (``kernels/concatenation.cc``): joins the inputs
    along ``axis`` (negative counts from the end). Like the builtin kernel,
    refuses any fused activation other than ``NONE`` (XNNPACK silently
    ignores it, so no behaviour would match both).

    Quantized inputs are accepted only when they share the output's
    quantization parameters (no requantization is implemented).
    """
    if not xs:
        raise ctx.error("needs at least one input")
    rank = jnp.ndim(xs[0])
    ax = int(axis)
    if not -rank <= ax < rank:
        raise ctx.error(f"axis {axis} out of range for rank {rank}")
    ax %= rank
    for i, x in enumerate(xs):
        if jnp.ndim(x) != rank:
            raise ctx.error(f"input {i} has rank {jnp.ndim(x)}, input 0 has rank {rank}")
    out = ctx.outputs[0] if ctx.outputs else None
    for i, v in enumerate(ctx.inputs):
        if v is not None and v.quant is not None and np.dtype(v.dtype).kind in "iu":
            if out is None or not _same_quant(v.quant, out.quant):
                raise ctx.error(f"quantized input {i} needs requantization, which is not supported")
    if fused_activation_function != "NONE":
        raise ctx.error(f"fused activation {fused_activation_function} is not supported (TFLite allows only NONE)")
    return jnp.concatenate([jnp.asarray(x) for x in xs], axis=ax)


def _resolve_shape(ctx, shape, size):
    shape = [int(d) for d in shape]
    unknown = [i for i, d in enumerate(shape) if d == -1]
    if len(unknown) > 1 or any(d < -1 for d in shape):
        raise ctx.error(f"invalid target shape {shape} (at most one -1, no other negatives)")
    known = int(np.prod([d for d in shape if d != -1])) if shape else 1
    if unknown:
        # size is symbolic (``b * 256``) under jax.export with a dynamic batch
        q = size // known if known else None
        if q is None or not q * known == size:
            raise ctx.error(f"cannot infer the -1 in {shape} for {size} elements")
        shape[unknown[0]] = q
    elif known != size:
        raise ctx.error(f"cannot reshape {size} elements to {shape}")
    return tuple(shape)


def _reshape_batch(node, carrying, batch) -> None:
    """RESHAPE: a constant target (shape input or ``new_shape``) gets -1 as
    its leading entry when it provably addresses the batch."""
    ins = node.inputs
    x = ins[0] if ins else None
    shape = op_rules.const(ins[1]) if len(ins) > 1 else None
    if shape is not None and shape.ndim == 1:
        target = op_rules.batch_target(node, shape.astype(np.int64).tolist(), x)
        ins[1] = op_rules.new_const(ins[1], np.asarray(target, shape.dtype))
    elif len(ins) > 1 and ins[1] is not None and ins[1].data is None:
        raise op_rules.refusal(node, "takes its target shape from a computed tensor")
    new_shape = node.attrs.get("new_shape")
    if new_shape is not None and np.size(new_shape) > 0 and (shape is None or shape.ndim != 1):
        node.attrs = dict(node.attrs, new_shape=np.asarray(
            op_rules.batch_target(node, np.asarray(new_shape).reshape(-1).tolist(), x)))


@register("tflite", "RESHAPE", static_inputs=(1,), int_passthrough=True, batch=_reshape_batch)
def RESHAPE(ctx, x, shape=None, *, new_shape=None):
    """TFLite RESHAPE (``kernels/reshape.cc``).

    The target shape is the static input 1 when it is a 1-D vector, else a
    non-empty ``new_shape`` attribute (``[0]`` meaning a scalar, as in legacy
    files), else the output tensor's recorded shape (unknown dims as -1); one
    ``-1`` is inferred.
    """
    x = jnp.asarray(x)
    if shape is not None and np.ndim(shape) == 1:
        target = np.asarray(shape).tolist()
    elif new_shape is not None and np.size(new_shape) > 0:
        target = np.asarray(new_shape).reshape(-1).tolist()
        if target == [0] and x.size != 0:
            target = []
    elif ctx.outputs and ctx.outputs[0] is not None and ctx.outputs[0].shape is not None:
        out = ctx.outputs[0].shape
        if sum(d is None for d in out) > 1:
            raise ctx.error(f"no target shape: output shape {out} has more than one unknown dim")
        target = [-1 if d is None else d for d in out]
    else:
        raise ctx.error("no target shape (no shape input, new_shape or output shape)")
    return x.reshape(_resolve_shape(ctx, target, x.size))


@register("tflite", "PAD", static_inputs=(1,))
def PAD(ctx, x, paddings):
    """TFLite PAD (``kernels/pad.cc``): constant padding with
    ``paddings[rank, 2] = (before, after)`` per dimension; the value is 0
    (the output zero point for quantized tensors)."""
    x = jnp.asarray(x)
    p = np.asarray(paddings)
    if p.shape != (x.ndim, 2):
        raise ctx.error(f"paddings shape {p.shape} does not match input rank {x.ndim} (want [{x.ndim}, 2])")
    if (p < 0).any():
        raise ctx.error(f"negative paddings {p.tolist()}")
    value = 0
    q = ctx.outputs[0].quant if ctx.outputs and ctx.outputs[0] is not None else None
    if q is not None and np.dtype(x.dtype).kind in "iu" and not q.per_channel:
        value = int(q.zero_point[0])
    cfg = [(int(a), int(b), 0) for a, b in p]
    return lax.pad(x, jnp.array(value, x.dtype), cfg)


@register("tflite", "DEPTH_TO_SPACE", int_passthrough=True)
def DEPTH_TO_SPACE(ctx, x, *, block_size=0):
    """TFLite DEPTH_TO_SPACE (``reference_ops::DepthToSpace``), NHWC:
    ``out[n, h*b + i, w*b + j, c] = in[n, h, w, (i*b + j) * C_out + c]``."""
    b = int(block_size)
    if x.ndim != 4:
        raise ctx.error(f"expected a 4-D NHWC input, got shape {tuple(x.shape)}")
    n, h, w, c = x.shape
    if b < 1 or c % (b * b):
        raise ctx.error(f"block_size {block_size} does not divide {c} channels into b*b blocks")
    co = c // (b * b)
    y = jnp.reshape(x, (n, h, w, b, b, co))
    y = jnp.transpose(y, (0, 1, 3, 2, 4, 5))
    return y.reshape(n, h * b, w * b, co)


def _keeps_layout(node) -> bool:
    """DENSIFY is the identity: a float weight keeps its layout through it."""
    return node.inputs[0] is not None and np.dtype(node.inputs[0].dtype).kind == "f"


@register("tflite", "DENSIFY", layout_passthrough=_keeps_layout)
def DENSIFY(ctx, x):
    """TFLite DENSIFY (``kernels/densify.cc``): identity here, because sparse
    constants are already densified when the file is read."""
    return jnp.asarray(x)


# --- STRIDED_SLICE ------------------------------------------------------------

def _clamp(v, lo, hi):
    return hi if v > hi else lo if v < lo else v


def strided_slice_plan(in_shape, begin, end, strides, *, begin_mask=0, end_mask=0, ellipsis_mask=0,
                       new_axis_mask=0, shrink_axis_mask=0, offset=False):
    """Static plan of a TFLite STRIDED_SLICE.

    Follows ``strided_slice.cc`` (``BuildStridedSliceParams``: the ellipsis
    expands to the dims no spec covers, new axes become size-1 dims of an
    "effective" input, dims past the last spec are taken whole) and
    ``strided_slice_logic.h`` (``StridedSliceStartForAxis`` /
    ``StridedSliceEndForAxis``: negative indices add the dim size, then clamp
    to ``[0, n]`` for positive strides or ``[-1, n-1]`` for negative ones,
    masks override after clamping, ``offset`` makes ``end`` relative to the
    clamped ``begin``, shrunk axes take one element). Shrunk axes take
    element ``begin`` whatever the stride's sign (TF semantics; LiteRT's copy
    loop writes nothing there for negative strides).

    Returns:
        ``(effective_shape, [(start, count, stride)], shrink_axes, out_shape)``
        with ``shrink_axes`` indices into the effective shape.

    Raises:
        ValueError: stride 0, mismatched spec lengths, a shrunk index out
            of range, or an ``offset`` slice that does not spell out every
            dim, reaches outside the input or is combined with begin/end
            masks (TFLite then sizes the output as
            ``ceil(end / stride)`` but fills only the in-range part).
    """
    begin = [int(v) for v in np.asarray(begin).reshape(-1)]
    end = [int(v) for v in np.asarray(end).reshape(-1)]
    strides = [int(v) for v in np.asarray(strides).reshape(-1)]
    n_spec = len(begin)
    if len(end) != n_spec or len(strides) != n_spec:
        raise ValueError(f"begin/end/strides lengths differ: {len(begin)}, {len(end)}, {len(strides)}")
    rank = len(in_shape)
    bit = lambda mask, i: bool(int(mask) >> i & 1) if i >= 0 else False  # noqa: E731

    num_add = sum(1 for i in range(n_spec) if not bit(ellipsis_mask, i) and bit(new_axis_mask, i))
    eff_dims = rank + num_add
    eff_ell, eff_new = set(), set()
    ell_start, expanded = eff_dims, 0
    i = 0
    while i < eff_dims:
        if bit(ellipsis_mask, i):
            ell_start = i
            ell_end = max(i + 1, min(i + 1 + num_add + rank - n_spec, eff_dims))
            expanded = ell_end - ell_start - 1
            eff_ell.update(range(i, ell_end))
            i = ell_end
            continue
        if bit(new_axis_mask, i - expanded):
            eff_new.add(i)
        i += 1

    if offset and (n_spec != rank or ellipsis_mask or new_axis_mask):
        # TFLite then reads `end` of dims that have no spec (out of bounds).
        raise ValueError(
            f"offset=True needs one begin/end/stride per input dim ({rank}) and no "
            f"ellipsis or new-axis masks; TFLite's result is undefined otherwise"
        )
    eff_shape, specs, shrink, explicit = [], [], [], []
    added_ell = added_axes = 0
    for i in range(eff_dims):
        if i in eff_ell:
            added_ell = max(0, i - ell_start)
            eff_shape.append(in_shape[i - added_axes])
            specs.append((0, 0, 1, True, True))
            explicit.append(False)
        elif i in eff_new:
            eff_shape.append(1)
            specs.append((0, 1, 1, False, False))
            explicit.append(False)
            added_axes += 1
        elif i >= n_spec + expanded:
            eff_shape.append(in_shape[i - added_axes])
            specs.append((0, 0, 1, True, True))
            explicit.append(False)
        else:
            explicit.append(True)
            o = i - added_ell
            eff_shape.append(in_shape[i - added_axes])
            specs.append((begin[o], end[o], strides[o], bit(begin_mask, o), bit(end_mask, o)))
            if bit(shrink_axis_mask, o):
                shrink.append(i)

    plan, out_shape = [], []
    for i, ((b, e, s, bm, em), n) in enumerate(zip(specs, eff_shape)):
        if s == 0:
            raise ValueError(f"stride of axis {i} is 0")
        # StridedSliceStartForAxis (a mask overrides the clamped value, so it
        # is not computed then: n may be a symbolic batch under jax.export)
        if bm:
            start = 0 if s > 0 else n - 1
        else:
            start = b + n if b < 0 else b
            start = _clamp(start, 0, n) if s > 0 else _clamp(start, -1, n - 1)
        if i in shrink:
            if not 0 <= start < n:
                raise ValueError(f"shrink_axis index {b} out of range for axis {i} of size {n}")
            plan.append((start, 1, 1))
            continue
        # StridedSliceEndForAxis
        if em:
            stop = n if s > 0 else -1
        else:
            stop = e + start if offset else e
            stop = stop + n if stop < 0 else stop
            stop = _clamp(stop, 0, n) if s > 0 else _clamp(stop, -1, n - 1)
        count = max(0, -(-(stop - start) // s))
        if offset and explicit[i] and count != max(0, -(-e // s)):
            # TFLite sizes an offset slice as ceil(end / stride) without
            # clamping or masks, then copies only the in-range elements: the
            # rest of its output is uninitialized memory.
            raise ValueError(
                f"offset slice of axis {i} (begin {b}, size {e}, stride {s}, masks "
                f"{int(bm)}/{int(em)}) leaves the input of size {n}; TFLite's result is undefined"
            )
        plan.append((start, count, s))
        out_shape.append(count)
    return tuple(eff_shape), plan, tuple(shrink), tuple(out_shape)


def _strided_slice_batch(node, carrying, batch) -> None:
    """STRIDED_SLICE: ``[0, 1)`` with stride 1 gets ``end_mask`` bit 0 set."""
    a, ins = node.attrs, node.inputs
    begin, end = op_rules.const(ins[1]), op_rules.const(ins[2])
    strides = op_rules.const(ins[3]) if len(ins) > 3 else None
    if begin is None or end is None:
        raise op_rules.refusal(node, "has computed begin/end")
    if int(a.get("ellipsis_mask", 0) or 0) & 1:
        return  # dimension 0 is inside the ellipsis: taken whole
    if int(a.get("new_axis_mask", 0) or 0) & 1 or int(a.get("shrink_axis_mask", 0) or 0) & 1:
        raise op_rules.refusal(node, "adds or removes an axis in front of the batch")
    s0 = 1 if strides is None else int(strides[0])
    b_all = bool(int(a.get("begin_mask", 0) or 0) & 1) or int(begin[0]) == 0
    e_all = bool(int(a.get("end_mask", 0) or 0) & 1) or int(end[0]) >= 1
    if s0 != 1 or not b_all or not e_all:
        raise op_rules.refusal(node, f"slices the batch dimension (begin {begin.tolist()}, end {end.tolist()})")
    node.attrs = dict(a, end_mask=int(a.get("end_mask", 0) or 0) | 1, begin_mask=int(a.get("begin_mask", 0) or 0) | 1)


@register("tflite", "STRIDED_SLICE", static_inputs=(1, 2, 3),
          int_passthrough=True, batch=_strided_slice_batch)
def STRIDED_SLICE(ctx, x, begin, end, strides, *, begin_mask=0, end_mask=0, ellipsis_mask=0,
                  new_axis_mask=0, shrink_axis_mask=0, offset=False):
    """TFLite STRIDED_SLICE (``kernels/strided_slice.cc``): numpy-like
    ``x[begin:end:stride, ...]`` with TF's begin/end/ellipsis/new-axis/shrink
    masks, negative strides and the ``offset`` flag (``end`` counted from
    ``begin``); see :func:`strided_slice_plan` for the exact index rules."""
    x = jnp.asarray(x)
    try:
        eff_shape, plan, _, out_shape = strided_slice_plan(
            tuple(x.shape), begin, end, strides, begin_mask=begin_mask, end_mask=end_mask,
            ellipsis_mask=ellipsis_mask, new_axis_mask=new_axis_mask,
            shrink_axis_mask=shrink_axis_mask, offset=offset)
    except ValueError as e:
        raise ctx.error(str(e)) from None
    y = x.reshape(eff_shape)
    for ax, (start, count, s) in enumerate(plan):
        if count == 0:
            y = lax.slice_in_dim(y, 0, 0, axis=ax)
        elif s > 0:
            if (start, count, s) != (0, y.shape[ax], 1):
                y = lax.slice_in_dim(y, start, start + (count - 1) * s + 1, s, axis=ax)
        else:
            lo = start + (count - 1) * s
            y = lax.rev(lax.slice_in_dim(y, lo, start + 1, -s, axis=ax), (ax,))
    return y.reshape(out_shape)
