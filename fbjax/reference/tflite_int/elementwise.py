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


def _addsub(ctx, a, b, fused, sign):
    sa, za = sz(ctx, ctx.inputs[0])
    sb, zb = sz(ctx, ctx.inputs[1])
    so, zo = sz(ctx, ctx.outputs[0])
    ls = 15 if np.dtype(ctx.outputs[0].dtype) == np.int16 else 20
    tm = 2.0 * float(max(sa, sb))
    m1, s1 = _m(float(sa) / tm)
    m2, s2 = _m(float(sb) / tm)
    mo, so_ = _m(tm / ((1 << ls) * float(so)))
    ya = mbqm((np.asarray(a, np.int64) - za) * (1 << ls), m1, s1)
    yb = mbqm((np.asarray(b, np.int64) - zb) * (1 << ls), m2, s2)
    y = mbqm(ya + sign * yb, mo, so_) + zo
    lo, hi = act_range(ctx, fused, ctx.outputs[0])
    return np.clip(y, lo, hi).astype(ctx.outputs[0].dtype)


@register(OP_SET, "ADD")
def ADD(ctx, a, b, *, fused_activation_function="NONE"):
    """Reference quantized ADD."""
    return _addsub(ctx, a, b, fused_activation_function, 1)


@register(OP_SET, "SUB")
def SUB(ctx, a, b, *, fused_activation_function="NONE"):
    """Reference quantized SUB."""
    return _addsub(ctx, a, b, fused_activation_function, -1)


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
    so, zo = sz(ctx, vo)
    lo, hi = qrange(vo.dtype)
    x = np.asarray(x)
    if x.dtype.kind == "f":
        q = np.rint((x.astype(np.float32) * F(F(1.0) / so)).astype(np.float32)) + zo  # half to even
    else:
        si, zi = sz(ctx, ctx.inputs[0])
        m, s = _m(float(si) / float(so))
        q = mbqm(x.astype(np.int64) - zi, m, s) + zo
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


@register("fbjax", "FAKE_QUANT")
def FAKE_QUANT(ctx, x, *, scale=1.0, zero_point=0, qmin=-128, qmax=127):
    """Reference fake quantization (forward only)."""
    x = np.asarray(x, F)
    q = np.clip(np.rint((x * F(F(1.0) / F(scale))).astype(F)) + zero_point, qmin, qmax)
    return ((q - zero_point).astype(F) * F(scale)).astype(F)


@register("fbjax", "IDENTITY")
def IDENTITY(ctx, x):
    """Reference identity."""
    return np.asarray(x)




@register(OP_SET, "SQUARED_DIFFERENCE")
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
