"""Integer-exact TFLite element-wise ops (op set ``"tflite.int"``).

ADD/SUB (``reference_integer_ops::Add``, ``sub.cc``): both inputs are shifted
left by ``left_shift`` (20 for 8-bit, 15 for int16 with general scales),
rescaled by ``s_i / (2 max(s_1, s_2))``, summed (or subtracted) and rescaled
by ``2 max(s_1, s_2) / (2^left_shift s_out)``. LiteRT 2.3.0's int16 ADD
without broadcasting rounds the input rescale once (half up) instead of
twice in its 16-lane vector body; see :func:`_rescale_once`. MUL: ``(a - zp_a)(b - zp_b)``
rescaled by ``s_a s_b / s_out`` (float32 arithmetic). QUANTIZE / DEQUANTIZE /
requantization, RELU family, LEAKY_RELU, PRELU and CONCATENATION follow
``quantize.cc``, ``dequantize.cc``, ``activations.cc`` and ``concatenation.cc``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..registry import register
from . import fixedpoint as fp
from . import rounding
from ..kernels import tail_mask
from ._common import (activation_range, as_i32, clamp_cast, lookup, out_dtype, qparams, qrange,
                      scale_zp)

OP_SET = "tflite.int"


def _checked_log2(x) -> tuple[int, bool]:
    """``CheckedLog2`` (float32): ``(round(log2 x), |frac| < 1e-3)``."""
    l2 = np.float32(np.float32(np.log(np.float32(x))) * np.float32(np.float32(1.0) / np.log(np.float32(2.0))))
    r = np.float32(fp.round_half_away(float(l2)))
    return int(r), bool(abs(float(np.float32(l2 - r))) < 1e-3)


def _pot_shifts(ctx, sa, za, sb, zb, so, zo):
    """``add.cc``/``sub.cc`` Prepare with ``pot_scale_int16``: when all three
    scales are powers of two (``CheckedLog2``), the input shifts
    ``log2 s_i - log2 s_out`` (both <= 0, one of them 0); else ``None``
    (general path)."""
    (la, pa), (lb, pb), (lo_, po) = _checked_log2(sa), _checked_log2(sb), _checked_log2(so)
    if not (pa and pb and po):
        return None
    if za or zb or zo:
        raise ctx.error("int16 ADD/SUB needs zero points 0")
    s1, s2 = la - lo_, lb - lo_
    if not (s1 == 0 or s2 == 0) or s1 > 0 or s2 > 0:
        raise ctx.error(f"int16 power-of-two ADD/SUB input shifts {s1}, {s2}: TFLite requires both <= 0 "
                        "and one of them 0")
    return s1, s2


def _rdbpot16(x, e):
    """gemmlowp ``RoundingDivideByPOT`` on int16 values (the mask is an
    int16, truncated for ``e > 15``)."""
    if e == 0:
        return x
    mask = ((((1 << e) - 1) + 32768) & 0xFFFF) - 32768
    th = (((mask >> 1) + (x < 0).astype(jnp.int32)) + 32768 & 0xFFFF) - 32768
    return (x >> e) + ((x & mask) > th).astype(jnp.int32)


def _add_sub_pot16(ctx, a, b, fused, sign, s1, s2):
    """The int16 power-of-two kernels (``optimized_ops::Add`` int16,
    ``Sub16``/``BroadcastSub16POTSlow``): the input with the smaller scale
    is divided by ``2^-shift`` (rounding half away from zero), the two are
    added or subtracted with int16 saturation, then clamped to the fused
    activation range. ADD's kernel does not broadcast."""
    if sign > 0 and tuple(np.shape(a)) != tuple(np.shape(b)):
        raise ctx.error("int16 ADD with power-of-two scales does not broadcast in TFLite "
                        f"(shapes {tuple(np.shape(a))} and {tuple(np.shape(b))})")
    ya = _rdbpot16(as_i32(a), -s1)
    yb = _rdbpot16(as_i32(b), -s2)
    y = ya + yb if sign > 0 else ya - yb
    lo, hi = activation_range(ctx, fused, ctx.outputs[0])
    return clamp_cast(y, lo, hi, out_dtype(ctx))


def _rescale_once(v, m, e):
    """The input rescale of the 16-lane vector body of LiteRT 2.3.0's
    int16 ADD on equal shapes (measured against LiteRT with single-ADD
    models): the left shift 15 and the multiplier's exponent ``e`` (<= 0)
    are folded into one shift of the input, ``x = v << (15 + e)`` or, for
    ``e < -15``, ``x = v >> -(15 + e)`` (floor), then
    ``(x * m + 2^30) >> 31``: one rounding of the 64-bit product, ties
    toward +infinity. The scalar tail (the last ``size % 16`` elements),
    SUB and the broadcasting ADD round twice instead (``SRDHM`` then
    ``RoundingDivideByPOT``), as the 8-bit kernels do.

    Measured facts: with ``s_1 / (2 max s) = 1.5 * 2^-16`` the input ``-2``
    gives ``-1`` in the first ``16 floor(size / 16)`` elements and ``-2``
    (the double rounding) in the rest; with ``e = -17`` the inputs ``4..7``
    all give ``round(1 * m / 2^31)``.

    ``v`` int32 with ``|v| <= 2^15`` (LiteRT requires int16 zero points 0),
    ``m`` in ``[2^30, 2^31)`` or 0. With ``t = 16 - e <= 31`` and
    ``m = mh 2^16 + ml``: ``v mh`` (< 2^30) and ``v ml`` (< 2^31) fit in
    int32, and ``floor((v mh 2^16 + v ml + 2^(t-1)) / 2^t) =
    (v mh + (v ml >> 16) + 2^(t-17)) >> (t - 16)`` for ``t >= 17`` (the sum
    stays below 2^31)."""
    t = 16 - int(e)
    if t > 31:
        v = lax.shift_right_arithmetic(v, np.int32(t - 31))
        t = 31
    mh, ml = np.int32(int(m) >> 16), np.int32(int(m) & 0xFFFF)
    hi = v * mh
    if t == 16:
        return hi + lax.shift_right_arithmetic(v * ml + np.int32(1 << 15), np.int32(16))
    k = t - 16
    lo = lax.shift_right_arithmetic(v * ml, np.int32(16))
    return lax.shift_right_arithmetic(hi + lo + np.int32(1 << (k - 1)), np.int32(k))


def _broadcasts(a, b) -> bool:
    """``ProcessBroadcastShapes``: the shapes differ once left-padded with 1s."""
    sa, sb = tuple(np.shape(a)), tuple(np.shape(b))
    n = max(len(sa), len(sb))
    return (1,) * (n - len(sa)) + sa != (1,) * (n - len(sb)) + sb


def _add_sub(ctx, a, b, fused, sign, pot_scale_int16):
    va, vb, vo = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    sa, za = scale_zp(ctx, va, "input 1")
    sb, zb = scale_zp(ctx, vb, "input 2")
    so, zo = scale_zp(ctx, vo, "output")
    int16 = np.dtype(vo.dtype) == np.int16
    if int16 and pot_scale_int16:
        pot = _pot_shifts(ctx, sa, za, sb, zb, so, zo)
        if pot is not None:
            return _add_sub_pot16(ctx, a, b, fused, sign, *pot)
    left_shift = 15 if int16 else 20
    twice_max = 2.0 * float(max(sa, sb))
    m1, s1 = fp.quantize_multiplier(float(sa) / twice_max)
    m2, s2 = fp.quantize_multiplier(float(sb) / twice_max)
    mo, so_ = fp.quantize_multiplier(twice_max / ((1 << left_shift) * float(so)))
    if int16 and sign > 0 and (za or zb or zo):
        raise ctx.error(f"int16 ADD needs zero points 0 (LiteRT's add.cc rejects {za}, {zb}, {zo} in Prepare)")
    if int16 and sign > 0 and not _broadcasts(a, b):
        # 16-lane vector body: one rounding; scalar tail (the last size % 16
        # elements, flat order): the double rounding below.
        # (jnp.broadcast_shapes and tail_mask accept a symbolic batch)
        shape = jnp.broadcast_shapes(tuple(jnp.shape(a)), tuple(jnp.shape(b)))
        fa, fb = as_i32(a).reshape(shape), as_i32(b).reshape(shape)
        in_tail = tail_mask(shape, 16)

        def rescale(v, m, e):
            body = _rescale_once(v, m, e)
            if in_tail is None:
                return body
            return jnp.where(in_tail, fp.mbqm(fp.shift_left(v, left_shift), m, e), body)

        ya, yb = rescale(fa, m1, s1), rescale(fb, m2, s2)
    else:
        ya = _shifted_rescale(a, va, za, left_shift, m1, s1)
        yb = _shifted_rescale(b, vb, zb, left_shift, m2, s2)
    raw = ya + yb if sign > 0 else ya - yb
    lo, hi = activation_range(ctx, fused, vo)
    return fp.requantize(raw, mo, so_, offset=zo, clamp=(lo, hi), dtype=out_dtype(ctx))


def _shifted_rescale(q, v, z, left_shift, m, s):
    """``MBQM((q - z) << left_shift, m, s)``; where ``(q - z) << left_shift``
    cannot wrap in int32 (8-bit inputs: ``|q - z| <= 255``, ``255 << 20 <
    2^31``) the shift moves into the int64 multiplier, ``(q - z) * (m <<
    left_shift)``: the same product, fewer operations."""
    lo, hi = qrange(v.dtype)
    if max(abs(lo - z), abs(hi - z)) << left_shift < 2**31 and not int(s) > 0:
        return fp.mbqm(_minus(q, z), np.int64(m) << left_shift, s)
    return fp.mbqm(fp.shift_left(_minus(q, z), left_shift), m, s)


@register(OP_SET, "ADD", differentiable=False)
def ADD(ctx, a, b, *, fused_activation_function="NONE", pot_scale_int16=True):
    """Quantized TFLite ADD (int8/uint8, int16 with general scales; int16
    with power-of-two scales when ``pot_scale_int16``), broadcasting. int16
    with general scales on equal shapes rounds the input rescale once in
    the first ``16 floor(size / 16)`` elements (:func:`_rescale_once`);
    zero points must then be 0."""
    return _add_sub(ctx, a, b, fused_activation_function, +1, pot_scale_int16)


@register(OP_SET, "SUB", differentiable=False)
def SUB(ctx, a, b, *, fused_activation_function="NONE", pot_scale_int16=True):
    """Quantized TFLite SUB, as ADD with the second term subtracted."""
    return _add_sub(ctx, a, b, fused_activation_function, -1, pot_scale_int16)


@register(OP_SET, "MUL", differentiable=False, fq_rounding=rounding.product)
def MUL(ctx, a, b, *, fused_activation_function="NONE"):
    """Quantized TFLite MUL: ``MBQM((a - zp_a)(b - zp_b), s_a*s_b/s_out) + zp_out``."""
    sa, za = scale_zp(ctx, ctx.inputs[0], "input 1")
    sb, zb = scale_zp(ctx, ctx.inputs[1], "input 2")
    so, zo = scale_zp(ctx, ctx.outputs[0], "output")
    real = np.float32(np.float32(sa) * np.float32(sb)) / np.float32(so)
    m, s = fp.quantize_multiplier(float(np.float32(real)))
    lo, hi = activation_range(ctx, fused_activation_function, ctx.outputs[0])
    return fp.requantize(lax.mul(_minus(a, za), _minus(b, zb)), m, s, offset=zo, clamp=(lo, hi),
                         dtype=out_dtype(ctx))


def _minus(q, z):
    """int32 ``q - z`` (``lax`` calls: tracing time is part of the first call)."""
    q = as_i32(q)
    return lax.sub(q, np.int32(z)) if z else q


@register(OP_SET, "QUANTIZE", differentiable=False, fq_rounding=rounding.quantize, quant_conversion="quantize")
def QUANTIZE(ctx, x):
    """TFLite QUANTIZE: float -> ``round_half_even(x * (1/s)) + zp`` (float32,
    as the builtin x86 kernel), or integer requantization
    ``MBQM(q - zp_in, s_in/s_out) + zp_out``."""
    vo = ctx.outputs[0]
    if vo.quant is not None and np.asarray(vo.quant.scale).size > 1 and jnp.issubdtype(jnp.asarray(x).dtype,
                                                                                       jnp.floating):
        from .hybrid import per_channel_quantize  # per-channel output scales
        return per_channel_quantize(ctx, x)
    so, zo = scale_zp(ctx, vo, "output")
    lo, hi = qrange(vo.dtype)
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.floating):
        # The builtin x86 kernel (optimized_ops::AffineQuantize) multiplies by
        # the float32 reciprocal and rounds half to even; the reference kernel's
        # round_half_away(x / scale) differs on ties (verified with tie inputs).
        q = jnp.round(x.astype(jnp.float32) * jnp.float32(np.float32(1.0) / so))
        q = jnp.clip(q, lo - zo, hi - zo).astype(jnp.int32) + zo
        return q.astype(np.dtype(vo.dtype))
    si, zi = scale_zp(ctx, ctx.inputs[0], "input")
    m, s = fp.quantize_multiplier(float(si) / float(so))
    ties_up = False
    if np.dtype(ctx.inputs[0].dtype).itemsize == 1 and np.dtype(vo.dtype).itemsize == 1:
        # optimized 8-bit Requantize: its 16-lane vector body (NEON via
        # NEON_2_SSE on x86) rounds the final shift half up; the scalar tail
        # (last size % 16 elements, all of them when size < 16) uses
        # MultiplyByQuantizedMultiplier as above (verified on
        # ai-edge-quantizer's int8 -> int8 QUANTIZE, sizes multiple of 16; the
        # tail split follows the kernel's loop structure).
        in_tail = tail_mask(x.shape, 16)
        ties_up = True if in_tail is None else ~in_tail
    return fp.requantize(_minus(x, zi), m, s, ties_up=ties_up, offset=zo, clamp=(lo, hi), dtype=vo.dtype)


@register(OP_SET, "DEQUANTIZE", differentiable=False, quant_conversion="dequantize")
def DEQUANTIZE(ctx, x):
    """TFLite DEQUANTIZE: ``(q - zp) * scale`` in float32 (per-channel along
    ``quantized_dimension``)."""
    v = ctx.inputs[0]
    s, z = qparams(ctx, v, "input")
    x = jnp.asarray(x)
    if s.size > 1:
        shape = [1] * x.ndim
        shape[v.quant.quantized_dimension] = s.size
        s, z = s.reshape(shape), z.reshape(shape)
    else:
        s, z = s.reshape(()), z.reshape(())
    if s.size == 1 and np.dtype(v.dtype).itemsize == 1:
        # optimized_ops::Dequantize computes q * s - zp * s with two float32
        # roundings; XLA:CPU would contract that into one FMA, so the 256
        # possible results are tabulated at load time instead.
        lo, hi = qrange(v.dtype)
        codes = np.arange(lo, hi + 1).astype(np.float32)
        sc = np.float32(s.reshape(()))
        zs = np.float32(np.float32(z.reshape(())) * sc)
        table = (codes * sc).astype(np.float32) - zs
        # Its scalar tail (the last size % 8 elements after the 8-wide vector
        # loop) computes (q - zp) * s instead.
        tail = ((codes - np.float32(z.reshape(()))).astype(np.float32) * sc).astype(np.float32)
        y = lookup(table, x, lo)
        in_tail = tail_mask(x.shape, 8)
        if in_tail is not None:
            y = jnp.where(in_tail, lookup(tail, x, lo), y)
        return y.astype(out_dtype(ctx))
    if s.size == 1 and np.dtype(v.dtype) == np.int16:
        # Tabulated too (65536 float32 values): XLA:CPU drops the barrier
        # below when it duplicates this multiply into a consumer's fusion,
        # and LLVM then contracts it with a following add or subtract into
        # one FMA (also through a float64 product: it narrows that back to a
        # float32 multiply). Seen on the DEQUANTIZE -> SQUARED_DIFFERENCE ->
        # QUANTIZE layer norms of ai-edge-quantizer's a16w8 encoders: one-step
        # differences after the QUANTIZE on ~1% of the outputs.
        lo, hi = qrange(v.dtype)
        codes = np.arange(lo, hi + 1, dtype=np.int64) - np.int64(z.reshape(()))
        table = (codes.astype(np.float32) * np.float32(s.reshape(()))).astype(np.float32)
        return lookup(table, x, lo).astype(out_dtype(ctx))
    y = ((as_i32(x) - jnp.asarray(z)).astype(jnp.float32) * jnp.asarray(s)).astype(out_dtype(ctx))
    # The product is rounded to float32 before any consumer sees it; without
    # the barrier XLA:CPU fuses it into a following add as one FMA (float
    # islands of 16x8 models: DEQUANTIZE -> HARD_SWISH -> QUANTIZE).
    return lax.optimization_barrier(y)


def _relu_x(ctx, x, act_min, act_max):
    si, zi = scale_zp(ctx, ctx.inputs[0], "input")
    so, zo = scale_zp(ctx, ctx.outputs[0], "output")
    lo, hi = qrange(ctx.outputs[0].dtype)
    qmin = max(lo, zo + int(fp.round_half_away(float(np.float32(act_min) / so))))
    qmax = hi if act_max is None else min(hi, zo + int(fp.round_half_away(float(np.float32(act_max) / so))))
    m, s = fp.quantize_multiplier(float(np.float32(si / so)))
    return fp.requantize(as_i32(x) - zi, m, s, offset=zo, clamp=(qmin, qmax), dtype=out_dtype(ctx))


@register(OP_SET, "RELU", differentiable=False)
def RELU(ctx, x):
    """Quantized RELU (``QuantizedReluX``): rescale to the output grid, clamp at q(0)."""
    return _relu_x(ctx, x, 0.0, None)


@register(OP_SET, "RELU6", differentiable=False)
def RELU6(ctx, x):
    """Quantized RELU6: rescale, clamp to ``[q(0), q(6)]``."""
    return _relu_x(ctx, x, 0.0, 6.0)


@register(OP_SET, "RELU_N1_TO_1", differentiable=False)
def RELU_N1_TO_1(ctx, x):
    """Quantized RELU_N1_TO_1: rescale, clamp to ``[q(-1), q(1)]``."""
    return _relu_x(ctx, x, -1.0, 1.0)


@register(OP_SET, "LEAKY_RELU", differentiable=False)
def LEAKY_RELU(ctx, x, *, alpha=0.0):
    """Quantized LEAKY_RELU (``QuantizeLeakyRelu``): identity multiplier
    ``s_in/s_out`` for ``q >= zp``, alpha multiplier ``s_in*alpha/s_out``
    (float32) below."""
    si, zi = scale_zp(ctx, ctx.inputs[0], "input")
    so, zo = scale_zp(ctx, ctx.outputs[0], "output")
    ma, sa = fp.quantize_multiplier(float(np.float32(np.float32(si * np.float32(alpha)) / so)))
    mi, sidn = fp.quantize_multiplier(float(np.float32(si / so)))
    v = as_i32(x) - zi
    y = zo + jnp.where(v >= 0, fp.mbqm(v, mi, sidn), fp.mbqm(v, ma, sa))
    lo, hi = qrange(ctx.outputs[0].dtype)
    return clamp_cast(y, lo, hi, out_dtype(ctx))


@register(OP_SET, "PRELU", differentiable=False)
def PRELU(ctx, x, alpha):
    """Quantized PRELU (``BroadcastPrelu4DSlow``): ``MBQM(v, s_in/s_out)`` for
    ``v = q - zp_in >= 0``, else ``MBQM(v * (alpha - zp_alpha), s_in*s_alpha/s_out)``."""
    si, zi = scale_zp(ctx, ctx.inputs[0], "input")
    sal, zal = scale_zp(ctx, ctx.inputs[1], "alpha")
    so, zo = scale_zp(ctx, ctx.outputs[0], "output")
    m1, s1 = fp.quantize_multiplier(float(np.float32(si / so)))
    m2, s2 = fp.quantize_multiplier(float(np.float32(np.float32(si * sal) / so)))
    v = as_i32(x) - zi
    a = as_i32(alpha) - zal
    y = zo + jnp.where(v >= 0, fp.mbqm(v, m1, s1), fp.mbqm(v * a, m2, s2))
    lo, hi = qrange(ctx.outputs[0].dtype)
    return clamp_cast(y, lo, hi, out_dtype(ctx))


@register(OP_SET, "CONCATENATION", differentiable=False)
def CONCATENATION(ctx, *xs, axis=0, fused_activation_function="NONE"):
    """Quantized CONCATENATION: inputs with the output's (scale, zero point)
    are copied; others are requantized as ``ConcatenationWithScaling`` does
    (``round(q * s + bias) + zp_out`` in float32, ``s = s_in / s_out``)."""
    vo = ctx.outputs[0]
    so, zo = scale_zp(ctx, vo, "output")
    lo, hi = qrange(vo.dtype)
    nd = jnp.asarray(xs[0]).ndim
    ax = int(axis) + nd if int(axis) < 0 else int(axis)
    inv = np.float32(1.0) / so
    parts = []
    for x, v in zip(xs, ctx.inputs):
        si, zi = scale_zp(ctx, v, "input")
        x = jnp.asarray(x)
        if si == so and zi == zo:
            parts.append(x.astype(vo.dtype))
            continue
        sc = np.float32(si * inv)
        bias = np.float32(np.float32(-zi) * sc)
        # Tabulated per input code (numpy float32), so XLA cannot fuse the
        # multiply-add into an FMA.
        ilo, ihi = qrange(v.dtype)
        f = (np.arange(ilo, ihi + 1).astype(np.float32) * sc).astype(np.float32) + bias
        table = np.clip(np.sign(f) * np.floor(np.abs(f.astype(np.float64)) + 0.5) + zo, lo, hi).astype(np.int32)
        parts.append(lookup(table.astype(vo.dtype), x, ilo))
    y = jnp.concatenate(parts, axis=ax)
    if fused_activation_function not in (None, "NONE"):
        lo2, hi2 = activation_range(ctx, fused_activation_function, vo)
        y = clamp_cast(as_i32(y), lo2, hi2, vo.dtype)
    return y


@register(OP_SET, ("MAXIMUM", "MINIMUM"), differentiable=False)
def MAXIMUM(ctx, a, b):
    """Quantized MAXIMUM/MINIMUM: compare raw values (TFLite requires equal
    quantization parameters)."""
    f = jnp.maximum if ctx.node.op_name == "MAXIMUM" else jnp.minimum
    return f(jnp.asarray(a), jnp.asarray(b)).astype(out_dtype(ctx))


def _squared_difference_kernel(node) -> str | None:
    """Load-time check: LiteRT's quantized SQUARED_DIFFERENCE is 8-bit only."""
    if any(v is not None and np.dtype(v.dtype).itemsize != 1 for v in (*node.inputs, *node.outputs)):
        return ("int16 SQUARED_DIFFERENCE has no kernel: LiteRT has none either (squared_difference.cc: "
                "float32, int32, int8), so there is nothing to reproduce")
    return None


@register(OP_SET, "SQUARED_DIFFERENCE", differentiable=False, check=_squared_difference_kernel)
def SQUARED_DIFFERENCE(ctx, a, b):
    """Quantized SQUARED_DIFFERENCE (8-bit): inputs shifted left by 7,
    rescaled by ``s_i / (2 max s)``, differenced, squared, rescaled by
    ``(2 max s)^2 / (2^14 s_out)``."""
    sa, za = scale_zp(ctx, ctx.inputs[0], "input 1")
    sb, zb = scale_zp(ctx, ctx.inputs[1], "input 2")
    so, zo = scale_zp(ctx, ctx.outputs[0], "output")
    if np.dtype(ctx.outputs[0].dtype).itemsize != 1:
        raise ctx.error("int16 SQUARED_DIFFERENCE is not supported: LiteRT 2.3.0 has no int16 kernel "
                        "(squared_difference.cc: float32, int32, int8), so there is nothing to reproduce")
    ls = 7
    tm = 2.0 * float(max(sa, sb))
    m1, s1 = fp.quantize_multiplier(float(sa) / tm)
    m2, s2 = fp.quantize_multiplier(float(sb) / tm)
    mo, so_ = fp.quantize_multiplier(tm * tm / ((1 << (2 * ls)) * float(so)))
    ya = fp.mbqm(fp.shift_left(as_i32(a) - za, ls), m1, s1)
    yb = fp.mbqm(fp.shift_left(as_i32(b) - zb, ls), m2, s2)
    d = ya - yb
    lo, hi = qrange(ctx.outputs[0].dtype)
    return fp.requantize(d * d, mo, so_, offset=zo, clamp=(lo, hi), dtype=out_dtype(ctx))


@register(OP_SET, ("TRANSPOSE",), differentiable=False, static_inputs=(1,))
def TRANSPOSE(ctx, x, perm):
    """Quantized TRANSPOSE: permute axes of the codes."""
    return jnp.transpose(jnp.asarray(x), [int(p) for p in np.asarray(perm).reshape(-1)])
