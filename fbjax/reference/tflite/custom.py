"""MediaPipe custom ops and TFLite's custom ``Roll`` (op set ``tflite.custom``)."""

from __future__ import annotations

import numpy as np

from ..registry import register
from . import positive_int, require_float, to_out


@register("tflite.custom", "Convolution2DTransposeBias")
def Convolution2DTransposeBias(ctx, x, w, b, *, padding="SAME", stride_w=1, stride_h=1):
    """Transposed 2-D convolution plus bias (MediaPipe's
    transpose_conv_bias.cc; LiteRT runs it through XNNPACK's deconvolution).

    ``x`` is ``[N, H, W, C]``, ``w`` is ``[O, KH, KW, C]``, ``b`` is ``[O]``.
    Input pixel ``(y, z)`` scatters ``x[y, z] . w[:, i, j, :]`` onto output
    pixel ``(y*stride - pad_top + i, z*stride - pad_left + j)``. The output is
    ``in * stride`` (SAME) or ``(in - 1) * stride + k`` (VALID) long; the
    padding is that of the forward convolution mapping the output back to the
    input: ``total = max((in - 1) * stride + k - out, 0)``, ``before = total // 2``.
    """
    require_float(ctx, x, w, b)
    if x.ndim != 4 or w.ndim != 4 or w.shape[3] != x.shape[3]:
        raise ctx.error(f"expected [N,H,W,C] input and [O,KH,KW,C] weights, got {x.shape} and {w.shape}")
    n, h, wd, c = x.shape
    o, kh, kw, _ = w.shape
    if b is not None and b.size != o:
        raise ctx.error(f"bias has {b.size} elements, expected {o}")
    sh, sw = positive_int(ctx, "stride_h", stride_h), positive_int(ctx, "stride_w", stride_w)
    if padding == "SAME":
        oh, ow = h * sh, wd * sw
    elif padding == "VALID":
        oh, ow = (h - 1) * sh + kh, (wd - 1) * sw + kw
    else:
        raise ctx.error(f"unknown padding {padding!r}; expected 'SAME' or 'VALID'")
    pt = max((h - 1) * sh + kh - oh, 0) // 2
    pl = max((wd - 1) * sw + kw - ow, 0) // 2

    # Scatter every tap into a canvas holding all positions any tap reaches
    # (and the whole output window), then crop the output window.
    full = np.zeros((n, max((h - 1) * sh + kh, pt + oh), max((wd - 1) * sw + kw, pl + ow), o))
    rows = x.astype(np.float64).reshape(-1, c)
    wf = w.astype(np.float64)
    for i in range(kh):
        for j in range(kw):
            contrib = (rows @ wf[:, i, j, :].T).reshape(n, h, wd, o)
            full[:, i:i + (h - 1) * sh + 1:sh, j:j + (wd - 1) * sw + 1:sw, :] += contrib
    y = full[:, pt:pt + oh, pl:pl + ow, :]
    if b is not None:
        y = y + b.astype(np.float64).reshape(o)
    return to_out(ctx, y)


@register("tflite.custom", "Roll", static_inputs=(2,))
def Roll(ctx, x, shift, axis):
    """``x`` rolled ``shift[i]`` places along ``axis[i]`` (TFLite's custom
    ``Roll``, ``tf.roll``): output index ``j`` along a rolled axis of length
    ``n`` takes input index ``(j - total shift) mod n``, the shifts of an axis
    named twice added up; a negative axis counts from the last.

    Raises:
        ModelFormatError: ``shift`` and ``axis`` of different sizes, an axis
            out of range.
    """
    x = np.asarray(x)
    axes = [int(a) for a in np.asarray(axis).reshape(-1)]
    shifts = [int(s) for s in np.asarray(shift).reshape(-1)]
    if len(shifts) != len(axes):
        raise ctx.error(f"shift has {len(shifts)} elements and axis {len(axes)}: they must have one per rolled axis")
    total = {}
    for a, s in zip(axes, shifts):
        if not -x.ndim <= a < x.ndim:
            raise ctx.error(f"axis {a} is out of range for a rank-{x.ndim} input")
        total[a % x.ndim] = total.get(a % x.ndim, 0) + s
    out = x
    for a, s in total.items():
        n = x.shape[a]
        if n:
            src = (np.arange(n) - s) % n  # output j reads input (j - s) mod n
            out = np.take(out, src, axis=a)
    return out
