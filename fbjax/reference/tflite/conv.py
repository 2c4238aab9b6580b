"""Convolution-like TFLite ops: CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED.

All in NHWC with TFLite's weight layouts, accumulated in float64 one kernel
tap at a time (im2col per tap), then rounded once to the output dtype.
"""

from __future__ import annotations

import numpy as np

from ..registry import register
from . import fused_activation, nhwc_taps, positive_int, require_float, to_out, window_geometry


def _check_bias(ctx, b, channels):
    if b is not None and b.size != channels:
        raise ctx.error(f"bias has {b.size} elements, expected {channels} (one per output channel)")


@register("tflite", "CONV_2D")
def CONV_2D(ctx, x, w, b=None, *, padding="SAME", stride_w=1, stride_h=1,
            dilation_w_factor=1, dilation_h_factor=1, fused_activation_function="NONE"):
    """2-D convolution (kernels/conv.cc, reference_ops::Conv).

    ``x`` is ``[N, H, W, C]``, ``w`` is ``[O, KH, KW, I]``, ``b`` is ``[O]``.
    When ``C > I`` it is a grouped convolution with ``groups = C / I``: output
    channel ``o`` belongs to group ``o // (O / groups)`` and reads input
    channels ``[g*I, (g+1)*I)``.
    """
    require_float(ctx, x, w, b)
    if x.ndim != 4 or w.ndim != 4:
        raise ctx.error(f"expected 4-D input and weights, got {x.shape} and {w.shape}")
    n, h, wd, c = x.shape
    o, kh, kw, i_ch = w.shape
    if i_ch == 0 or c % i_ch:
        raise ctx.error(f"input has {c} channels, not a multiple of the weights' {i_ch}")
    groups = c // i_ch
    if o % groups:
        raise ctx.error(f"{o} output channels do not split into {groups} groups")
    _check_bias(ctx, b, o)
    sh, sw = positive_int(ctx, "stride_h", stride_h), positive_int(ctx, "stride_w", stride_w)
    dh = positive_int(ctx, "dilation_h_factor", dilation_h_factor)
    dw = positive_int(ctx, "dilation_w_factor", dilation_w_factor)
    oh, pt, pb = window_geometry(ctx, padding, h, kh, sh, dh)
    ow, pl, pr = window_geometry(ctx, padding, wd, kw, sw, dw)

    og = o // groups
    # wg[g, i, j, ci, co]: weights of group g, tap (i, j), as a [I, O/groups] matrix.
    wg = w.astype(np.float64).reshape(groups, og, kh, kw, i_ch).transpose(0, 2, 3, 4, 1)
    acc = np.zeros((groups, n * oh * ow, og))
    pads = ((pt, pb), (pl, pr))
    for i, j, tap in nhwc_taps(x.astype(np.float64), kh, kw, sh, sw, dh, dw, pads, (oh, ow)):
        cols = tap.reshape(n * oh * ow, groups, i_ch).transpose(1, 0, 2)  # [G, M, I]
        acc += np.matmul(cols, wg[:, i, j])
    y = acc.transpose(1, 0, 2).reshape(n, oh, ow, o)
    if b is not None:
        y = y + b.astype(np.float64).reshape(o)
    return to_out(ctx, fused_activation(ctx, y, fused_activation_function))


@register("tflite", "DEPTHWISE_CONV_2D")
def DEPTHWISE_CONV_2D(ctx, x, w, b=None, *, padding="SAME", stride_w=1, stride_h=1,
                      depth_multiplier=0, dilation_w_factor=1, dilation_h_factor=1,
                      fused_activation_function="NONE"):
    """Depthwise 2-D convolution (kernels/depthwise_conv.cc).

    ``x`` is ``[N, H, W, C]``, ``w`` is ``[1, KH, KW, C*M]``: output channel
    ``c*M + m`` reads input channel ``c`` only. ``M`` comes from the weights'
    shape; the ``depth_multiplier`` attribute is redundant (the schema says
    kernels after TF 2.0 ignore it) and is ignored here.
    """
    require_float(ctx, x, w, b)
    if x.ndim != 4 or w.ndim != 4 or w.shape[0] != 1:
        raise ctx.error(f"expected [N,H,W,C] input and [1,KH,KW,C*M] weights, got {x.shape} and {w.shape}")
    n, h, wd, c = x.shape
    _, kh, kw, cm = w.shape
    if c == 0 or cm % c:
        raise ctx.error(f"weights have {cm} channels, not a multiple of the input's {c}")
    m = cm // c
    _check_bias(ctx, b, cm)
    sh, sw = positive_int(ctx, "stride_h", stride_h), positive_int(ctx, "stride_w", stride_w)
    dh = positive_int(ctx, "dilation_h_factor", dilation_h_factor)
    dw = positive_int(ctx, "dilation_w_factor", dilation_w_factor)
    oh, pt, pb = window_geometry(ctx, padding, h, kh, sh, dh)
    ow, pl, pr = window_geometry(ctx, padding, wd, kw, sw, dw)

    wf = w.astype(np.float64)[0]  # [KH, KW, C*M]
    acc = np.zeros((n, oh, ow, cm))
    pads = ((pt, pb), (pl, pr))
    for i, j, tap in nhwc_taps(x.astype(np.float64), kh, kw, sh, sw, dh, dw, pads, (oh, ow)):
        # np.repeat puts copy m of channel c at index c*M + m.
        acc += (np.repeat(tap, m, axis=3) if m > 1 else tap) * wf[i, j]
    if b is not None:
        acc = acc + b.astype(np.float64).reshape(cm)
    return to_out(ctx, fused_activation(ctx, acc, fused_activation_function))


@register("tflite", "FULLY_CONNECTED")
def FULLY_CONNECTED(ctx, x, w, b=None, *, fused_activation_function="NONE",
                    weights_format="DEFAULT", keep_num_dims=False, asymmetric_quantize_inputs=False):
    """``y = x @ w.T + b`` (kernels/fully_connected.cc, float path).

    ``asymmetric_quantize_inputs`` only applies to the hybrid kernel (int8
    weights: the ``"tflite.hybrid"`` twin); the float path ignores it, as the
    lowering does.

    ``w`` is ``[O, I]``. With ``keep_num_dims`` the output is
    ``x.shape[:-1] + (O,)``; without it ``x`` is flattened to ``[-1, I]`` and
    the output is ``[x.size / I, O]``.
    """
    require_float(ctx, x, w, b)
    if weights_format != "DEFAULT":
        raise ctx.error(f"weights_format {weights_format!r} is only defined for quantized uint8 weights")
    if w.ndim != 2:
        raise ctx.error(f"weights must be [O, I], got shape {w.shape}")
    o, i_ch = w.shape
    _check_bias(ctx, b, o)
    if keep_num_dims:
        if x.ndim == 0 or x.shape[-1] != i_ch:
            raise ctx.error(f"input shape {x.shape} does not end in the weights' {i_ch} input features")
        out_shape = x.shape[:-1] + (o,)
    else:
        if i_ch == 0 or x.size % i_ch:
            raise ctx.error(f"input of {x.size} elements does not flatten to rows of {i_ch}")
        out_shape = (x.size // i_ch, o)
    y = x.astype(np.float64).reshape(-1, i_ch) @ w.astype(np.float64).T
    if b is not None:
        y = y + b.astype(np.float64).reshape(o)
    return to_out(ctx, fused_activation(ctx, y.reshape(out_shape), fused_activation_function))
