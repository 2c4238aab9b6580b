"""Integer-exact TFLite activation functions (op set ``"tflite.int"``).

int8/uint8 LOGISTIC and TANH use TFLite's 256-entry lookup table, built at
load time from the dequantized inputs in float32 (``LUTPopulate``); SOFTMAX
uses the optimized kernel's float exp table (``PopulateSoftmaxLookupTable``)
with a sequential float32 sum, as the builtin (non-XNNPACK) x86 kernel does;
HARD_SWISH is the int16 fixed-point ``reference_ops::HardSwish`` including
its deliberately non-rounding final doubling multiply, tabulated at load
for the 256 input codes.

int16 (16x8) kernels, bit-exact against LiteRT's builtin kernels: LOGISTIC and
TANH interpolate TFLite's 256-entry ``sigmoid_table_uint16``, except with a
power-of-two input scale (2^-12, or 2^-11 for TANH), where TFLite runs
gemmlowp's fixed-point ``logistic``/``tanh`` (Q3.12 in, Q0.15 out); SOFTMAX is
``SoftmaxInt16`` (exp and 1/(1+x) tables); GELU and RSQRT read 513-entry
``LUTPopulate<int16_t>`` tables with 7-bit interpolation (``LUTLookup``).
"""

from __future__ import annotations

import functools
import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from ...quantmath import erfcf, tanhf
from ..registry import register
from . import fixedpoint as fp
from ._common import as_i32, lookup, out_dtype, qrange, round_half_away, scale_zp



OP_SET = "tflite.int"


def _f32(x):
    return np.float32(x)


def _expf(x):
    """``expf`` (correctly rounded: via double, then float32)."""
    return np.float32(math.exp(float(x)))


def _lut(ctx, transform):
    """``LUTPopulate<T>`` for 8-bit types: one output per input code."""
    vi, vo = ctx.inputs[0], ctx.outputs[0]
    si, zi = scale_zp(ctx, vi, "input")
    so, zo = scale_zp(ctx, vo, "output")
    return _lut_table(transform, si, zi, so, zo, np.dtype(vi.dtype), np.dtype(vo.dtype))


@functools.lru_cache(maxsize=1024)
def _lut_table(transform, si, zi, so, zo, in_dtype, out_dtype):
    """The table of :func:`_lut`, kept per quantization (a model is traced
    at load and again for its first call; 256 scalar float32 evaluations
    take a few ms per node)."""
    lo, hi = qrange(in_dtype)
    olo, ohi = qrange(out_dtype)
    inv = _f32(_f32(1.0) / so)
    table = np.empty(hi - lo + 1, np.int32)
    for val in range(lo, hi + 1):
        deq = _f32(si * _f32(val - zi))
        t = transform(deq)
        r = fp.round_half_away(float(_f32(t * inv)))
        q = int(_f32(r + zo)) if abs(r) < 2**31 else (ohi if r > 0 else olo)
        table[val - lo] = min(max(q, olo), ohi)
    table.setflags(write=False)
    return table, lo


def _apply_lut(ctx, x, table, lo):
    if np.dtype(ctx.inputs[0].dtype).itemsize != 1:
        raise ctx.error(f"{ctx.node.op_name} on {np.dtype(ctx.inputs[0].dtype).name} inputs is not supported "
                        "(only the 8-bit lookup-table kernels are implemented)")
    od = out_dtype(ctx)
    lo_o, hi_o = qrange(od)
    if table.min() >= lo_o and table.max() <= hi_o:
        table = table.astype(od)  # gather the output type directly
    y = lookup(table, x, lo)
    return y if y.dtype == od else lax.convert_element_type(y, od)


def _sigmoid(v):
    e = _expf(-v)
    return _f32(_f32(1.0) / _f32(_f32(1.0) + e))


def _tanh(v):
    return _f32(math.tanh(float(v)))


@register(OP_SET, "LOGISTIC", differentiable=False)
def LOGISTIC(ctx, x):
    """Quantized LOGISTIC. 8-bit: table of ``1 / (1 + exp(-x))``. int16
    (``reference_integer_ops::Logistic``): input rescaled to 1/(3*4096)
    units, interpolated in TFLite's 256-entry sigmoid table (0.16 fixed
    point), output scale 2^-15; input scale 2^-12: gemmlowp's fixed-point
    ``logistic`` (``optimized_ops::Logistic``), Q3.12 in, Q0.15 out."""
    if _is16(ctx):
        return _sigmoid16_common(ctx, x, tanh=False)
    table, lo = _lut(ctx, _sigmoid)
    return _apply_lut(ctx, x, table, lo)


@register(OP_SET, "TANH", differentiable=False)
def TANH(ctx, x):
    """Quantized TANH. 8-bit: table of ``tanh(x)``. int16
    (``reference_integer_ops::Tanh``): ``tanh(x) = 2 sigmoid(2x) - 1`` read
    from the sigmoid table with 8 fractional index bits; input scale 2^-12
    or 2^-11: gemmlowp's fixed-point ``tanh`` (``optimized_ops::Tanh``) on
    Q3.12, the 2^-11 codes first doubled with saturation."""
    if _is16(ctx):
        return _sigmoid16_common(ctx, x, tanh=True)
    table, lo = _lut(ctx, _tanh)
    return _apply_lut(ctx, x, table, lo)


def _seq_sum(x, axis=-1):
    """float32 sum along the last axis in index order (like the C loop)."""
    x = jnp.moveaxis(x, axis, 0)
    if x.shape[0] <= 64:
        acc = x[0]
        for j in range(1, x.shape[0]):
            acc = acc + x[j]
        return acc
    return lax.scan(lambda c, v: (c + v, None), x[0], x[1:])[0]


@register(OP_SET, "SOFTMAX", differentiable=False)
def SOFTMAX(ctx, x, *, beta=1.0):
    """Quantized SOFTMAX, 8-bit in and out (``optimized_ops::Softmax`` with
    the float table ``exp(-s_in * beta * d)`` for ``d = max - q``):
    ``q_out = round(table[d] / (sum * s_out)) + zp_out``, clamped."""
    vi, vo = ctx.inputs[0], ctx.outputs[0]
    if np.dtype(vi.dtype) == np.int16 and np.dtype(vo.dtype) == np.int16:
        return _softmax16(ctx, x, beta)
    if np.dtype(vi.dtype).itemsize != 1 or np.dtype(vo.dtype).itemsize != 1:
        raise ctx.error(f"SOFTMAX {np.dtype(vi.dtype).name} -> {np.dtype(vo.dtype).name} is not supported yet "
                        "(only 8-bit)")
    si, _ = scale_zp(ctx, vi, "input")
    so, zo = scale_zp(ctx, vo, "output")
    scale = _f32(-si * _f32(beta))
    table = np.array([_expf(_f32(scale * _f32(d))) for d in range(256)], np.float32)
    q = as_i32(x)
    d = jnp.max(q, axis=-1, keepdims=True) - q
    e = lookup(table, d)
    s = _seq_sum(e)[..., None]
    inv = jnp.float32(1.0) / (s * jnp.float32(so))
    p = e * inv
    lo, hi = qrange(vo.dtype)
    if np.dtype(vo.dtype) == np.int8:
        r = round_half_away(p).astype(jnp.int32) + zo
    else:  # uint8: static_cast<int32>(prob + 0.5f)
        r = (p + jnp.float32(0.5)).astype(jnp.int32) + zo
    return jnp.clip(r, lo, hi).astype(vo.dtype)


# --- HARD_SWISH (int16 fixed point, tabulated per input code) -------------------
#
# The int16 helpers below take the array module: jnp inside the program
# (gemmlowp's int16 logistic/tanh), numpy at load time (HARD_SWISH's table).

def _wrap16(x):
    return ((x + 32768) & 0xFFFF) - 32768


def _srdhm16(a, b, xp=jnp):
    """gemmlowp ``SaturatingRoundingDoublingHighMul`` on int16 (int32 math)."""
    ab = a * b
    nudge = xp.where(ab >= 0, 1 << 14, 1 - (1 << 14))
    s = ab + nudge
    q = xp.where(s >= 0, s >> 15, -((-s) >> 15))
    return xp.where((a == -32768) & (b == -32768), 32767, q)


def _sdhm16(a, b, xp=jnp):
    """``SaturatingDoublingHighMul`` on int16: ``a*b / 2^15`` truncated."""
    ab = a * b
    q = xp.where(ab >= 0, ab >> 15, -((-ab) >> 15))
    return xp.where((a == -32768) & (b == -32768), 32767, q)


def _rdbpot16(x, e, xp=jnp):
    """gemmlowp ``RoundingDivideByPOT`` on int16: the mask ``(1 << e) - 1``
    is truncated to int16, which matters for ``e > 15`` (tiny scales)."""
    if e == 0:
        return x
    mask = ((((1 << e) - 1) + 32768) & 0xFFFF) - 32768
    rem = x & mask
    th = _wrap16((mask >> 1) + (x < 0).astype(xp.int32))
    return (x >> e) + (rem > th).astype(xp.int32)


def _sat_lshift16(x, n, xp=jnp):
    return xp.clip(x * (1 << n), -32768, 32767)


def _downscale16(m):
    if m >= 2**31 - 1 - (1 << 15):
        return 32767
    return (m + (1 << 15)) >> 16


@functools.lru_cache(maxsize=1024)
def hard_swish_table(si, zi, so, zo, in_dtype, out_dtype) -> tuple[np.ndarray, int]:
    """``(table, lowest code)``: ``reference_ops::HardSwish`` (int16 fixed
    point with a 15-bit "relu-ish" multiplier in ``[0, 1]`` and a
    deliberately non-rounding final doubling multiply) evaluated at load time
    in numpy int64 for every code of the 8-bit input, clamped to the output
    type. Exact by construction: the kernel is elementwise in one 8-bit
    input (256 codes), so a gather of this table replaces ~120 StableHLO
    ops per node. Intermediates never leave int16 (saturating shifts clamp,
    products of two int16 fit), so int64 and the C int32 arithmetic agree."""
    hires = _f32(_f32(1.0 / 128.0) * si)
    reluish_scale = _f32(3.0 / 32768.0)
    om, oe = fp.quantize_multiplier(float(_f32(hires / so)))
    rm, re_ = fp.quantize_multiplier(float(_f32(hires / reluish_scale)))
    om16, rm16 = np.int64(_downscale16(om)), np.int64(_downscale16(rm))
    lo, hi = qrange(in_dtype)
    codes = np.arange(lo, hi + 1, dtype=np.int64)
    v = _wrap16(codes - zi)
    hi_in = _wrap16(v * (1 << 7))
    pre_out = _srdhm16(hi_in, om16, np)
    r = hi_in
    if re_ > 0:
        r = _sat_lshift16(r, re_ - 1, np)
    r = _srdhm16(r, rm16, np)
    if re_ > 0:
        r = _sat_lshift16(r, 1, np)
    if re_ < 0:
        r = _rdbpot16(r, -re_, np)
    r = (r + (1 << 15)) >> 1
    pre = _sdhm16(r, pre_out, np)
    out = _rdbpot16(pre, -oe, np) if oe <= 0 else pre
    out = _wrap16(out + zo)
    olo, ohi = qrange(out_dtype)
    table = np.clip(out, olo, ohi).astype(np.int32)
    table.setflags(write=False)
    return table, lo


@register(OP_SET, "HARD_SWISH", differentiable=False)
def HARD_SWISH(ctx, x):
    """Quantized HARD_SWISH, 8-bit (``reference_ops::HardSwish``): a gather
    from the 256-entry table of :func:`hard_swish_table`."""
    vi, vo = ctx.inputs[0], ctx.outputs[0]
    si, zi = scale_zp(ctx, vi, "input")
    so, zo = scale_zp(ctx, vo, "output")
    table, lo = hard_swish_table(si, zi, so, zo, np.dtype(vi.dtype), np.dtype(vo.dtype))
    return _apply_lut(ctx, x, table, lo)


def _gelu(v):
    # gelu.cc: 0.5f * x * (1.0f + std::erf(x * M_SQRT1_2)), evaluated in double
    x = float(v)
    return _f32(float(_f32(0.5) * _f32(v)) * (1.0 + math.erf(x * math.sqrt(0.5))))


def _gelu_tanh(v):
    x = float(v)
    k = math.sqrt(2.0 / math.pi)
    return _f32(float(_f32(0.5) * _f32(v)) * (1.0 + math.tanh(k * (x + 0.044715 * x * x * x))))


@register(OP_SET, "GELU", differentiable=False)
def GELU(ctx, x, *, approximate=False):
    """Quantized GELU: table of the float GELU (erf, or tanh form); int16:
    the 513-entry interpolated table of ``LUTPopulate<int16_t>`` (float)."""
    if _is16(ctx):
        return _lut16_op(ctx, x, gelu_tanh_f32 if approximate else gelu_f32)
    table, lo = _lut(ctx, _gelu_tanh if approximate else _gelu)
    return _apply_lut(ctx, x, table, lo)


# --- RSQRT (8-bit): per-code table from TFLite's fixed-point Newton iteration ---------

def _srdhm_py(a, b):
    if a == b == -(2**31):
        return 2**31 - 1
    ab = a * b
    s = ab + ((1 << 30) if ab >= 0 else 1 - (1 << 30))
    return abs(s) // (1 << 31) * (1 if s >= 0 else -1)


def _rdbpot_py(x, e):
    mask = (1 << e) - 1
    rem = x & mask
    th = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> e) + (1 if rem > th else 0)


def _sat_pot_py(x, e):
    th = (1 << (31 - e)) - 1
    if x > th:
        return 2**31 - 1
    if x < -th:
        return -(2**31)
    return x << e


def _wrap32_py(x):
    return ((x + 2**31) % 2**32) - 2**31


def _inv_sqrt_multiplier(value, reverse_shift=-1):
    """``GetInvSqrtQuantizedMultiplierExp`` (gemmlowp fixed point)."""
    if value <= 1:
        return 2**31 - 1, 0
    shift = 11
    while value >= (1 << 29):
        value //= 4
        shift += 1
    max_left_shift_bits = (32 - value.bit_length()) - 1
    pairs = max_left_shift_bits // 2 - 1
    shift -= pairs
    value <<= 2 * pairs
    x_in = value >> 1                      # F3
    half_in = _rdbpot_py(x_in, 1)          # SaturatingRoundingMultiplyByPOT<-1>
    half_three = (1 << 28) + (1 << 27)     # 1.5 in F3
    x = 1 << 28                            # F3 one
    for _ in range(5):
        x3 = _sat_pot_py(_srdhm_py(_srdhm_py(x, x), x), 6)                 # Rescale<3>(F9)
        d = _wrap32_py(_srdhm_py(half_three, x) - _srdhm_py(half_in, x3))  # F6
        x = _sat_pot_py(d, 3)                                               # Rescale<3>(F6)
    x = _srdhm_py(x, 1518500250)          # * sqrt(2)/2 in F0
    if shift < 0:
        x = _wrap32_py(x << -shift)
        shift = 0
    return x, shift * reverse_shift


def _mbqm_py(x, m, shift):
    left, right = max(shift, 0), max(-shift, 0)
    return _rdbpot_py(_srdhm_py(_wrap32_py(x * (1 << left)), m), right)


@register(OP_SET, "RSQRT", differentiable=False)
def RSQRT(ctx, x):
    """Quantized RSQRT (8-bit, ``elementwise.cc`` RsqrtEvalQuantized): per
    input code, TFLite's fixed-point inverse square root, tabulated at load."""
    vi, vo = ctx.inputs[0], ctx.outputs[0]
    if _is16(ctx):
        return _lut16_op(ctx, x, _rsqrt16_transform(ctx))
    si, zi = scale_zp(ctx, vi, "input")
    so, zo = scale_zp(ctx, vo, "output")
    m, s = fp.quantize_multiplier(1.0 / math.sqrt(float(si)) / float(so))
    lo, hi = qrange(vi.dtype)
    olo, ohi = qrange(vo.dtype)
    table = np.empty(hi - lo + 1, np.int32)
    k_shift = 20
    for code in range(lo, hi + 1):
        v = code - zi
        if v == 0:
            table[code - lo] = ohi
            continue
        if v < 0:
            table[code - lo] = olo  # TFLite rejects negative inputs at run time; clamp
            continue
        im, ish = _inv_sqrt_multiplier(v)
        data = _mbqm_py(1, im, ish + k_shift)
        out = _mbqm_py(data, m, s - k_shift) + zo
        table[code - lo] = min(max(out, olo), ohi)
    return _apply_lut(ctx, x, table, lo)


# --- 16-bit (16x8) kernels -----------------------------------------------------------
#
# int16 LOGISTIC/TANH: reference_integer_ops::Logistic/Tanh, interpolating a
# 256-entry table of sigmoid(i/24) in 0.16 fixed point after rescaling the
# input to 1/(3*4096) units (multiplier and shift from SigmoidPrepare /
# TanhPrepare). int16 SOFTMAX, GELU and RSQRT: 513-entry int16 tables
# (``LUTPopulate<int16_t>``) read with 7-bit linear interpolation
# (``LUTLookup``).

#: entries of TFLite's ``sigmoid_table_uint16`` one above
#: ``round(65536 * sigmoid(i / 24))`` (the table is not that formula exactly;
#: every other entry is).
_SIGMOID_TABLE_BUMPS = (4, 8, 12, 14, 15, 16, 17, 19, 20, 21, 22, 25, 27, 28, 29, 30, 31, 33, 34, 35, 37,
                        39, 40, 41, 43, 44, 45, 46, 49, 50, 54, 62, 63, 64, 66, 82, 86, 93, 100, 103,
                        112, 116, 135, 255)


def sigmoid_table_uint16() -> np.ndarray:
    """TFLite's ``sigmoid_table_uint16`` (``kernels/internal/common.h``):
    256 values of ``sigmoid(i / 24)`` in 0.16 fixed point, int32."""
    t = [min(65535, math.floor(65536.0 / (1.0 + math.exp(-i / 24.0)) + 0.5)) for i in range(256)]
    for i in _SIGMOID_TABLE_BUMPS:
        t[i] += 1
    return np.asarray(t, np.int32)


def _checked_log2(x) -> tuple[int, bool]:
    """``CheckedLog2`` (float32): ``(round(log2 x), |frac| < 1e-3)``."""
    l2 = np.float32(np.float32(np.log(np.float32(x))) * np.float32(np.float32(1.0) / np.log(np.float32(2.0))))
    r = np.float32(fp.round_half_away(float(l2)))
    return int(r), bool(abs(float(np.float32(l2 - r))) < 1e-3)


def sigmoid16_params(scale, zp_in, zp_out, out_scale, tanh):
    """``SigmoidPrepare``/``TanhPrepare`` for int16: ``(input_multiplier,
    input_left_shift)`` or a string saying why the model is not supported.

    ``input_multiplier == 0`` means TFLite's gemmlowp fixed-point kernel
    (``optimized_ops::Logistic``/``Tanh`` on int16): ``CheckedLog2`` finds
    the input scale a power of two (within 1e-3 in log2) and
    ``left = 12 + log2(scale)`` is 0 (LOGISTIC), or 0 or 1 (TANH); ``left``
    is then the input's saturating left shift (TANH only). Any other scale
    gets a multiplier to 1/(3*4096) units and the table kernel."""
    if zp_in != 0 or zp_out != 0:
        return "int16 zero points must be 0"
    l2, pot = _checked_log2(scale)
    left = 12 + l2
    ol2, opot = _checked_log2(out_scale)
    if not opot or ol2 != -15:
        return "the output scale must be 2^-15 (TFLite rejects the model)"
    if pot and (left == 0 or (tanh and left == 1)):
        return 0, left
    mult = float(np.float32(scale)) * 4096.0 * 3.0
    left = 0
    while mult <= 32767.0 / 2.0 and left <= 30:
        left += 1
        mult *= 2.0
    m = int(mult)
    if m >= 1 << 15:
        return f"input scale {float(scale)} too large (multiplier {m} overflows the int32 kernel)"
    return m, left


def _sigmoid16_common(ctx, x, tanh):
    vi, vo = ctx.inputs[0], ctx.outputs[0]
    si, zi = scale_zp(ctx, vi, "input")
    so, zo = scale_zp(ctx, vo, "output")
    p = sigmoid16_params(si, zi, zo, so, tanh)
    if isinstance(p, str):
        raise ctx.error(f"int16 {ctx.node.op_name}: {p}")
    m, left = p
    if m == 0:
        return _gemmlowp_tanh16(as_i32(x), left) if tanh else _gemmlowp_logistic16(as_i32(x))
    rnd = (1 << (left - 1)) if left > 0 else 0
    v = (as_i32(x) * m + rnd) >> left
    a = jnp.abs(v)
    bits = 8 if tanh else 9
    uh = a >> bits
    idx = jnp.minimum(uh, 254)
    table = sigmoid_table_uint16()
    ua, ub = lookup(table, idx), lookup(table, idx + 1)
    ut = a & ((1 << bits) - 1)
    if tanh:
        r = jnp.where(uh >= 255, 0xFFFF << 8, (ua << 8) + ut * (ub - ua))
        r = jnp.where(v >= 0, r - (1 << 23) + (1 << 7), -r + (1 << 23) + (1 << 7) - 1)
        r = r >> 8
    else:
        r = jnp.where(uh >= 255, 0x7FFF << 10, (ua << 9) + ut * (ub - ua))
        r = jnp.where(v >= 0, r + (1 << 9), (1 << 25) - r + (1 << 9) - 1)
        r = r >> 10
    return r.astype(jnp.int16)


# int16 LOGISTIC/TANH with a power-of-two input scale: gemmlowp's fixed-point
# ``logistic``/``tanh`` on ``FixedPoint<int16_t, 3>`` inputs (Q3.12) with
# ``FixedPoint<int16_t, 0>`` (Q0.15) results. Values are int16 held in int32;
# gemmlowp's int16 Add/Sub/Neg wrap, ``SaturatingAdd`` and positive
# ``SaturatingRoundingMultiplyByPOT`` saturate, products are ``SRDHM``.
# Built with SSE4.1 (``GEMMLOWP_SSE4``), LiteRT runs 8-lane bodies
# (``_mm_mulhrs_epi16``, ``_mm_avg_epu16``) and a scalar tail;
# ``_mm_mulhrs_epi16`` rounds half up exactly like the scalar SRDHM (nudge
# ``1 - 2^14`` then truncation), and the rounding half sums here never see a
# negative sum (where ``_mm_avg_epu16`` would differ), so one formula serves
# every element.

def _c16(raw32: int) -> int:
    """``RescaleConstantInitializer`` for int16: the Q0.31-style int32
    constant rounding-divided by 2^16."""
    return _rdbpot_py(raw32, 16)


#: ``exp(-1/8)``, ``1/3``, ``48/17`` (Q2.13), ``-32/17`` (Q2.13).
_GL_EXP_M1_8, _GL_ONE_THIRD = _c16(1895147668), _c16(715827883)
_GL_48_17, _GL_M32_17 = _c16(1515870810), _c16(-1010580540)
#: ``exp_on_negative_values`` barrel shifter: (power of two, Q0.15 ``exp(-2^p)``).
_GL_BARREL = tuple((p, _c16(v)) for p, v in ((-2, 1672461947), (-1, 1302514674), (0, 790015084),
                                               (1, 290630308), (2, 39332535), (3, 720401), (4, 242)))


def _sat_pot16(x, e):
    """``SaturatingRoundingMultiplyByPOT<e>`` on int16, ``e > 0``."""
    th = (1 << (15 - e)) - 1
    return jnp.where(x > th, 32767, jnp.where(x < -th, -32768, x * (1 << e)))


def _rounding_half_sum16(a, b):
    """gemmlowp int16 ``RoundingHalfSum``: ``(a + b + sign) / 2`` truncated."""
    s = a + b
    return jnp.where(s >= 0, (s + 1) >> 1, -((1 - s) >> 1))


def _gl_exp_quarter(a):
    """``exp_on_interval_between_negative_one_quarter_and_0_excl`` (Q0.15)."""
    x = _wrap16(a + (1 << 12))
    x2 = _srdhm16(x, x)
    x3 = _srdhm16(x2, x)
    x4 = _srdhm16(x2, x2)
    t = _srdhm16(_wrap16(_rdbpot16(x4, 2) + x3), _GL_ONE_THIRD)
    t = _rdbpot16(_wrap16(t + x2), 1)
    return jnp.clip(_GL_EXP_M1_8 + _srdhm16(_GL_EXP_M1_8, _wrap16(x + t)), -32768, 32767)


def _gl_exp_neg(a, int_bits):
    """``exp_on_negative_values`` of a Q(int_bits).(15-int_bits) input <= 0."""
    frac = 15 - int_bits
    quarter = 1 << (frac - 2)
    a_mod = _wrap16((a & (quarter - 1)) - quarter)
    r = _gl_exp_quarter(_sat_pot16(a_mod, int_bits))
    rem = _wrap16(a_mod - a)
    for p, mult in _GL_BARREL:
        if int_bits > p:
            r = jnp.where((rem & (1 << (frac + p))) != 0, _srdhm16(r, mult), r)
    return jnp.where(a == 0, 32767, r)


def _gl_reciprocal(a):
    """The Newton-Raphson step shared by ``one_over_one_plus_x_for_x_in_0_1``
    and ``one_minus_x_over_one_plus_x_for_x_in_0_1``: about ``1 / (1 + a)``
    in Q2.13 for ``a`` in Q0.15."""
    half_den = _rounding_half_sum16(a, 32767)
    x = _wrap16(_GL_48_17 + _srdhm16(half_den, _GL_M32_17))
    for _ in range(3):
        one_minus = _wrap16((1 << 13) - _srdhm16(half_den, x))
        x = _wrap16(x + _sat_pot16(_srdhm16(x, one_minus), 2))
    return x


def _gemmlowp_logistic16(q):
    """gemmlowp ``logistic`` on Q3.12 int16 codes -> Q0.15 int16."""
    pos = q > 0
    mag = jnp.where(pos, q, _wrap16(-q))
    r = _sat_pot16(_gl_reciprocal(_gl_exp_neg(_wrap16(-mag), 3)), 1)
    out = jnp.where(q == 0, 1 << 14, jnp.where(pos, r, _wrap16(32767 - r)))
    return out.astype(jnp.int16)


def _gemmlowp_tanh16(q, left):
    """gemmlowp ``tanh`` on Q3.12 int16 codes (first doubled, saturating,
    when ``left == 1``: input scale 2^-11) -> Q0.15 int16."""
    if left:
        q = _sat_pot16(q, left)
    neg = q < 0
    n = jnp.where(neg, q, _wrap16(-q))
    t = _sat_pot16(_wrap16(_gl_reciprocal(_gl_exp_neg(n, 4)) - (1 << 13)), 2)
    out = jnp.where(q == 0, 0, jnp.where(neg, _wrap16(-t), t))
    return out.astype(jnp.int16)


def _round_away(x: float) -> float:
    return fp.round_half_away(x)


def lut16_populate(transform, input_scale, input_zp, output_scale, output_zp, double=True):
    """``LUTPopulate<int16_t>`` (``common.h`` ``LUTPopulateInt16``): 513
    int16 samples of ``transform`` over the input range with a midpoint
    error correction. ``double``: the FloatT=double overload (SOFTMAX's exp
    and 1/(1+x) tables); else every operation in float32 (GELU, RSQRT)."""
    ff = float if double else np.float32

    def rnd(v):
        return ff(_round_away(float(v)))

    isc, osc = ff(input_scale), ff(output_scale)
    in_min = ff(isc * ff(-32768 - input_zp))
    in_max = ff(isc * ff(32767 - input_zp))
    out_min = ff(osc * ff(-32768 - output_zp))
    out_max = ff(osc * ff(32767 - output_zp))
    step = ff(ff(in_max - in_min) / ff(512))
    half = ff(step / ff(2))
    inv = ff(ff(65536) / ff(out_max - out_min))
    lut = np.empty(513, np.int32)
    for i in range(512):
        base = ff(in_min + ff(ff(i) * step))
        val = ff(transform(base))
        mid = ff(transform(ff(base + half)))
        nxt = ff(transform(ff(in_min + ff(ff(i + 1) * step))))
        sample = rnd(ff(val * inv))
        interp = rnd(ff(ff(ff(nxt * inv) + rnd(ff(val * inv))) / ff(2)))
        midv = rnd(ff(mid * inv))
        bias = rnd(ff(ff(interp - midv) / ff(2)))
        lut[i] = int(min(max(float(ff(sample - bias)), -32768.0), 32767.0))
    lut[512] = int(min(max(float(rnd(ff(ff(transform(in_max)) * inv))), -32768.0), 32767.0))
    return lut


def _wrap16_arr(x):
    return ((x + 32768) & 0xFFFF) - 32768


def lut16_lookup(x, lut):
    """``LUTLookup(int16_t, lut)``: base ``lut[256 + (x >> 7)]`` plus the
    slope to the next entry times the low 7 bits, ``(s*o + 64) >> 7``."""
    x = as_i32(x)
    idx = 256 + (x >> 7)
    off = x & 0x7F
    t = np.asarray(lut, np.int32)
    base = lookup(t, idx)
    slope = _wrap16_arr(lookup(t, idx + 1) - base)
    return _wrap16_arr(base + ((slope * off + 64) >> 7))


def _lut16_op(ctx, x, transform):
    vi, vo = ctx.inputs[0], ctx.outputs[0]
    si, zi = scale_zp(ctx, vi, "input")
    so, zo = scale_zp(ctx, vo, "output")
    lut = lut16_populate(transform, si, zi, so, zo, double=False)
    return lut16_lookup(x, lut).astype(jnp.int16)


def _is16(ctx):
    return np.dtype(ctx.inputs[0].dtype) == np.int16


def gelu_f32(v):
    """``GeluTransform`` (float): ``0.5f * x * erfcf(x * -sqrt(1/2))``
    (``erfcf`` from the C math library, as LiteRT calls it)."""
    v = np.float32(v)
    t = np.float32(v * np.float32(-math.sqrt(0.5)))
    return np.float32(np.float32(np.float32(0.5) * v) * erfcf(t))


def gelu_tanh_f32(v):
    """``GeluTransformApproximate`` (float; ``tanhf`` from the C math library)."""
    v = np.float32(v)
    k = np.float32(1.12837916709551257390 * 0.70710678118654752440)  # M_2_SQRTPI * M_SQRT1_2
    cube = np.float32(np.float32(np.float32(np.float32(0.044715) * v) * v) * v)
    inner = np.float32(k * np.float32(v + cube))
    one_plus = np.float32(np.float32(1.0) + tanhf(inner))
    return np.float32(np.float32(np.float32(0.5) * v) * one_plus)


def _rsqrt16_transform(ctx):
    """RSQRT's int16 table function (``elementwise.cc``): ``1 / sqrtf(v)``,
    and ``32767 * s_out`` for ``v <= 0`` (negative inputs are rejected by
    TFLite at run time; fbjax maps them through the table like 0)."""
    so, _ = scale_zp(ctx, ctx.outputs[0], "output")
    top = np.float32(np.float32(32767) * so)

    def f(v):
        v = np.float32(v)
        if v <= 0:
            return top
        return np.float32(np.float32(1.0) / np.sqrt(v))
    return f


def _softmax16(ctx, x, beta):
    """``reference_ops::SoftmaxInt16``: ``exp`` of the rescaled difference to
    the row maximum from a 513-entry table over [-10, 0], the int32 sum
    normalized by its leading zeros, its reciprocal from a ``1/(1+x)`` table,
    and a rounding right shift of the product."""
    vi, vo = ctx.inputs[0], ctx.outputs[0]
    si, zi = scale_zp(ctx, vi, "input")
    so, zo = scale_zp(ctx, vo, "output")
    if zi != 0 or zo != 0:
        raise ctx.error("int16 SOFTMAX needs zero points 0")
    exp_lut, rec_lut = softmax16_tables()
    real = float(np.float32(np.float32(si) * np.float32(beta))) / (10.0 / 65535.0)
    m, s = fp.quantize_multiplier(real)
    q = as_i32(x)
    d = q - jnp.max(q, axis=-1, keepdims=True)
    sd = jnp.clip(fp.mbqm(d, m, s) + 32767, -32768, 32767)
    e = lut16_lookup(sd, exp_lut)
    total = jnp.sum(e, axis=-1, keepdims=True, dtype=jnp.int32)
    h = lax.clz(total)  # headroom_plus_one (total > 0)
    ut = lax.bitcast_convert_type(total, jnp.uint32)
    shifted = ((ut << (h - 1).astype(jnp.uint32)) + jnp.uint32(1 << 13)) >> jnp.uint32(14)
    sym = jnp.clip(shifted.astype(jnp.int32) - ((1 << 15) + (1 << 16)), -32768, 32767)
    recip = lut16_lookup(sym, rec_lut)
    rs = 31 - h
    r = lax.shift_right_arithmetic(e * recip + (jnp.int32(1) << (rs - 1)), jnp.broadcast_to(rs, e.shape))
    return jnp.clip(r, 0, 32767).astype(jnp.int16)


_SOFTMAX16_TABLES = []


def softmax16_tables():
    """SOFTMAX's int16 tables (``SoftmaxPrepare``, double precision):
    ``exp`` over [-10, 0] and ``1/(1+x)`` over [0, 1], both to [-1, 1]."""
    if not _SOFTMAX16_TABLES:
        rng = 65535
        exp_lut = lut16_populate(math.exp, 10.0 / rng, 32767, 2.0 / rng, 0, double=True)
        rec_lut = lut16_populate(lambda v: 1.0 / (1.0 + v), 1.0 / rng, -32768, 2.0 / rng, 0, double=True)
        _SOFTMAX16_TABLES.extend([exp_lut, rec_lut])
    return _SOFTMAX16_TABLES[0], _SOFTMAX16_TABLES[1]
