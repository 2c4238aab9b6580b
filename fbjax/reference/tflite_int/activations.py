"""numpy twins of the integer-exact TFLite activations (8-bit)."""

from __future__ import annotations

import math

import numpy as np

from ..registry import register
from .fixedpoint import multipliers, qrange, round_half_away, sz

OP_SET = "tflite.int"
F = np.float32


def _lut_apply(ctx, x, fn):
    vi, vo = ctx.inputs[0], ctx.outputs[0]
    if np.dtype(vi.dtype).itemsize != 1:
        raise ctx.error("only 8-bit inputs are implemented")
    si, zi = sz(ctx, vi)
    so, zo = sz(ctx, vo)
    lo, hi = qrange(vo.dtype)
    x = np.asarray(x, np.int64)
    deq = (si * (x - zi).astype(F)).astype(F)
    t = np.vectorize(fn, otypes=[F])(deq)
    r = round_half_away((t * F(F(1.0) / so)).astype(F))
    return np.clip(r + zo, lo, hi).astype(vo.dtype)


@register(OP_SET, "LOGISTIC")
def LOGISTIC(ctx, x):
    """Reference quantized LOGISTIC (float32 sigmoid of each dequantized code)."""
    return _lut_apply(ctx, x, lambda v: F(F(1.0) / F(F(1.0) + F(math.exp(-float(v))))))


@register(OP_SET, "TANH")
def TANH(ctx, x):
    """Reference quantized TANH."""
    return _lut_apply(ctx, x, lambda v: F(math.tanh(float(v))))


@register(OP_SET, "SOFTMAX")
def SOFTMAX(ctx, x, *, beta=1.0):
    """Reference quantized SOFTMAX (float exp table, sequential float32 sum)."""
    vi, vo = ctx.inputs[0], ctx.outputs[0]
    si, _ = sz(ctx, vi)
    so, zo = sz(ctx, vo)
    lo, hi = qrange(vo.dtype)
    x = np.asarray(x, np.int64)
    flat = x.reshape(-1, x.shape[-1])
    out = np.zeros_like(flat)
    sc = F(-si * F(beta))
    for r, row in enumerate(flat):
        e = [F(math.exp(float(F(sc * F(int(row.max()) - int(v)))))) for v in row]
        tot = F(0.0)
        for v in e:
            tot = F(tot + v)
        inv = F(F(1.0) / F(tot * so))
        for j, v in enumerate(e):
            p = F(v * inv)
            q = int(round_half_away(p)) if np.dtype(vo.dtype) == np.int8 else int(F(p + F(0.5)))
            out[r, j] = min(max(q + zo, lo), hi)
    return out.reshape(x.shape).astype(vo.dtype)


def _i16(v):
    return ((int(v) + 32768) & 0xFFFF) - 32768


def _srdhm16(a, b):
    if a == b == -32768:
        return 32767
    ab = a * b
    s = ab + ((1 << 14) if ab >= 0 else 1 - (1 << 14))
    return int(s / (1 << 15)) if abs(s) < 2**52 else 0


def _sdhm16(a, b):
    if a == b == -32768:
        return 32767
    return int((a * b) / (1 << 15))


def _rdbpot(x, e):
    # int16 gemmlowp semantics: the mask is an int16 (truncated for e > 15)
    mask = _i16((1 << e) - 1)
    rem = x & mask
    th = _i16((mask >> 1) + (1 if x < 0 else 0))
    return (x >> e) + (1 if rem > th else 0)


def _down16(m):
    return 32767 if m >= 2**31 - 1 - (1 << 15) else (m + (1 << 15)) >> 16


@register(OP_SET, "HARD_SWISH")
def HARD_SWISH(ctx, x):
    """Reference quantized HARD_SWISH (scalar int16 fixed point)."""
    vi, vo = ctx.inputs[0], ctx.outputs[0]
    si, zi = sz(ctx, vi)
    so, zo = sz(ctx, vo)
    hires = F(F(1.0 / 128.0) * si)
    (om,), (oe,) = multipliers([float(F(hires / so))])
    (rm,), (re,) = multipliers([float(F(hires / F(3.0 / 32768.0)))])
    om16, rm16 = _down16(int(om)), _down16(int(rm))
    oe, re = int(oe), int(re)
    lo, hi = qrange(vo.dtype)
    xs = np.asarray(x, np.int64)
    out = np.empty(xs.shape, np.int64)
    for idx, q in np.ndenumerate(xs):
        v = _i16(int(q) - zi)
        hv = _i16(v * 128)
        pre_out = _srdhm16(hv, om16)
        r = hv
        if re > 0:
            r = min(max(r * (1 << (re - 1)), -32768), 32767)
        r = _srdhm16(r, rm16)
        if re > 0:
            r = min(max(r * 2, -32768), 32767)
        if re < 0:
            r = _rdbpot(r, -re)
        r = (r + (1 << 15)) >> 1
        o = _sdhm16(r, pre_out)
        if oe < 0:
            o = _rdbpot(o, -oe)
        o = _i16(o + zo)
        out[idx] = min(max(o, lo), hi)
    return out.astype(vo.dtype)


@register(OP_SET, "GELU")
def GELU(ctx, x, *, approximate=False):
    """Reference quantized GELU (float GELU of each dequantized code, in double)."""
    def erf_form(v):
        return F(float(F(0.5) * F(v)) * (1.0 + math.erf(float(v) / math.sqrt(2.0))))

    def tanh_form(v):
        t = float(v)
        return F(float(F(0.5) * F(v)) * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (t + 0.044715 * t ** 3))))

    return _lut_apply(ctx, x, tanh_form if approximate else erf_form)


def _sat_shl(x, e):
    lim = (1 << (31 - e)) - 1
    return 2**31 - 1 if x > lim else (-(2**31) if x < -lim else x << e)


def _w32(x):
    return ((x + 2**31) % 2**32) - 2**31


def _srdhm32(a, b):
    if a == b == -(2**31):
        return 2**31 - 1
    p = a * b
    p += (1 << 30) if p >= 0 else 1 - (1 << 30)
    return -((-p) >> 31) if p < 0 else p >> 31


def _rdbpot32(x, e):
    mask = (1 << e) - 1
    return (x >> e) + (1 if (x & mask) > (mask >> 1) + (1 if x < 0 else 0) else 0)


def _inv_sqrt(v):
    """GetInvSqrtQuantizedMultiplierExp(v, reverse_shift=-1) -> (m, shift)."""
    if v <= 1:
        return 2**31 - 1, 0
    sh = 11
    while v >= 1 << 29:
        v //= 4
        sh += 1
    pairs = ((32 - v.bit_length()) - 1) // 2 - 1
    sh -= pairs
    v <<= 2 * pairs
    half = _rdbpot32(v >> 1, 1)
    x = 1 << 28
    for _ in range(5):
        cube = _sat_shl(_srdhm32(_srdhm32(x, x), x), 6)
        x = _sat_shl(_w32(_srdhm32(3 << 27, x) - _srdhm32(half, cube)), 3)
    x = _srdhm32(x, 1518500250)
    if sh < 0:
        x, sh = _w32(x << -sh), 0
    return x, -sh


def _mbqm32(x, m, s):
    return _rdbpot32(_srdhm32(_w32(x * (1 << max(s, 0))), m), max(-s, 0))


@register(OP_SET, "RSQRT")
def RSQRT(ctx, x):
    """Reference quantized RSQRT (8-bit, TFLite's fixed-point inverse sqrt)."""
    si, zi = sz(ctx, ctx.inputs[0])
    so, zo = sz(ctx, ctx.outputs[0])
    lo, hi = qrange(ctx.outputs[0].dtype)
    (m,), (s,) = multipliers([1.0 / math.sqrt(float(si)) / float(so)])
    out = np.empty(np.shape(x), np.int64)
    for idx, q in np.ndenumerate(np.asarray(x, np.int64)):
        v = int(q) - zi
        if v <= 0:
            out[idx] = hi if v == 0 else lo
            continue
        im, ish = _inv_sqrt(v)
        out[idx] = min(max(_mbqm32(_mbqm32(1, im, ish + 20), int(m), int(s) - 20) + zo, lo), hi)
    return out.astype(ctx.outputs[0].dtype)
