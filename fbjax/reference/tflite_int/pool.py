"""numpy twins of the integer-exact TFLite pooling and reductions."""

from __future__ import annotations

import numpy as np

from ...errors import InputError
from ..registry import register
from .fixedpoint import act_range, mbqm, multipliers, qrange, rdbpot, round_half_away, srdhm, sz

OP_SET = "tflite.int"


def _same(n, k, s):
    out = -(-n // s)
    total = max((out - 1) * s + k - n, 0)
    return total // 2


def _windows(x, padding, sh, sw, fh, fw):
    n, h, w, c = x.shape
    if padding == "SAME":
        oh, ow, pt, pl = -(-h // sh), -(-w // sw), _same(h, fh, sh), _same(w, fw, sw)
    else:
        oh, ow, pt, pl = (h - fh) // sh + 1, (w - fw) // sw + 1, 0, 0
    for oy in range(oh):
        for ox in range(ow):
            y0, x0 = oy * sh - pt, ox * sw - pl
            ys = slice(max(y0, 0), min(y0 + fh, h))
            xs = slice(max(x0, 0), min(x0 + fw, w))
            yield oy, ox, x[:, ys, xs, :]


def _pool(ctx, x, fn, padding, stride_w, stride_h, filter_width, filter_height, fused):
    x = np.asarray(x, np.int64)
    outs = {}
    for oy, ox, win in _windows(x, padding, stride_h, stride_w, filter_height, filter_width):
        outs[(oy, ox)] = fn(win)
    oh = max(k[0] for k in outs) + 1
    ow = max(k[1] for k in outs) + 1
    y = np.zeros((x.shape[0], oh, ow, x.shape[3]), np.int64)
    for (oy, ox), v in outs.items():
        y[:, oy, ox, :] = v
    lo, hi = act_range(ctx, fused, ctx.outputs[0])
    return np.clip(y, lo, hi).astype(ctx.outputs[0].dtype)


def _avg(win):
    cnt = win.shape[1] * win.shape[2]
    s = win.sum(axis=(1, 2))
    num = np.where(s > 0, s + cnt // 2, s - cnt // 2)
    return np.sign(num) * (np.abs(num) // cnt)


@register(OP_SET, "AVERAGE_POOL_2D")
def AVERAGE_POOL_2D(ctx, x, *, padding="SAME", stride_w=1, stride_h=1, filter_width=1, filter_height=1,
                    fused_activation_function="NONE"):
    """Reference quantized AVERAGE_POOL_2D."""
    return _pool(ctx, x, _avg, padding, stride_w, stride_h, filter_width, filter_height,
                 fused_activation_function)


@register(OP_SET, "MAX_POOL_2D")
def MAX_POOL_2D(ctx, x, *, padding="SAME", stride_w=1, stride_h=1, filter_width=1, filter_height=1,
                fused_activation_function="NONE"):
    """Reference quantized MAX_POOL_2D."""
    return _pool(ctx, x, lambda w: w.max(axis=(1, 2)), padding, stride_w, stride_h, filter_width,
                 filter_height, fused_activation_function)


def _reduce(ctx, x, axis, keep_dims, compute_sum):
    vi, vo = ctx.inputs[0], ctx.outputs[0]
    si, zi = sz(ctx, vi)
    so, zo = sz(ctx, vo)
    x = np.asarray(x, np.int64)
    axes = tuple(sorted({int(a) % x.ndim for a in np.asarray(axis).reshape(-1)}))
    n = int(np.prod([x.shape[a] for a in axes]))
    if n == 0:  # LiteRT leaves the result uninitialised: no defined value
        raise InputError(f"{ctx.node.location} ({ctx.node.op_name}): the quantized input has shape "
                         f"{tuple(x.shape)}; its reduction over the empty axes {list(axes)} has no defined value")
    lo, hi = qrange(vo.dtype)
    (m,), (s,) = multipliers([float(si) / float(so)])
    S = x.sum(axis=axes, keepdims=bool(keep_dims))
    if compute_sum:
        scale = np.float32(si / so)
        bias = np.float32(np.float32(np.float32(-zi) * scale) * np.float32(n))
        f = (S.astype(np.float32) * scale).astype(np.float32) + bias
        y = round_half_away(f) + zo
    elif x.ndim == 4 and axes == (1, 2) and keep_dims and np.dtype(vi.dtype).itemsize == 1:  # int8/uint8 only
        f32 = np.float32
        t = f32(f32(f32(zi) * si) / so)
        t = f32(t + f32(0.5)) if t > 0 else f32(t - f32(0.5))
        (m2,), (s2,) = multipliers([float(f32(si / f32(f32(n) * so)))])
        h = srdhm(S * (np.int64(1) << max(int(s2), 0)), m2)
        r = max(-int(s2), 0)
        up = (h + ((1 << (r - 1)) if r else 0)) >> r          # 16-channel vector body: ties up
        away = rdbpot(h, r)                                    # scalar tail: ties away from zero
        c = x.shape[3]
        tail = (np.arange(c) >= c - c % 16).reshape(1, 1, 1, c)
        y = np.where(tail, away, up) + (zo - int(t))
    else:
        sh = min(n.bit_length() - 1, 32, 31 + int(s))
        m2 = (int(m) << sh) // n
        y = mbqm(S - zi * n, m2, int(s) - sh) + zo
    return np.clip(y, lo, hi).astype(vo.dtype).reshape(
        vo.shape if vo.static_shape else np.shape(y))


@register(OP_SET, "MEAN")
def MEAN(ctx, x, axis, *, keep_dims=False):
    """Reference quantized MEAN."""
    return _reduce(ctx, x, axis, keep_dims, False)


@register(OP_SET, "SUM")
def SUM(ctx, x, axis, *, keep_dims=False):
    """Reference quantized SUM."""
    return _reduce(ctx, x, axis, keep_dims, True)
