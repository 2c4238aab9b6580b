"""numpy twins of the integer-exact TFLite element-wise ops (``"tflite.int"``)."""

from __future__ import annotations


import numpy as np

from ..registry import register
from .fixedpoint import act_range, mbqm, multipliers, qp, qrange, round_half_away, sz

OP_SET = "tflite.int"
F = np.float32


def _m(real):
    m, s = multipliers([real])
    return m[0], s[0]


def _pow2_exponent(x):
    """``CheckedLog2``: the rounded float32 log2 and whether it is exact to 1e-3."""
    lg = np.float32(np.float32(np.log(np.float32(x))) * np.float32(np.float32(1.0) / np.log(np.float32(2.0))))
    r = np.float32(round_half_away(lg))
    return int(r), abs(float(np.float32(lg - r))) < 1e-3


def _rdbpot_i16(v, e):
    mask = (((1 << e) - 1 + 32768) & 0xFFFF) - 32768
    th = ((mask >> 1) + (1 if v < 0 else 0) + 32768 & 0xFFFF) - 32768
    return (v >> e) + (1 if (v & mask) > th else 0)


def _addsub_pot16(ctx, a, b, fused, sign, ea, eb):
    if sign > 0 and np.shape(a) != np.shape(b):
        raise ctx.error("int16 power-of-two ADD does not broadcast")
    a, b = np.broadcast_arrays(np.asarray(a, np.int64), np.asarray(b, np.int64))
    lo, hi = act_range(ctx, fused, ctx.outputs[0])
    out = np.empty(a.shape, np.int64)
    for idx in np.ndindex(a.shape):
        v = _rdbpot_i16(int(a[idx]), -ea) + sign * _rdbpot_i16(int(b[idx]), -eb)
        out[idx] = min(max(v, lo), hi)
    return out.astype(np.int16)


def _addsub(ctx, a, b, fused, sign, pot_scale_int16=False):
    sa, za = sz(ctx, ctx.inputs[0])
    sb, zb = sz(ctx, ctx.inputs[1])
    so, zo = sz(ctx, ctx.outputs[0])
    if pot_scale_int16 and np.dtype(ctx.outputs[0].dtype) == np.int16:
        (la, pa), (lb, pb), (lo_, po) = _pow2_exponent(sa), _pow2_exponent(sb), _pow2_exponent(so)
        if pa and pb and po:
            return _addsub_pot16(ctx, a, b, fused, sign, la - lo_, lb - lo_)
    ls = 15 if np.dtype(ctx.outputs[0].dtype) == np.int16 else 20
    tm = 2.0 * float(max(sa, sb))
    m1, s1 = _m(float(sa) / tm)
    m2, s2 = _m(float(sb) / tm)
    mo, so_ = _m(tm / ((1 << ls) * float(so)))
    sha, shb = np.shape(a), np.shape(b)
    nd = max(len(sha), len(shb))
    same = (1,) * (nd - len(sha)) + sha == (1,) * (nd - len(shb)) + shb  # no broadcast in LiteRT's sense
    if ls == 15 and sign > 0 and (za or zb or zo):
        raise ctx.error("int16 ADD needs zero points 0 (LiteRT's add.cc rejects others)")
    if ls == 15 and sign > 0 and same:
        # LiteRT 2.3.0's int16 ADD on equal shapes, 16-lane vector body: the
        # input shifted by 15 + e (left, or right with floor when negative),
        # then (x * m + 2^30) >> 31 in 64 bits: one rounding, ties toward
        # +infinity. The scalar tail (last size % 16 elements in flat
        # order), SUB and the broadcasting ADD round twice, as below.
        shape = np.broadcast_shapes(sha, shb)
        in_body = np.arange(int(np.prod(shape))) < int(np.prod(shape)) // 16 * 16

        def rescale(v, m, e):
            v = np.asarray(v, np.int64).reshape(-1)
            n = ls + int(e)
            x = v << n if n >= 0 else v >> -n
            once = (x * int(m) + (1 << 30)) >> 31
            return np.where(in_body, once, mbqm(v * (1 << ls), m, e)).reshape(shape)

        ya = rescale(a, m1, s1)
        yb = rescale(b, m2, s2)
    else:
        ya = mbqm((np.asarray(a, np.int64) - za) * (1 << ls), m1, s1)
        yb = mbqm((np.asarray(b, np.int64) - zb) * (1 << ls), m2, s2)
    y = mbqm(ya + sign * yb, mo, so_) + zo
    lo, hi = act_range(ctx, fused, ctx.outputs[0])
    return np.clip(y, lo, hi).astype(ctx.outputs[0].dtype)


@register(OP_SET, "ADD")
def ADD(ctx, a, b, *, fused_activation_function="NONE", pot_scale_int16=True):
    """Reference quantized ADD (int16 with power-of-two scales: shift and add;
    int16 with general scales on equal shapes: input rescale rounded once)."""
    return _addsub(ctx, a, b, fused_activation_function, 1, pot_scale_int16)


@register(OP_SET, "SUB")
def SUB(ctx, a, b, *, fused_activation_function="NONE", pot_scale_int16=True):
    """Reference quantized SUB (int16 with power-of-two scales: shift and subtract)."""
    return _addsub(ctx, a, b, fused_activation_function, -1, pot_scale_int16)


@register(OP_SET, "MUL")
def MUL(ctx, a, b, *, fused_activation_function="NONE"):
    """Reference quantized MUL."""
    sa, za = sz(ctx, ctx.inputs[0])
    sb, zb = sz(ctx, ctx.inputs[1])
    so, zo = sz(ctx, ctx.outputs[0])
    m, s = _m(float(F(F(sa * sb) / so)))
    y = mbqm((np.asarray(a, np.int64) - za) * (np.asarray(b, np.int64) - zb), m, s) + zo
    lo, hi = act_range(ctx, fused_activation_function, ctx.outputs[0])
    return np.clip(y, lo, hi).astype(ctx.outputs[0].dtype)


@register(OP_SET, "QUANTIZE")
def QUANTIZE(ctx, x):
    """Reference QUANTIZE (float or integer input)."""
    vo = ctx.outputs[0]
    if vo.quant is not None and np.asarray(vo.quant.scale).size > 1 and np.asarray(x).dtype.kind == "f":
        from .hybrid import per_channel_quantize  # per-channel output scales
        return per_channel_quantize(ctx, x)
    so, zo = sz(ctx, vo)
    lo, hi = qrange(vo.dtype)
    x = np.asarray(x)
    if x.dtype.kind == "f":
        q = np.rint((x.astype(np.float32) * F(F(1.0) / so)).astype(np.float32)) + zo  # half to even
    else:
        si, zi = sz(ctx, ctx.inputs[0])
        m, s = _m(float(si) / float(so))
        q = mbqm(x.astype(np.int64) - zi, m, s) + zo
        if np.dtype(x.dtype).itemsize == 1 and np.dtype(vo.dtype).itemsize == 1:
            # optimized 8-bit Requantize: 16-element vector body shifts ties up
            from .conv import gemm_rescale

            body = x.size - x.size % 16
            flat = q.reshape(-1)
            flat[:body] = (gemm_rescale(x.astype(np.int64) - zi, m, s) + zo).reshape(-1)[:body]
            q = flat.reshape(q.shape)
    return np.clip(q, lo, hi).astype(vo.dtype)


@register(OP_SET, "DEQUANTIZE")
def DEQUANTIZE(ctx, x):
    """Reference DEQUANTIZE, as the builtin kernel computes it: for 8-bit
    per-tensor inputs ``q*s - zp*s`` (two float32 roundings) except in the
    last ``size % 8`` elements, where ``(q - zp) * s``; else ``(q - zp) * s``."""
    v = ctx.inputs[0]
    s, z = qp(ctx, v)
    x = np.asarray(x)
    if s.size > 1:
        shape = [1] * x.ndim
        shape[v.quant.quantized_dimension] = s.size
        return ((x.astype(np.int64) - z.reshape(shape)).astype(F) * s.reshape(shape)).astype(F)
    plain = ((x.astype(np.int64) - z[0]).astype(F) * s[0]).astype(F)
    if np.dtype(v.dtype).itemsize != 1:
        return plain
    flat = ((x.astype(F) * s[0]).astype(F) - F(F(z[0]) * s[0])).astype(F).reshape(-1)
    n = flat.size
    flat[n - n % 8:] = plain.reshape(-1)[n - n % 8:]
    return flat.reshape(x.shape)


def _relux(ctx, x, amin, amax):
    si, zi = sz(ctx, ctx.inputs[0])
    so, zo = sz(ctx, ctx.outputs[0])
    lo, hi = qrange(ctx.outputs[0].dtype)
    qmin = max(lo, zo + int(round_half_away(F(amin) / so)))
    qmax = hi if amax is None else min(hi, zo + int(round_half_away(F(amax) / so)))
    m, s = _m(float(F(si / so)))
    y = zo + mbqm(np.asarray(x, np.int64) - zi, m, s)
    return np.clip(y, qmin, qmax).astype(ctx.outputs[0].dtype)


@register(OP_SET, "RELU")
def RELU(ctx, x):
    """Reference quantized RELU."""
    return _relux(ctx, x, 0.0, None)


@register(OP_SET, "RELU6")
def RELU6(ctx, x):
    """Reference quantized RELU6."""
    return _relux(ctx, x, 0.0, 6.0)


@register(OP_SET, "RELU_N1_TO_1")
def RELU_N1_TO_1(ctx, x):
    """Reference quantized RELU_N1_TO_1."""
    return _relux(ctx, x, -1.0, 1.0)


@register(OP_SET, "LEAKY_RELU")
def LEAKY_RELU(ctx, x, *, alpha=0.0):
    """Reference quantized LEAKY_RELU."""
    si, zi = sz(ctx, ctx.inputs[0])
    so, zo = sz(ctx, ctx.outputs[0])
    ma, sa = _m(float(F(F(si * F(alpha)) / so)))
    mi, s_i = _m(float(F(si / so)))
    v = np.asarray(x, np.int64) - zi
    y = zo + np.where(v >= 0, mbqm(v, mi, s_i), mbqm(v, ma, sa))
    lo, hi = qrange(ctx.outputs[0].dtype)
    return np.clip(y, lo, hi).astype(ctx.outputs[0].dtype)


@register(OP_SET, "PRELU")
def PRELU(ctx, x, alpha):
    """Reference quantized PRELU."""
    si, zi = sz(ctx, ctx.inputs[0])
    sal, zal = sz(ctx, ctx.inputs[1])
    so, zo = sz(ctx, ctx.outputs[0])
    m1, s1 = _m(float(F(si / so)))
    m2, s2 = _m(float(F(F(si * sal) / so)))
    v = np.asarray(x, np.int64) - zi
    a = np.asarray(alpha, np.int64) - zal
    y = zo + np.where(v >= 0, mbqm(v, m1, s1), mbqm(v * a, m2, s2))
    lo, hi = qrange(ctx.outputs[0].dtype)
    return np.clip(y, lo, hi).astype(ctx.outputs[0].dtype)


@register(OP_SET, "CONCATENATION")
def CONCATENATION(ctx, *xs, axis=0, fused_activation_function="NONE"):
    """Reference quantized CONCATENATION (``ConcatenationWithScaling``)."""
    vo = ctx.outputs[0]
    so, zo = sz(ctx, vo)
    lo, hi = qrange(vo.dtype)
    parts = []
    for x, v in zip(xs, ctx.inputs):
        si, zi = sz(ctx, v)
        x = np.asarray(x)
        if si == so and zi == zo:
            parts.append(x.astype(vo.dtype))
            continue
        sc = F(si * F(F(1.0) / so))
        bias = F(F(-zi) * sc)
        f = (x.astype(F) * sc).astype(F) + bias
        parts.append(np.clip(round_half_away(f) + zo, lo, hi).astype(vo.dtype))
    ax = int(axis) % np.asarray(xs[0]).ndim
    y = np.concatenate(parts, axis=ax)
    if fused_activation_function not in (None, "NONE"):
        l2, h2 = act_range(ctx, fused_activation_function, vo)
        y = np.clip(y, l2, h2).astype(vo.dtype)
    return y


@register(OP_SET, ("MAXIMUM", "MINIMUM"))
def MAXIMUM(ctx, a, b):
    """Reference quantized MAXIMUM/MINIMUM."""
    f = np.maximum if ctx.node.op_name == "MAXIMUM" else np.minimum
    return f(np.asarray(a), np.asarray(b)).astype(ctx.outputs[0].dtype)


# fbjax:FAKE_QUANT / fbjax:IDENTITY twins: fake_quant.py




def _squared_difference_kernel(node):
    """Load-time check: quantized SQUARED_DIFFERENCE exists for 8-bit tensors
    only (LiteRT's squared_difference.cc), as in the lowering."""
    if any(v is not None and np.dtype(v.dtype).itemsize != 1 for v in (*node.inputs, *node.outputs)):
        return "int16 SQUARED_DIFFERENCE has no kernel (LiteRT's squared_difference.cc: float32, int32, int8)"
    return None


@register(OP_SET, "SQUARED_DIFFERENCE", check=_squared_difference_kernel)
def SQUARED_DIFFERENCE(ctx, a, b):
    """Reference quantized SQUARED_DIFFERENCE (8-bit, left shift 7)."""
    sa, za = sz(ctx, ctx.inputs[0])
    sb, zb = sz(ctx, ctx.inputs[1])
    so, zo = sz(ctx, ctx.outputs[0])
    tm = 2.0 * float(max(sa, sb))
    m1, s1 = _m(float(sa) / tm)
    m2, s2 = _m(float(sb) / tm)
    mo, s_o = _m(tm * tm / ((1 << 14) * float(so)))
    d = (mbqm((np.asarray(a, np.int64) - za) * 128, m1, s1)
         - mbqm((np.asarray(b, np.int64) - zb) * 128, m2, s2))
    lo, hi = qrange(ctx.outputs[0].dtype)
    return np.clip(mbqm(d * d, mo, s_o) + zo, lo, hi).astype(ctx.outputs[0].dtype)


@register(OP_SET, "TRANSPOSE")
def TRANSPOSE(ctx, x, perm):
    """Reference quantized TRANSPOSE."""
    return np.transpose(np.asarray(x), [int(p) for p in np.asarray(perm).reshape(-1)])
