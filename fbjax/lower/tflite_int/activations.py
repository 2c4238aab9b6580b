"""Integer-exact TFLite activation functions (op set ``"tflite.int"``).

int8/uint8 LOGISTIC and TANH use TFLite's 256-entry lookup table, built at
load time from the dequantized inputs in float32 (``LUTPopulate``); SOFTMAX
uses the optimized kernel's float exp table (``PopulateSoftmaxLookupTable``)
with a sequential float32 sum, as the builtin (non-XNNPACK) x86 kernel does;
HARD_SWISH is the int16 fixed-point ``reference_ops::HardSwish`` including
its deliberately non-rounding final doubling multiply.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..registry import register
from . import fixedpoint as fp
from ._common import as_i32, out_dtype, qrange, round_half_away, scale_zp

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
    lo, hi = qrange(vi.dtype)
    olo, ohi = qrange(vo.dtype)
    inv = _f32(_f32(1.0) / so)
    table = np.empty(hi - lo + 1, np.int32)
    for val in range(lo, hi + 1):
        deq = _f32(si * _f32(val - zi))
        t = transform(deq)
        r = fp.round_half_away(float(_f32(t * inv)))
        q = int(_f32(r + zo)) if abs(r) < 2**31 else (ohi if r > 0 else olo)
        table[val - lo] = min(max(q, olo), ohi)
    return table, lo


def _apply_lut(ctx, x, table, lo):
    if np.dtype(ctx.inputs[0].dtype).itemsize != 1:
        raise ctx.error(f"{ctx.node.op_name} on {np.dtype(ctx.inputs[0].dtype).name} inputs is not supported "
                        "(only the 8-bit lookup-table kernels are implemented)")
    return jnp.take(jnp.asarray(table), as_i32(x) - lo).astype(out_dtype(ctx))


def _sigmoid(v):
    e = _expf(-v)
    return _f32(_f32(1.0) / _f32(_f32(1.0) + e))


def _tanh(v):
    return _f32(math.tanh(float(v)))


@register(OP_SET, "LOGISTIC", differentiable=False)
def LOGISTIC(ctx, x):
    """Quantized LOGISTIC (8-bit): table of ``1 / (1 + exp(-x))``."""
    if np.dtype(ctx.inputs[0].dtype).itemsize != 1:
        raise ctx.error("int16 LOGISTIC is not supported yet")
    table, lo = _lut(ctx, _sigmoid)
    return _apply_lut(ctx, x, table, lo)


@register(OP_SET, "TANH", differentiable=False)
def TANH(ctx, x):
    """Quantized TANH (8-bit): table of ``tanh(x)``."""
    if np.dtype(ctx.inputs[0].dtype).itemsize != 1:
        raise ctx.error("int16 TANH is not supported yet")
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
    if np.dtype(vi.dtype).itemsize != 1 or np.dtype(vo.dtype).itemsize != 1:
        raise ctx.error(f"SOFTMAX {np.dtype(vi.dtype).name} -> {np.dtype(vo.dtype).name} is not supported yet "
                        "(only 8-bit)")
    si, _ = scale_zp(ctx, vi, "input")
    so, zo = scale_zp(ctx, vo, "output")
    scale = _f32(-si * _f32(beta))
    table = np.array([_expf(_f32(scale * _f32(d))) for d in range(256)], np.float32)
    q = as_i32(x)
    d = jnp.max(q, axis=-1, keepdims=True) - q
    e = jnp.take(jnp.asarray(table), d)
    s = _seq_sum(e)[..., None]
    inv = jnp.float32(1.0) / (s * jnp.float32(so))
    p = e * inv
    lo, hi = qrange(vo.dtype)
    if np.dtype(vo.dtype) == np.int8:
        r = round_half_away(p).astype(jnp.int32) + zo
    else:  # uint8: static_cast<int32>(prob + 0.5f)
        r = (p + jnp.float32(0.5)).astype(jnp.int32) + zo
    return jnp.clip(r, lo, hi).astype(vo.dtype)


# --- HARD_SWISH (int16 fixed point) ---------------------------------------------

def _wrap16(x):
    return ((x + 32768) & 0xFFFF) - 32768


def _srdhm16(a, b):
    """gemmlowp ``SaturatingRoundingDoublingHighMul`` on int16 (int32 math)."""
    ab = a * b
    nudge = jnp.where(ab >= 0, 1 << 14, 1 - (1 << 14))
    s = ab + nudge
    q = jnp.where(s >= 0, s >> 15, -((-s) >> 15))
    return jnp.where((a == -32768) & (b == -32768), 32767, q)


def _sdhm16(a, b):
    """``SaturatingDoublingHighMul`` on int16: ``a*b / 2^15`` truncated."""
    ab = a * b
    q = jnp.where(ab >= 0, ab >> 15, -((-ab) >> 15))
    return jnp.where((a == -32768) & (b == -32768), 32767, q)


def _rdbpot16(x, e):
    """gemmlowp ``RoundingDivideByPOT`` on int16: the mask ``(1 << e) - 1``
    is truncated to int16, which matters for ``e > 15`` (tiny scales)."""
    if e == 0:
        return x
    mask = ((((1 << e) - 1) + 32768) & 0xFFFF) - 32768
    rem = x & mask
    th = _wrap16((mask >> 1) + (x < 0).astype(jnp.int32))
    return (x >> e) + (rem > th).astype(jnp.int32)


def _sat_lshift16(x, n):
    return jnp.clip(x * (1 << n), -32768, 32767)


def _downscale16(m):
    if m >= 2**31 - 1 - (1 << 15):
        return 32767
    return (m + (1 << 15)) >> 16


@register(OP_SET, "HARD_SWISH", differentiable=False)
def HARD_SWISH(ctx, x):
    """Quantized HARD_SWISH (``reference_ops::HardSwish``): int16 fixed point
    with a 15-bit "relu-ish" multiplier in ``[0, 1]``."""
    vi, vo = ctx.inputs[0], ctx.outputs[0]
    si, zi = scale_zp(ctx, vi, "input")
    so, zo = scale_zp(ctx, vo, "output")
    hires = _f32(_f32(1.0 / 128.0) * si)
    reluish_scale = _f32(3.0 / 32768.0)
    om, oe = fp.quantize_multiplier(float(_f32(hires / so)))
    rm, re_ = fp.quantize_multiplier(float(_f32(hires / reluish_scale)))
    om16, rm16 = _downscale16(om), _downscale16(rm)
    v = _wrap16(as_i32(x) - zi)
    hi_in = _wrap16(v * (1 << 7))
    pre_out = _srdhm16(hi_in, jnp.int32(om16))
    r = hi_in
    if re_ > 0:
        r = _sat_lshift16(r, re_ - 1)
    r = _srdhm16(r, jnp.int32(rm16))
    if re_ > 0:
        r = _sat_lshift16(r, 1)
    if re_ < 0:
        r = _rdbpot16(r, -re_)
    r = (r + (1 << 15)) >> 1
    pre = _sdhm16(r, pre_out)
    out = _rdbpot16(pre, -oe) if oe <= 0 else pre
    out = _wrap16(out + zo)
    lo, hi = qrange(vo.dtype)
    return jnp.clip(out, lo, hi).astype(vo.dtype)


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
    """Quantized GELU (8-bit): table of the float GELU (erf, or tanh form)."""
    if np.dtype(ctx.inputs[0].dtype).itemsize != 1:
        raise ctx.error("int16 GELU is not supported yet")
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
    if np.dtype(vi.dtype).itemsize != 1:
        raise ctx.error("int16 RSQRT is not supported yet")
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
