"""numpy twins of the integer-exact TFLite activations (8-bit, and the int16
LOGISTIC/TANH/SOFTMAX/GELU/RSQRT kernels of 16x8 models)."""

from __future__ import annotations

import math

import numpy as np

from ...quantmath import erfcf, tanhf
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
    """Reference quantized LOGISTIC (float32 sigmoid of each dequantized code;
    int16: interpolated sigmoid table, scalar loop; input scale 2^-12:
    gemmlowp's int16 fixed-point logistic)."""
    if np.dtype(ctx.inputs[0].dtype) == np.int16:
        return _sigmoid16(ctx, x, False)
    return _lut_apply(ctx, x, lambda v: F(F(1.0) / F(F(1.0) + F(math.exp(-float(v))))))


@register(OP_SET, "TANH")
def TANH(ctx, x):
    """Reference quantized TANH (int16: the sigmoid table read for tanh;
    input scale 2^-12 or 2^-11: gemmlowp's int16 fixed-point tanh)."""
    if np.dtype(ctx.inputs[0].dtype) == np.int16:
        return _sigmoid16(ctx, x, True)
    return _lut_apply(ctx, x, lambda v: F(math.tanh(float(v))))


@register(OP_SET, "SOFTMAX")
def SOFTMAX(ctx, x, *, beta=1.0):
    """Reference quantized SOFTMAX (float exp table, sequential float32 sum;
    int16 in and out: ``SoftmaxInt16`` with its two 513-entry tables)."""
    vi, vo = ctx.inputs[0], ctx.outputs[0]
    if np.dtype(vi.dtype) == np.int16 and np.dtype(vo.dtype) == np.int16:
        return _softmax16(ctx, x, beta)
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
    """Reference quantized GELU (float GELU of each dequantized code, in double;
    int16: float32 ``erfc``/``tanh`` form sampled into a 513-entry table)."""
    if np.dtype(ctx.inputs[0].dtype) == np.int16:
        return _table16_apply(ctx, x, _gelu16_tanh if approximate else _gelu16)
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
    """Reference quantized RSQRT (8-bit, TFLite's fixed-point inverse sqrt;
    int16: ``1/sqrtf`` sampled into a 513-entry table)."""
    if np.dtype(ctx.inputs[0].dtype) == np.int16:
        so = sz(ctx, ctx.outputs[0])[0]
        return _table16_apply(ctx, x, lambda v: F(F(32767) * so) if v <= 0 else F(F(1.0) / np.sqrt(F(v))))
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


# --- int16 (16x8) kernels ---------------------------------------------------------------

def _sigmoid_q16_table():
    """``sigmoid_table_uint16``: round(65536 sigmoid(i/24)), clamped to
    65535, plus one at the 44 entries where TFLite's table is one above."""
    bumped = {4, 8, 12, 14, 15, 16, 17, 19, 20, 21, 22, 25, 27, 28, 29, 30, 31, 33, 34, 35, 37, 39, 40,
              41, 43, 44, 45, 46, 49, 50, 54, 62, 63, 64, 66, 82, 86, 93, 100, 103, 112, 116, 135, 255}
    out = []
    for i in range(256):
        v = int(math.floor(65536.0 * (1.0 / (1.0 + math.exp(-i / 24.0))) + 0.5))
        out.append(min(v, 65535) + (1 if i in bumped else 0))
    return out


def _log2_checked(x):
    lg = F(F(np.log(F(x))) * F(F(1.0) / np.log(F(2.0))))
    r = F(round_half_away(lg))
    return int(r), abs(float(F(lg - r))) < 1e-3


def _sigmoid16(ctx, x, tanh):
    si, zi = sz(ctx, ctx.inputs[0])
    so, zo = sz(ctx, ctx.outputs[0])
    l2, pot = _log2_checked(si)
    ol2, opot = _log2_checked(so)
    if zi or zo or not opot or ol2 != -15:
        raise ctx.error("int16 LOGISTIC/TANH: zero points must be 0 and the output scale 2^-15")
    if pot and (12 + l2 == 0 or (tanh and 12 + l2 == 1)):
        q = np.asarray(x).astype(np.int16)
        return _gl_tanh(q, 12 + l2) if tanh else _gl_logistic(q)
    mult, shift = float(si) * 12288.0, 0
    while mult <= 16383.5 and shift <= 30:
        mult, shift = mult * 2.0, shift + 1
    mult = int(mult)
    table = _sigmoid_q16_table()
    half = (1 << (shift - 1)) if shift else 0
    out = np.empty(np.shape(x), np.int64)
    for idx, q in np.ndenumerate(np.asarray(x, np.int64)):
        v = (int(q) * mult + half) >> shift
        a = abs(v)
        if tanh:
            hi_, lo_ = a >> 8, a & 255
            r = (0xFFFF << 8) if hi_ >= 255 else (table[hi_] << 8) + lo_ * (table[hi_ + 1] - table[hi_])
            r = r - (1 << 23) + 128 if v >= 0 else (1 << 23) - r + 127
            out[idx] = r >> 8
        else:
            hi_, lo_ = a >> 9, a & 511
            r = (0x7FFF << 10) if hi_ >= 255 else (table[hi_] << 9) + lo_ * (table[hi_ + 1] - table[hi_])
            r = r + 512 if v >= 0 else (1 << 25) - r + 511
            out[idx] = r >> 10
    return out.astype(np.int16)


# gemmlowp fixed point on int16 (power-of-two input scale): numpy int16 arrays,
# whose + - and unary minus wrap like gemmlowp's int16 Add/Sub/Neg; products
# and sums that gemmlowp widens are done in int32.

def _gl16(v):
    return np.asarray(v).astype(np.int16)


def _gl_const(raw32):
    # RescaleConstantInitializer<int16>: round-to-nearest (ties away) of raw32 / 2^16
    q, r = divmod(raw32, 1 << 16)
    return q + (1 if r > (1 << 15) or (r == (1 << 15) and raw32 >= 0) else 0)


def _gl_mul(a, b):
    # SaturatingRoundingDoublingHighMul<int16_t>
    p = a.astype(np.int32) * np.int32(b) if np.isscalar(b) else a.astype(np.int32) * b.astype(np.int32)
    p = p + np.where(p >= 0, np.int32(1 << 14), np.int32(1 - (1 << 14)))
    t = np.where(p >= 0, p // 32768, -((-p) // 32768))
    sat = (a == -32768) & (np.asarray(b) == -32768)
    return np.where(sat, 32767, t).astype(np.int16)


def _gl_rdiv(x, e):
    # RoundingDivideByPOT<int16_t>
    mask = np.int16((1 << e) - 1)
    th = (mask >> 1) + (x < 0).astype(np.int16)
    return ((x >> e) + ((x & mask) > th)).astype(np.int16)


def _gl_mulpot(x, e):
    # SaturatingRoundingMultiplyByPOT<e>, e > 0
    lim = (1 << (15 - e)) - 1
    wide = x.astype(np.int32) << e
    return np.where(x > lim, 32767, np.where(x < -lim, -32768, wide)).astype(np.int16)


def _gl_exp(a, ib):
    # exp_on_negative_values for FixedPoint<int16_t, ib>
    fb = 15 - ib
    quarter = np.int16(1 << (fb - 2))
    amq = (a & (quarter - 1)) - quarter
    x = _gl_mulpot(amq, ib) + np.int16(1 << 12)
    c, third = _gl_const(1895147668), _gl_const(715827883)
    x2 = _gl_mul(x, x)
    x3 = _gl_mul(x2, x)
    x4 = _gl_mul(x2, x2)
    poly = _gl_rdiv(_gl_mul(_gl_rdiv(x4, 2) + x3, third) + x2, 1)
    res = _gl16(np.clip(np.int32(c) + _gl_mul(np.full_like(x, c), x + poly).astype(np.int32), -32768, 32767))
    rem = amq - a
    for k, m in enumerate((1672461947, 1302514674, 790015084, 290630308, 39332535, 720401, 242)):
        if ib > k - 2:
            res = np.where(rem & np.int16(1 << (fb + k - 2)), _gl_mul(res, _gl_const(m)), res)
    return np.where(a == 0, np.int16(32767), res).astype(np.int16)


def _gl_newton(a):
    # Newton-Raphson 1 / (1 + a) of one_over_one_plus_x / one_minus_x_over_one_plus_x (Q2.13)
    s = a.astype(np.int32) + 32767
    half = _gl16(np.where(s >= 0, (s + 1) // 2, -((1 - s) // 2)))
    x = np.int16(_gl_const(1515870810)) + _gl_mul(half, _gl_const(-1010580540))
    for _ in range(3):
        x = x + _gl_mulpot(_gl_mul(x, np.int16(1 << 13) - _gl_mul(half, x)), 2)
    return x


def _gl_logistic(q):
    pos = q > 0
    mag = np.where(pos, q, -q)
    r = _gl_mulpot(_gl_newton(_gl_exp(-mag, 3)), 1)
    return np.where(q == 0, np.int16(_gl_const(1 << 30)), np.where(pos, r, np.int16(32767) - r)).astype(np.int16)


def _gl_tanh(q, left):
    if left:
        q = _gl_mulpot(q, left)
    neg = q < 0
    t = _gl_mulpot(_gl_newton(_gl_exp(np.where(neg, q, -q), 4)) - np.int16(1 << 13), 2)
    return np.where(q == 0, np.int16(0), np.where(neg, -t, t)).astype(np.int16)


def _rnd(v):
    return math.copysign(math.floor(abs(float(v)) + 0.5), float(v))


def _table16(fn, in_scale, in_zp, out_scale, out_zp, T):
    """``LUTPopulateInt16<T>`` with T = float (np.float32) or double (float)."""
    in_lo = T(T(in_scale) * T(-32768 - in_zp))
    in_hi = T(T(in_scale) * T(32767 - in_zp))
    out_lo = T(T(out_scale) * T(-32768 - out_zp))
    out_hi = T(T(out_scale) * T(32767 - out_zp))
    step = T(T(in_hi - in_lo) / T(512))
    inv = T(T(65536) / T(out_hi - out_lo))
    table = []
    for i in range(512):
        x0 = T(in_lo + T(T(i) * step))
        y0, ym, y1 = T(fn(x0)), T(fn(T(x0 + T(step / T(2))))), T(fn(T(in_lo + T(T(i + 1) * step))))
        s0 = T(_rnd(T(y0 * inv)))
        interp = T(_rnd(T(T(T(y1 * inv) + s0) / T(2))))
        bias = T(_rnd(T(T(interp - T(_rnd(T(ym * inv)))) / T(2))))
        table.append(int(min(max(float(T(s0 - bias)), -32768.0), 32767.0)))
    table.append(int(min(max(_rnd(T(T(fn(in_hi)) * inv)), -32768.0), 32767.0)))
    return table


def _lookup16(v, table):
    i = 256 + (v >> 7)
    slope = ((table[i + 1] - table[i] + 32768) & 0xFFFF) - 32768
    return ((table[i] + ((slope * (v & 127) + 64) >> 7) + 32768) & 0xFFFF) - 32768


def _table16_apply(ctx, x, fn):
    si, zi = sz(ctx, ctx.inputs[0])
    so, zo = sz(ctx, ctx.outputs[0])
    table = _table16(fn, si, zi, so, zo, F)
    out = np.empty(np.shape(x), np.int64)
    for idx, q in np.ndenumerate(np.asarray(x, np.int64)):
        out[idx] = _lookup16(int(q), table)
    return out.astype(np.int16)


def _gelu16(v):
    v = F(v)
    return F(F(F(0.5) * v) * erfcf(F(v * F(-0.7071067811865476))))


def _gelu16_tanh(v):
    v = F(v)
    c = F(1.1283791670955126 * 0.7071067811865476)
    t = F(c * F(v + F(F(F(F(0.044715) * v) * v) * v)))
    return F(F(F(0.5) * v) * F(F(1.0) + tanhf(t)))


def _softmax16(ctx, x, beta):
    si, zi = sz(ctx, ctx.inputs[0])
    exp_t = _table16(math.exp, 10.0 / 65535, 32767, 2.0 / 65535, 0, float)
    rec_t = _table16(lambda v: 1.0 / (1.0 + v), 1.0 / 65535, -32768, 2.0 / 65535, 0, float)
    (m,), (sh,) = multipliers([float(F(si * F(beta))) / (10.0 / 65535.0)])
    m, sh = int(m), int(sh)
    xs = np.asarray(x, np.int64)
    flat = xs.reshape(-1, xs.shape[-1])
    out = np.empty(flat.shape, np.int64)
    for r, row in enumerate(flat):
        top = int(row.max())
        exps = [_lookup16(min(max(_mbqm32(int(v) - top, m, sh) + 32767, -32768), 32767), exp_t) for v in row]
        total = sum(exps)
        lz = 32 - total.bit_length()
        shifted = ((total << (lz - 1)) + (1 << 13)) >> 14
        rec = _lookup16(min(max(shifted - 98304, -32768), 32767), rec_t)
        rs = 31 - lz
        for j, e in enumerate(exps):
            out[r, j] = min(max((e * rec + (1 << (rs - 1))) >> rs, 0), 32767)
    return out.reshape(xs.shape).astype(np.int16)
