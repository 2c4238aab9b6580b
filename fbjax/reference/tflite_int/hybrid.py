"""numpy twins of TFLite's hybrid (dynamic-range) kernels: op set ``"tflite.hybrid"``.

Float activations, int8 constant weights. Each kernel quantizes its float
input on the fly (per batch row, or per image for convolutions), accumulates
integer products exactly (int64 here), and scales the sum back to float32:
``float32(acc) * float32(s_x * s_w) + bias`` with two float32 roundings
(DEPTHWISE_CONV_2D: ``(float32(acc) * s_w) * s_x + bias``), then the fused
activation in float. Written from LiteRT's builtin x86
kernels (no XNNPACK) and checked against them, independently of
:mod:`fbjax.lower.tflite_int.hybrid`:

* symmetric input quantization (``SymmetricQuantizeFloats``):
  ``range = max|x|``, ``s = range / 127``, ``q = round_half_away(x * (127 /
  range))`` clamped to [-127, 127], all float32; a zero row gives ``s = 1``,
  ``q = 0``;
* asymmetric (``AsymmetricQuantizeFloats``, ``asymmetric_quantize_inputs``,
  per-channel CONV_2D, and always for DEPTHWISE_CONV_2D and TRANSPOSE_CONV):
  ``rmin = min(0, min x)``, ``rmax = max(0, max x)`` in float32, the scale
  ``(rmax - rmin) / 255`` in double from the float32 difference, the zero
  point chosen in double as in TFLite's ``ChooseQuantizationParams`` (the end
  with the smaller error, rounded half away, clamped to [-128, 127]),
  ``s = float32(scale)``, ``q = zp + round_half_away(x * float32(1 / s))``
  (float32 product) clamped to [-128, 127]; the integer sum is
  corrected by ``zp * sum(w)`` (padded conv taps read the zero point, i.e.
  real 0).
"""

from __future__ import annotations

import numpy as np

from ..registry import register
from ..tflite import nhwc_taps, window_geometry

OP_SET = "tflite.hybrid"
F = np.float32


def round_half_away(x):
    """``std::round``: half away from zero (exact on float32 input)."""
    x = np.asarray(x, np.float64)
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def symmetric_quantize(values):
    """TFLite ``SymmetricQuantizeFloats`` of one float32 block: ``(q int64, scale float32)``."""
    v = np.asarray(values, F).reshape(-1)
    rng = F(max(abs(F(v.min())), abs(F(v.max())))) if v.size else F(0)
    if rng == 0:
        return np.zeros(v.shape, np.int64), F(1)
    scale = F(rng / F(127))
    inv = F(F(127) / rng)
    q = round_half_away((v * inv).astype(F))
    return np.clip(q, -127, 127).astype(np.int64), scale


def asymmetric_quantize(values):
    """TFLite ``AsymmetricQuantizeFloats`` of one float32 block:
    ``(q int64, scale float32, zero_point int)``."""
    v = np.asarray(values, F).reshape(-1)
    rmin = min(F(0), F(v.min())) if v.size else F(0)
    rmax = max(F(0), F(v.max())) if v.size else F(0)
    if rmin == rmax:
        return np.zeros(v.shape, np.int64), F(1), 0
    scale = float(F(rmax - rmin)) / 255.0
    zp_from_min = -128.0 - float(rmin) / scale
    zp_from_max = 127.0 - float(rmax) / scale
    err_min = 128.0 + abs(float(rmin) / scale)
    err_max = 127.0 + abs(float(rmax) / scale)
    zp_d = zp_from_min if err_min < err_max else zp_from_max
    if zp_d <= -128.0:
        zp = -128
    elif zp_d >= 127.0:
        zp = 127
    else:
        zp = int(round_half_away(zp_d))
    s = F(scale)
    inv = F(1.0 / float(s))
    q = zp + round_half_away((v * inv).astype(F))  # rounded, then the zero point added
    return np.clip(q, -128, 127).astype(np.int64), s, zp


def quantize_blocks(x2d, asymmetric):
    """Quantize each row of ``x2d``: ``(q [R, N] int64, scale [R] float32, zp [R] int64)``."""
    x2d = np.asarray(x2d, F)
    q = np.zeros(x2d.shape, np.int64)
    s = np.ones(x2d.shape[0], F)
    z = np.zeros(x2d.shape[0], np.int64)
    for r in range(x2d.shape[0]):
        if asymmetric:
            q[r], s[r], z[r] = asymmetric_quantize(x2d[r])
        else:
            q[r], s[r] = symmetric_quantize(x2d[r])
    return q, s, z


def activation(ctx, y, fused):
    """Float fused activation (``ActivationFunctionWithMinMax``)."""
    y = np.asarray(y, F)
    if fused in (None, "NONE"):
        return y
    if fused == "RELU":
        return np.maximum(y, F(0))
    if fused == "RELU6":
        return np.minimum(np.maximum(y, F(0)), F(6))
    if fused == "RELU_N1_TO_1":
        return np.minimum(np.maximum(y, F(-1)), F(1))
    raise ctx.error(f"fused activation {fused} is not supported by the hybrid kernels")


def weight_scales(ctx, n):
    """Weight scales broadcast to ``n`` output channels (float32)."""
    v = ctx.inputs[1]
    if v.quant is None or np.asarray(v.quant.scale).size == 0:
        raise ctx.error(f"weights {v.name!r} have no quantization parameters")
    s = np.asarray(v.quant.scale, F).reshape(-1)
    if s.size not in (1, n):
        raise ctx.error(f"{s.size} weight scales for {n} output channels")
    if np.any(np.asarray(v.quant.zero_point).reshape(-1) != 0):
        raise ctx.error("hybrid kernels need symmetric weights (zero point 0)")
    return np.broadcast_to(s, (n,)).astype(F)


def is_per_channel(ctx):
    """TFLite's conv test: more than one weight scale, not all equal."""
    s = np.asarray(ctx.inputs[1].quant.scale, F).reshape(-1)
    return s.size > 1 and bool(np.any(s != s[0]))


def scale_out(acc, scale, bias):
    """``float32(acc) * scale + bias`` with two float32 roundings."""
    y = (np.asarray(acc, np.float64).astype(F) * np.asarray(scale, F)).astype(F)
    if bias is not None:
        y = (y + np.asarray(bias, F)).astype(F)
    return y


def fc_blockwise(ctx, x2d, w, b):
    """FULLY_CONNECTED with blockwise int4 weights (``EvalBlockwise4Bit``),
    element by element in float32 as the kernel loops: rows quantized
    asymmetrically; per output channel, block by block, ``out += f32(int sum)
    * scale`` and ``kfsum += scale * f32(sum of the block's weights)``; then
    ``(out - zp * kfsum) * s + bias``; no fused activation."""
    q8 = ctx.inputs[1].quant
    bs = int(q8.block_size)
    o, i = np.shape(w)
    nb = i // bs
    scales = np.asarray(q8.scale, F).reshape(o, nb)
    q, s, z = quantize_blocks(x2d, True)
    wi = np.asarray(w, np.int64)
    out = np.zeros((q.shape[0], o), F)
    for r in range(q.shape[0]):
        for n in range(o):
            acc, kfsum = F(0), F(0)
            for k in range(nb):
                blk = slice(k * bs, (k + 1) * bs)
                acc = F(acc + F(F(int(q[r, blk] @ wi[n, blk])) * scales[n, k]))
                kfsum = F(kfsum + F(scales[n, k] * F(int(wi[n, blk].sum()))))
            acc = F(acc - F(F(int(z[r])) * kfsum))
            acc = F(acc * s[r])
            out[r, n] = acc if b is None else F(acc + F(np.asarray(b, F)[n]))
    return out


@register(OP_SET, "FULLY_CONNECTED")
def FULLY_CONNECTED(ctx, x, w, b=None, *, fused_activation_function="NONE", weights_format="DEFAULT",
                    keep_num_dims=False, asymmetric_quantize_inputs=False):
    """Hybrid FULLY_CONNECTED: each input row quantized, ``acc = q . w - zp * sum(w)``,
    ``out = f32(acc) * f32(s_row * s_w[o]) + b[o]``."""
    o, i = np.shape(w)
    x = np.asarray(x, F)
    lead = x.shape[:-1] if keep_num_dims else (x.size // i,)
    if ctx.inputs[1].quant.block_size:
        return fc_blockwise(ctx, x.reshape(-1, i), w, b).reshape(tuple(lead) + (o,))
    q, s, z = quantize_blocks(x.reshape(-1, i), asymmetric_quantize_inputs)
    wi = np.asarray(w, np.int64)
    acc = q @ wi.T - z[:, None] * wi.sum(1)[None, :]
    scale = (s[:, None] * weight_scales(ctx, o)[None, :]).astype(F)
    y = scale_out(acc, scale, b)
    return activation(ctx, y, fused_activation_function).reshape(tuple(lead) + (o,))


def _conv_acc(ctx, x, w, padding, strides, dil, asymmetric, depthwise):
    """Per-image quantization and the integer (zero-point corrected) sum."""
    x = np.asarray(x, F)
    n, h, wd, c = x.shape
    q, s, z = quantize_blocks(x.reshape(n, -1), asymmetric)
    q = q.reshape(x.shape) - z[:, None, None, None]  # padded taps read zp: real 0
    wi = np.asarray(w, np.int64)
    kh, kw = wi.shape[1:3]
    oh, pt, pb = window_geometry(ctx, padding, h, kh, strides[0], dil[0])
    ow, pl, pr = window_geometry(ctx, padding, wd, kw, strides[1], dil[1])
    if depthwise:
        oc = wi.shape[3]
        q = np.repeat(q, oc // c, axis=3)
        acc = np.zeros((n, oh, ow, oc), np.int64)
        for ky, kx, tap in nhwc_taps(q, kh, kw, *strides, *dil, ((pt, pb), (pl, pr)), (oh, ow), fill=0):
            acc += tap * wi[0, ky, kx]
        return acc, s
    o, i = wi.shape[0], wi.shape[3]
    groups = c // i
    og = o // groups
    acc = np.zeros((n, oh, ow, o), np.int64)
    for ky, kx, tap in nhwc_taps(q, kh, kw, *strides, *dil, ((pt, pb), (pl, pr)), (oh, ow), fill=0):
        for g in range(groups):
            acc[..., g * og:(g + 1) * og] += np.einsum(
                "nhwi,oi->nhwo", tap[..., g * i:(g + 1) * i], wi[g * og:(g + 1) * og, ky, kx, :])
    return acc, s


@register(OP_SET, "CONV_2D")
def CONV_2D(ctx, x, w, b=None, *, padding="SAME", stride_w=1, stride_h=1, dilation_w_factor=1,
            dilation_h_factor=1, fused_activation_function="NONE"):
    """Hybrid CONV_2D: each image quantized (asymmetric when the weights are
    per-channel with distinct scales, else symmetric), integer convolution,
    ``out = f32(acc) * f32(s_img * s_w[o]) + b[o]``."""
    per_channel = is_per_channel(ctx)
    acc, s = _conv_acc(ctx, x, w, padding, (stride_h, stride_w), (dilation_h_factor, dilation_w_factor),
                       per_channel, False)
    ws = weight_scales(ctx, acc.shape[3])
    scale = (s[:, None, None, None] * ws).astype(F)
    return activation(ctx, scale_out(acc, scale, b), fused_activation_function)


@register(OP_SET, "DEPTHWISE_CONV_2D")
def DEPTHWISE_CONV_2D(ctx, x, w, b=None, *, padding="SAME", stride_w=1, stride_h=1, depth_multiplier=0,
                      dilation_w_factor=1, dilation_h_factor=1, fused_activation_function="NONE"):
    """Hybrid DEPTHWISE_CONV_2D: each image quantized asymmetrically,
    ``out = (f32(acc) * s_w[c]) * s_img + b[c]`` (float32 after each step)."""
    acc, s = _conv_acc(ctx, x, w, padding, (stride_h, stride_w), (dilation_h_factor, dilation_w_factor),
                       True, True)
    ws = weight_scales(ctx, acc.shape[3])
    y = ((acc.astype(np.float64).astype(F) * ws).astype(F) * s[:, None, None, None]).astype(F)
    if b is not None:
        y = (y + np.asarray(b, F)).astype(F)
    return activation(ctx, y, fused_activation_function)


@register(OP_SET, "BATCH_MATMUL")
def BATCH_MATMUL(ctx, a, b, *, adj_x=False, adj_y=False, asymmetric_quantize_inputs=False):
    """Hybrid BATCH_MATMUL (float lhs, int8 constant rhs): each lhs row
    quantized, ``out = f32(acc) * f32(s_row * s_rhs)``."""
    a = np.asarray(a, F)
    if adj_x:
        a = np.swapaxes(a, -1, -2)
    bi = np.asarray(b, np.int64)
    if adj_y:
        bi = np.swapaxes(bi, -1, -2)
    k = a.shape[-1]
    q, s, z = quantize_blocks(a.reshape(-1, k), asymmetric_quantize_inputs)
    q = q.reshape(a.shape)
    z = z.reshape(a.shape[:-1])
    s = s.reshape(a.shape[:-1])
    acc = np.matmul(q, bi) - z[..., None] * bi.sum(-2)[..., None, :]
    ws = weight_scales(ctx, 1)[0]
    scale = (s * ws).astype(F)[..., None]
    return scale_out(acc, scale, None)


def per_channel_quantize(ctx, x):
    """Twin of the per-channel float -> integer QUANTIZE:
    ``round_half_away(float32(x / s[c])) + zp[c]``, clamped (one element at a time)."""
    vo = ctx.outputs[0]
    x = np.asarray(x, F)
    s = np.asarray(vo.quant.scale, F).reshape(-1)
    z = np.asarray(vo.quant.zero_point).astype(np.int64).reshape(-1)
    axis = int(vo.quant.quantized_dimension)
    if not 0 <= axis < x.ndim or x.shape[axis] != s.size:
        raise ctx.error(f"{s.size} output scales along dimension {axis} of a {x.shape} tensor")
    z = np.broadcast_to(z, s.shape)
    info = np.iinfo(np.dtype(vo.dtype))
    out = np.zeros(x.shape, np.int64)
    for idx in np.ndindex(x.shape):
        c = idx[axis]
        v = float(F(x[idx] / s[c]))
        r = np.sign(v) * np.floor(abs(v) + 0.5)
        out[idx] = int(np.clip(np.clip(r, -2.0 ** 31, 2.0 ** 31 - 256) + z[c], info.min, info.max))
    return out.astype(np.dtype(vo.dtype))


@register(OP_SET, "TRANSPOSE_CONV")
def TRANSPOSE_CONV(ctx, output_shape, w, x, b=None, *, padding="SAME", stride_w=1, stride_h=1,
                   fused_activation_function="NONE"):
    """Hybrid TRANSPOSE_CONV: each image quantized asymmetrically (per-tensor
    weights too), then a float scatter loop: for each input pixel (raster order), input channel
    and kernel tap, ``out[oy, ox, o] += f32(f32(f32((q - zp) * w) * s_w[o]) * s_img)``;
    bias and fused activation after."""
    oshape = [int(d) for d in np.asarray(output_shape).reshape(-1)]
    x = np.asarray(x, F)
    wi = np.asarray(w, np.int64)
    n, h, wd, c = x.shape
    o, kh, kw, _ = wi.shape
    oh, ow = oshape[1], oshape[2]
    ph = window_geometry(ctx, padding, oh, kh, stride_h)[1] if padding == "SAME" else 0
    pw = window_geometry(ctx, padding, ow, kw, stride_w)[1] if padding == "SAME" else 0
    q, s, z = quantize_blocks(x.reshape(n, -1), True)
    q = q.reshape(x.shape) - z[:, None, None, None]
    ws = weight_scales(ctx, o)
    out = np.zeros((n, oh, ow, o), F)
    for bi in range(n):
        for i in range(h):
            for j in range(wd):
                for ci in range(c):
                    for ky in range(kh):
                        oy = i * stride_h - ph + ky
                        if not 0 <= oy < oh:
                            continue
                        for kx in range(kw):
                            ox = j * stride_w - pw + kx
                            if 0 <= ox < ow:
                                t = ((wi[:, ky, kx, ci] * q[bi, i, j, ci]).astype(F) * ws).astype(F)
                                out[bi, oy, ox] = (out[bi, oy, ox] + (t * s[bi]).astype(F)).astype(F)
    if b is not None:
        out = (out + np.asarray(b, F)).astype(F)
    return activation(ctx, out, fused_activation_function)


@register(OP_SET, "EMBEDDING_LOOKUP")
def EMBEDDING_LOOKUP(ctx, ids, table):
    """``table[id] * scale`` per looked-up row (the row's own scale for
    per-row scales), the integer-times-scale product in double stored as
    float32, as ``embedding_lookup.cc`` ``EvalHybrid``. Ids outside the
    table raise (TFLite's kernel returns an error)."""
    t = np.asarray(table)
    ids = np.asarray(ids).astype(np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= t.shape[0]):
        raise ctx.error(f"EMBEDDING_LOOKUP id out of range [0, {t.shape[0]})")
    q = ctx.inputs[1].quant
    if q.block_size:  # blockwise (int4 tables, EvalBlockwise): value * its row's block scale
        per = np.repeat(np.asarray(q.scale, np.float64), q.block_size, axis=1)
        return (t[ids].astype(np.float64) * per[ids]).astype(F)
    s = np.asarray(q.scale, np.float64).reshape(-1)
    row_s = s[ids] if s.size > 1 else np.full(ids.shape, s[0])
    out = t[ids].astype(np.float64) * row_s.reshape(ids.shape + (1,) * (t.ndim - 1))
    return out.astype(F)
