"""MediaPipe custom ops found in TFLite files, and TFLite's own custom ``Roll`` (op set ``tflite.custom``)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ... import op_rules
from .. import kernels
from ..registry import register
from .elementwise import require_unquantized


@register("tflite.custom", "Convolution2DTransposeBias")
def Convolution2DTransposeBias(ctx, x, w, b=None, *, padding="SAME", stride_w=1, stride_h=1):
    """MediaPipe ``Convolution2DTransposeBias``
    (``mediapipe/util/tflite/operations/transpose_conv_bias.cc``): transposed
    convolution plus bias.

    ``x`` NHWC ``[N, H, W, I]``, ``w`` ``[O, KH, KW, I]``, ``b`` ``[O]``.
    Output size per TF rules: ``SAME`` ``in * stride``, ``VALID``
    ``(in - 1) * stride + k`` -- or the file's recorded output size when it
    exceeds that by less than a stride (the extra positions hold only the
    bias), as XNNPACK does; padding before is the forward convolution's TF
    ``SAME`` padding of the output, ``max(k - stride, 0) // 2``, and 0 for
    ``VALID``. Returns ``[N, OH, OW, O]``.
    """
    require_unquantized(ctx, "Convolution2DTransposeBias")
    if x.ndim != 4 or w.ndim != 4:
        raise ctx.error(f"expected a 4-D input and 4-D OHWI weights, got shapes {x.shape} and {w.shape}")
    if w.shape[3] != x.shape[3]:
        raise ctx.error(f"weights expect {w.shape[3]} input channels, input has {x.shape[3]}")
    strides = (int(stride_h), int(stride_w))
    if min(strides) < 1:
        raise ctx.error(f"strides must be >= 1, got {strides}")
    ks = w.shape[1:3]
    if padding == "SAME":
        out = [i * s for i, s in zip(x.shape[1:3], strides)]
    elif padding == "VALID":
        out = [(i - 1) * s + k for i, s, k in zip(x.shape[1:3], strides, ks)]
    else:
        raise ctx.error(f"unsupported padding {padding!r} (expected 'SAME' or 'VALID')")
    # XNNPACK (LiteRT's only kernel for this op) sizes the output from the
    # file's output tensor: (out - k) % stride extra rows/cols of bias only.
    rec = ctx.outputs[0].shape if ctx.outputs and ctx.outputs[0] is not None else None
    if rec is not None and len(rec) == 4:
        for d in range(2):
            r = rec[1 + d]
            if r is not None and out[d] <= r < out[d] + strides[d]:
                out[d] = int(r)
    # Padding of the forward convolution that maps the output back to x.
    pads = kernels.explicit_padding(padding, out, ks, strides)
    y = kernels.conv_transpose(x, w, strides=strides, padding=pads, output_sizes=out,
                               dimension_numbers=("NHWC", "OHWI", "NHWC"), backend=getattr(ctx, "backend", None),
                               options=kernels.kernel_options(ctx))
    if b is not None:
        if tuple(b.shape) != (w.shape[0],):
            raise ctx.error(f"bias shape {tuple(b.shape)} does not match {w.shape[0]} output channels")
        y = y + b
    return y


def _roll_batch(node, carrying, batch) -> None:
    """``Roll`` follows a batch unless an axis is dimension 0 (it would move
    examples into each other's places)."""
    axes = op_rules.const(node.inputs[2]) if len(node.inputs) > 2 else None
    r = op_rules.rank(node.inputs[0] if node.inputs else None)
    for a in op_rules.ints(axes):
        op_rules.refuse_axis0(node, a, r)


def roll_axes(ctx, shape: tuple, shift, axis) -> list:
    """``[(axis, shift)]`` of a ``Roll`` node, one per named axis (in range,
    non-negative), the shifts of an axis named twice added up.

    Raises:
        ModelFormatError: ``shift`` and ``axis`` of different sizes, or an
            axis outside ``[-rank, rank)``.
    """
    axes = [int(a) for a in np.asarray(axis).reshape(-1)]
    n_shift = int(np.prod(np.shape(shift), dtype=np.int64))
    if n_shift != len(axes):
        raise ctx.error(f"shift has {n_shift} elements and axis {len(axes)}: they must have one per rolled axis")
    rank = len(shape)
    bad = [a for a in axes if not -rank <= a < rank]
    if bad:
        raise ctx.error(f"axis {bad[0]} is out of range for a rank-{rank} input")
    return [(a % rank, k) for k, a in enumerate(axes)]


@register("tflite.custom", "Roll", static_inputs=(2,), batch=_roll_batch)
def Roll(ctx, x, shift, axis):
    """TFLite's custom ``Roll`` (``tensorflow/lite/kernels/roll.cc``,
    ``tf.roll``): ``x`` with its elements moved ``shift[i]`` places along
    ``axis[i]``, wrapping around (a negative shift moves them toward index 0,
    a negative axis counts from the last; an axis named twice rolls by the
    sum of its shifts). ``shift`` and ``axis`` are int32/int64 scalars or
    1-D of one size; ``axis`` is a load-time constant, ``shift`` may be
    computed. Any dtype; the output has ``x``'s shape.

    Raises:
        ModelFormatError: see :func:`roll_axes`.
    """
    x = jnp.asarray(x)
    shifts = jnp.asarray(shift).reshape(-1)
    for a, k in roll_axes(ctx, x.shape, shift, axis):
        x = jnp.roll(x, shifts[k], axis=a)
    return x
