"""Data-movement TFLite ops: CONCATENATION, DENSIFY, DEPTH_TO_SPACE, PAD,
RESHAPE, STRIDED_SLICE.

These move elements without arithmetic, so they work for every dtype
(quantized tensors included: TFLite copies their bytes), except where noted.
"""

from __future__ import annotations

import numpy as np

from ...errors import UnsupportedOperatorError
from ..registry import register
from . import positive_int, to_out


def _same_quant(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return (np.array_equal(a.scale, b.scale) and np.array_equal(a.zero_point, b.zero_point)
            and a.quantized_dimension == b.quantized_dimension)


@register("tflite", "CONCATENATION")
def CONCATENATION(ctx, *xs, axis=0, fused_activation_function="NONE"):
    """Join the inputs along ``axis`` (negative counts from the end)
    (kernels/concatenation.cc). A fused activation other than NONE is an
    error, as in TFLite's kernel.

    Quantized inputs whose scale or zero point differ from the output's would
    need requantization, which the reference does not implement: refused.
    """
    if not xs:
        raise ctx.error("needs at least one input")
    rank = xs[0].ndim
    if any(x.ndim != rank for x in xs):
        raise ctx.error(f"inputs have different ranks: {[x.shape for x in xs]}")
    ax = int(axis) + rank if int(axis) < 0 else int(axis)
    if not 0 <= ax < max(rank, 1):
        raise ctx.error(f"axis {axis} is out of range for rank {rank}")
    for x in xs:
        if x.shape[:ax] + x.shape[ax + 1:] != xs[0].shape[:ax] + xs[0].shape[ax + 1:]:
            raise ctx.error(f"input shapes {[x.shape for x in xs]} differ outside axis {ax}")
    out_q = ctx.outputs[0].quant
    if any(v is not None and not _same_quant(v.quant, out_q) for v in ctx.inputs):
        raise UnsupportedOperatorError(
            [ctx.node.key], detail=f"{ctx.node.location}: inputs quantized differently from the output")
    if fused_activation_function != "NONE":
        # TFLite's kernel refuses it in Prepare (XNNPACK silently ignores it).
        raise ctx.error(f"fused_activation_function {fused_activation_function!r} is not supported "
                        "on CONCATENATION (TFLite requires NONE)")
    return to_out(ctx, np.concatenate(xs, axis=ax))


@register("tflite", "DENSIFY")
def DENSIFY(ctx, x):
    """Sparse -> dense (kernels/densify.cc). fbjax densifies sparse constants
    when it reads the file, so here it is the identity."""
    return to_out(ctx, x)


@register("tflite", "DEPTH_TO_SPACE")
def DEPTH_TO_SPACE(ctx, x, *, block_size=0):
    """Move depth blocks to space, TF's DCR order (kernels/depth_to_space.cc):
    ``out[n, h*b + i, w*b + j, c] = in[n, h, w, (i*b + j)*C_out + c]``.
    A file without ``block_size`` has the schema's default 0, refused here
    (the kernel's Prepare divides by it)."""
    b = positive_int(ctx, "block_size", block_size)
    if x.ndim != 4 or x.shape[3] % (b * b):
        raise ctx.error(f"input shape {x.shape} is not NHWC with channels divisible by {b * b}")
    n, h, w, c = x.shape
    co = c // (b * b)
    y = x.reshape(n, h, w, b, b, co).transpose(0, 1, 3, 2, 4, 5).reshape(n, h * b, w * b, co)
    return to_out(ctx, y)


@register("tflite", "PAD", static_inputs=(1,))
def PAD(ctx, x, paddings):
    """Constant padding with zeros (kernels/pad.cc); ``paddings`` is
    ``[rank, 2]`` of (before, after). A quantized output pads with its zero
    point, which is the encoding of 0.0."""
    p = np.asarray(paddings)
    if not np.issubdtype(p.dtype, np.integer) or p.shape != (x.ndim, 2):
        raise ctx.error(f"paddings must be an integer [{x.ndim}, 2] tensor, got {p.dtype.name}{list(p.shape)}")
    if np.any(p < 0):
        raise ctx.error(f"negative paddings {p.tolist()}")
    fill = 0
    q = ctx.outputs[0].quant
    if q is not None and np.issubdtype(x.dtype, np.integer):
        if q.zero_point.size != 1:
            raise ctx.error("per-channel quantized output: no single pad value")
        fill = int(q.zero_point[0])
    return to_out(ctx, np.pad(x, [tuple(int(v) for v in row) for row in p], constant_values=fill))


@register("tflite", "RESHAPE", static_inputs=(1,))
def RESHAPE(ctx, x, shape=None, *, new_shape=None):
    """Same elements, new shape (kernels/reshape.cc).

    The target comes from input 1 when it is a 1-D integer tensor, else the
    ``new_shape`` attribute (``[0]`` there is a legacy spelling of a scalar),
    else the output tensor's declared shape. One ``-1`` entry is inferred.
    """
    if shape is not None and np.asarray(shape).ndim == 1 and np.issubdtype(np.asarray(shape).dtype, np.integer):
        target = [int(d) for d in np.asarray(shape)]
    elif new_shape is not None:
        target = [int(d) for d in np.asarray(new_shape).reshape(-1)]
        if target == [0]:
            target = []
    else:
        declared = ctx.outputs[0].shape
        if declared is None:
            raise ctx.error("no shape input, no new_shape attribute and no declared output shape")
        target = [-1 if d is None else int(d) for d in declared]
    if target.count(-1) > 1 or any(d < -1 for d in target):
        raise ctx.error(f"invalid target shape {target}")
    if -1 in target:
        known = int(np.prod([d for d in target if d != -1]))
        if known == 0 or x.size % known:
            raise ctx.error(f"cannot reshape {x.size} elements to {target}")
        target[target.index(-1)] = x.size // known
    if int(np.prod(target)) != x.size:
        raise ctx.error(f"cannot reshape {list(x.shape)} ({x.size} elements) to {target}")
    return to_out(ctx, x.reshape(target))


def _axis_start(size, b, s, begin_masked):
    """TFLite's StridedSliceStartForAxis: a negative begin counts from the
    end, then clamps to ``[0, size]`` (stride > 0) or ``[-1, size - 1]``
    (stride < 0); ``begin_mask`` overrides it with the first element in the
    stride's direction."""
    if begin_masked:
        return 0 if s > 0 else size - 1
    lo, hi = (0, size) if s > 0 else (-1, size - 1)
    return min(max(b + size if b < 0 else b, lo), hi)


def _axis_stop(size, start, e, s, end_masked, offset):
    """TFLite's StridedSliceEndForAxis: like the start, but ``-1`` (stride
    < 0) means "past element 0"; with ``offset`` the end is the slice's
    length in input elements, ``stop = start + end``, without wrap-around."""
    lo, hi = (0, size) if s > 0 else (-1, size - 1)
    if end_masked:
        return size if s > 0 else -1
    stop = start + e if offset else (e + size if e < 0 else e)
    return min(max(stop, lo), hi)


@register("tflite", "STRIDED_SLICE", static_inputs=(1, 2, 3))
def STRIDED_SLICE(ctx, x, begin, end, strides=None, *, begin_mask=0, end_mask=0,
                  ellipsis_mask=0, new_axis_mask=0, shrink_axis_mask=0, offset=False):
    """``x[begin:end:strides]`` with TF's five masks (kernels/strided_slice.cc).

    Bit ``i`` of a mask refers to entry ``i`` of ``begin``/``end``/``strides``:

    * ``ellipsis_mask``: the entry stands for as many whole axes as the other
      entries leave unaccounted (at most one ellipsis, covering at least one
      axis; without one, the unspecified trailing axes are whole);
    * ``new_axis_mask``: insert a length-1 axis (ignored where the ellipsis
      bit is set; begin/end/stride/shrink of that entry are ignored);
    * ``begin_mask``/``end_mask``: ignore begin/end, take the whole range in
      the stride's direction;
    * ``shrink_axis_mask``: take the single element at the resolved start
      (TFLite resolves it like any start: begin_mask applies and an
      underflowing negative begin clamps to 0) and drop the axis; a start
      outside the axis is an error, and the stride's sign is ignored (LiteRT
      leaves the output unwritten for negative strides).

    ``offset=True`` makes ``end`` a length: ``stop = start + end``, clamped
    to the axis. LiteRT sizes such outputs ``ceil(end / stride)`` without
    clamping and reads out of bounds past the axis; the two agree whenever
    the slice fits.
    """
    begin = np.asarray(begin).reshape(-1)
    end = np.asarray(end).reshape(-1)
    strides = np.ones_like(begin) if strides is None else np.asarray(strides).reshape(-1)
    n = begin.size
    if end.size != n or strides.size != n:
        raise ctx.error(f"begin, end and strides have {n}, {end.size}, {strides.size} entries")
    bit = lambda mask, i: bool((int(mask) >> i) & 1)  # noqa: E731
    ellipses = [i for i in range(n) if bit(ellipsis_mask, i)]
    if len(ellipses) > 1:
        raise ctx.error(f"ellipsis_mask {ellipsis_mask} marks more than one ellipsis")
    consuming = [i for i in range(n) if not bit(ellipsis_mask, i) and not bit(new_axis_mask, i)]
    if len(consuming) > x.ndim:
        raise ctx.error(f"{len(consuming)} sliced axes for an input of rank {x.ndim}")
    ellipsis_axes = x.ndim - len(consuming)
    if ellipses and ellipsis_axes == 0:
        # TF reads this as an empty ellipsis; TFLite's kernel makes every
        # ellipsis cover at least one axis and drops the last entry instead.
        raise ctx.error("an ellipsis that covers no axis is ambiguous (TF and TFLite disagree)")
    spec = list(range(n)) + ([] if ellipses else ["..."])  # implicit trailing ellipsis

    index = []      # per input axis: int64 indices to take
    out_shape = []  # final shape, new axes included and shrunk axes dropped
    d = 0
    for i in spec:
        if i == "..." or bit(ellipsis_mask, i):
            for _ in range(ellipsis_axes if i != "..." else x.ndim - d):
                index.append(np.arange(x.shape[d]))
                out_shape.append(x.shape[d])
                d += 1
            continue
        if bit(new_axis_mask, i):
            out_shape.append(1)
            continue
        size, b, e, s = x.shape[d], int(begin[i]), int(end[i]), int(strides[i])
        if s == 0:
            raise ctx.error(f"stride of entry {i} is 0")
        start = _axis_start(size, b, s, bit(begin_mask, i))
        if bit(shrink_axis_mask, i):
            if not 0 <= start < size:
                raise ctx.error(f"shrink index {b} is out of range for an axis of {size}")
            index.append(np.array([start]))
        else:
            if offset and bit(end_mask, i):
                raise ctx.error("end_mask is meaningless with offset=True (end is the slice length)")
            idx = np.arange(start, _axis_stop(size, start, e, s, bit(end_mask, i), offset), s)
            index.append(idx)
            out_shape.append(idx.size)
        d += 1
    y = x
    for ax, idx in enumerate(index):
        y = np.take(y, idx, axis=ax)
    return to_out(ctx, y.reshape(out_shape))
