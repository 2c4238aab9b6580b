"""numpy twins of the integer-exact TFLite convolutions (op set ``"tflite.int"``).

Direct int64 loops over kernel taps; padding from the TF ``SAME`` rule.
"""

from __future__ import annotations

import math

import numpy as np

from ..registry import register
from .fixedpoint import act_range, mbqm, mbqm64, multipliers, qp, srdhm, sz, wrap32

OP_SET = "tflite.int"


def _same(n, k, s, d):
    out = -(-n // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - n, 0)
    return total // 2, total - total // 2


def _pads(padding, hw, khw, strides, dil):
    if padding == "VALID":
        return [(0, 0), (0, 0)]
    return [_same(n, k, s, d) for n, k, s, d in zip(hw, khw, strides, dil)]


def _centered(ctx, x, v):
    s, z = qp(ctx, v)
    return np.asarray(x, np.int64) - z[0]


def _wcentered(ctx, w, v):
    s, z = qp(ctx, v)
    w = np.asarray(w, np.int64)
    if z.size > 1:
        shape = [1] * w.ndim
        shape[v.quant.quantized_dimension] = z.size
        return w - z.reshape(shape)
    return w - z[0]


def _mults(ctx, n, float_product=False):
    s_in, _ = sz(ctx, ctx.inputs[0] if ctx.node.op_name != "TRANSPOSE_CONV" else ctx.inputs[2])
    s_out, _ = sz(ctx, ctx.outputs[0])
    s_w, _ = qp(ctx, ctx.inputs[1])
    s_w = np.broadcast_to(s_w, (n,))
    if float_product:
        reals = [float(np.float32(s_in) * np.float32(w)) / float(s_out) for w in s_w]
    else:
        reals = [float(s_in) * float(w) / float(s_out) for w in s_w]
    return multipliers(reals)


def gemm_rescale(x, m, shift):
    """x86 gemm output stage (builtin int8 CONV_2D/FULLY_CONNECTED):
    SRDHM, then a right shift whose ties go toward +inf."""
    shift = np.asarray(shift, np.int64)
    left, right = np.maximum(shift, 0), np.maximum(-shift, 0)
    y = srdhm(wrap32(np.asarray(x, np.int64) * (np.int64(1) << left)), m)
    return (y + np.where(right > 0, np.int64(1) << np.maximum(right - 1, 0), 0)) >> right


def _finish(ctx, acc, n, fused, bias_pos, float_product=False, force64=False, gemm=False, wide_gemm=False):
    m, s = _mults(ctx, n, float_product)
    bv = ctx.inputs[bias_pos] if len(ctx.inputs) > bias_pos else None
    wide = np.dtype(ctx.outputs[0].dtype) == np.int16
    if wide and (force64 or (bv is not None and np.dtype(bv.dtype) == np.int64)):
        y = mbqm64(acc, m, s)
    elif gemm and (not wide or wide_gemm):
        # (16x8 FULLY_CONNECTED without an int64 bias: int32 accumulator, gemm output stage)
        y = gemm_rescale(wrap32(np.asarray(acc, np.int64)) if wide else acc, m, s)
    else:
        y = mbqm(acc, m, s)
    _, zo = sz(ctx, ctx.outputs[0])
    lo, hi = act_range(ctx, fused, ctx.outputs[0])
    return np.clip(y + zo, lo, hi).astype(ctx.outputs[0].dtype)


@register(OP_SET, "CONV_2D")
def CONV_2D(ctx, x, w, b=None, *, padding="SAME", stride_w=1, stride_h=1, dilation_w_factor=1,
            dilation_h_factor=1, fused_activation_function="NONE"):
    """Reference quantized CONV_2D: int64 tap loop, per-channel rescale."""
    xc = _centered(ctx, x, ctx.inputs[0])
    wc = _wcentered(ctx, w, ctx.inputs[1])
    n, h, wd, c = xc.shape
    o, kh, kw, i = wc.shape
    groups = c // i
    st, dl = (stride_h, stride_w), (dilation_h_factor, dilation_w_factor)
    (pt, pb), (pl, pr) = _pads(padding, (h, wd), (kh, kw), st, dl)
    xp = np.pad(xc, [(0, 0), (pt, pb), (pl, pr), (0, 0)])
    oh = (h + pt + pb - (kh - 1) * dl[0] - 1) // st[0] + 1
    ow = (wd + pl + pr - (kw - 1) * dl[1] - 1) // st[1] + 1
    acc = np.zeros((n, oh, ow, o), np.int64)
    og = o // groups
    for ky in range(kh):
        for kx in range(kw):
            patch = xp[:, ky * dl[0]: ky * dl[0] + (oh - 1) * st[0] + 1: st[0],
                       kx * dl[1]: kx * dl[1] + (ow - 1) * st[1] + 1: st[1], :]
            for g in range(groups):
                acc[..., g * og:(g + 1) * og] += np.einsum(
                    "nhwi,oi->nhwo", patch[..., g * i:(g + 1) * i], wc[g * og:(g + 1) * og, ky, kx, :])
    if b is not None:
        acc += np.asarray(b, np.int64)
    return _finish(ctx, acc, o, fused_activation_function, 2, gemm=True)


@register(OP_SET, "DEPTHWISE_CONV_2D")
def DEPTHWISE_CONV_2D(ctx, x, w, b=None, *, padding="SAME", stride_w=1, stride_h=1, depth_multiplier=0,
                      dilation_w_factor=1, dilation_h_factor=1, fused_activation_function="NONE"):
    """Reference quantized DEPTHWISE_CONV_2D (channel ``c*M+m`` reads input ``c``)."""
    xc = _centered(ctx, x, ctx.inputs[0])
    wc = _wcentered(ctx, w, ctx.inputs[1])[0]
    n, h, wd, c = xc.shape
    kh, kw, oc = wc.shape
    mult = oc // c
    xr = np.repeat(xc, mult, axis=3)
    st, dl = (stride_h, stride_w), (dilation_h_factor, dilation_w_factor)
    (pt, pb), (pl, pr) = _pads(padding, (h, wd), (kh, kw), st, dl)
    xp = np.pad(xr, [(0, 0), (pt, pb), (pl, pr), (0, 0)])
    oh = (h + pt + pb - (kh - 1) * dl[0] - 1) // st[0] + 1
    ow = (wd + pl + pr - (kw - 1) * dl[1] - 1) // st[1] + 1
    acc = np.zeros((n, oh, ow, oc), np.int64)
    for ky in range(kh):
        for kx in range(kw):
            acc += xp[:, ky * dl[0]: ky * dl[0] + (oh - 1) * st[0] + 1: st[0],
                      kx * dl[1]: kx * dl[1] + (ow - 1) * st[1] + 1: st[1], :] * wc[ky, kx]
    if b is not None:
        acc += np.asarray(b, np.int64)
    # 8-bit: the builtin kernel's 8-channel vector body rounds the final
    # shift's ties up (gemm-like), its scalar tail (last oc % 8) away from zero
    y = _finish(ctx, acc, oc, fused_activation_function, 2, gemm=True)
    tail = oc % 8
    if tail:
        y[..., oc - tail:] = _finish(ctx, acc, oc, fused_activation_function, 2)[..., oc - tail:]
    return y




@register(OP_SET, "FULLY_CONNECTED")
def FULLY_CONNECTED(ctx, x, w, b=None, *, fused_activation_function="NONE", weights_format="DEFAULT",
                    keep_num_dims=False, asymmetric_quantize_inputs=False, quantized_bias_type=None):
    """Reference quantized FULLY_CONNECTED (int16 with an int64 bias type:
    requantized in double, ``round(acc * s_in * s_w / s_out)``)."""
    o, i = np.shape(w)
    x = np.asarray(x)
    lead = x.shape[:-1] if keep_num_dims else (x.size // i,)
    acc = _centered(ctx, x.reshape(-1, i), ctx.inputs[0]) @ _wcentered(ctx, w, ctx.inputs[1]).T
    if b is not None:
        acc = acc + np.asarray(b, np.int64)
    if np.dtype(ctx.inputs[0].dtype) == np.int16:
        (si,), zi = qp(ctx, ctx.inputs[0])
        (so,), zo = qp(ctx, ctx.outputs[0])
        sw, zw = qp(ctx, ctx.inputs[1])
        wide_bias = b is not None and np.asarray(b).dtype == np.int64
        if zi.any() or zo.any() or zw.any() or wide_bias or (
                quantized_bias_type is not None and np.dtype(quantized_bias_type) == np.int64):
            out = np.empty(acc.shape, np.int64)
            sw = np.broadcast_to(sw, (o,))
            for (r, c), a in np.ndenumerate(acc):
                v = float(a) * (float(si) * float(sw[c]) / float(so))
                t = math.trunc(v)  # std::round: half away from zero
                out[r, c] = t + (int(math.copysign(1, v)) if abs(v - t) >= 0.5 else 0) + int(zo[0])
            lo, hi = act_range(ctx, fused_activation_function, ctx.outputs[0])
            return np.clip(out, lo, hi).astype(np.int16).reshape(tuple(lead) + (o,))
    wq = ctx.inputs[1].quant
    fprod = wq is not None and np.asarray(wq.scale).size == 1 and np.dtype(ctx.inputs[0].dtype) != np.int16
    return _finish(ctx, acc, o, fused_activation_function, 2, float_product=fprod, gemm=True,
                   wide_gemm=True).reshape(tuple(lead) + (o,))


@register(OP_SET, "TRANSPOSE_CONV")
def TRANSPOSE_CONV(ctx, output_shape, w, x, b=None, *, padding="SAME", stride_w=1, stride_h=1,
                   fused_activation_function="NONE"):
    """Reference quantized TRANSPOSE_CONV: scatter-accumulate every input tap."""
    oshape = [int(d) for d in np.asarray(output_shape).reshape(-1)]
    xc = _centered(ctx, x, ctx.inputs[2])
    wc = _wcentered(ctx, w, ctx.inputs[1])
    n, h, wd, c = xc.shape
    o, kh, kw, _ = wc.shape
    st = (stride_h, stride_w)
    pt = _pads(padding, oshape[1:3], (kh, kw), st, (1, 1))
    acc = np.zeros((n, oshape[1], oshape[2], o), np.int64)
    for iy in range(h):
        for ix in range(wd):
            for ky in range(kh):
                for kx in range(kw):
                    oy, ox = iy * st[0] - pt[0][0] + ky, ix * st[1] - pt[1][0] + kx
                    if 0 <= oy < oshape[1] and 0 <= ox < oshape[2]:
                        acc[:, oy, ox, :] += xc[:, iy, ix, :] @ wc[:, ky, kx, :].T
    if b is not None:
        acc += np.asarray(b, np.int64)
    return _finish(ctx, acc, o, fused_activation_function, 3, force64=True)


@register(OP_SET, "BATCH_MATMUL")
def BATCH_MATMUL(ctx, a, b, *, adj_x=False, adj_y=False, asymmetric_quantize_inputs=False):
    """Reference quantized BATCH_MATMUL."""
    ac = _centered(ctx, a, ctx.inputs[0])
    bc = _centered(ctx, b, ctx.inputs[1])
    if adj_x:
        ac = np.swapaxes(ac, -1, -2)
    if adj_y:
        bc = np.swapaxes(bc, -1, -2)
    acc = np.matmul(ac, bc)
    sa, _ = sz(ctx, ctx.inputs[0])
    sb, _ = sz(ctx, ctx.inputs[1])
    so, zo = sz(ctx, ctx.outputs[0])
    m, s = multipliers([float(np.float32(np.float32(sa * sb) / so))])
    y = mbqm64(acc, m[0], s[0]) if np.dtype(ctx.outputs[0].dtype) == np.int16 else mbqm(acc, m[0], s[0])
    lo, hi = act_range(ctx, "NONE", ctx.outputs[0])
    return np.clip(y + zo, lo, hi).astype(ctx.outputs[0].dtype)
