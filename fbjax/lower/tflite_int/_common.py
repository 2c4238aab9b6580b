"""Helpers shared by the integer-exact TFLite lowerings (op set ``"tflite.int"``).

Quantization parameters are read from the node's :class:`~fbjax.ir.Value`
specs at trace time (they are load-time constants); everything computed from
them (multipliers, shifts, lookup tables, activation ranges) is numpy, and the
data path is int32 ``jax.lax`` arithmetic.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import fixedpoint as fp

INT_TYPES = (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16))


def qparams(ctx, v, what="tensor"):
    """``(scale float32 1-D, zero_point int32 1-D)`` of ``v``; errors name the node."""
    if v is None or v.quant is None:
        raise ctx.error(f"{what} {'' if v is None else repr(v.name)} has no quantization parameters")
    return (np.asarray(v.quant.scale, np.float32).reshape(-1),
            np.asarray(v.quant.zero_point).astype(np.int64).reshape(-1).astype(np.int32))


def scale_zp(ctx, v, what="tensor"):
    """Per-tensor ``(scale np.float32, zero_point int)``."""
    s, z = qparams(ctx, v, what)
    if s.size != 1:
        raise ctx.error(f"{what} {v.name!r} is per-channel quantized ({s.size} scales); expected per-tensor")
    return np.float32(s[0]), int(z[0]) if z.size else 0


def qrange(dtype):
    """``(min, max)`` of an integer dtype."""
    info = np.iinfo(np.dtype(dtype))
    return int(info.min), int(info.max)


def quantize_f32(value: float, scale: np.float32, zp: int) -> int:
    """``zp + (int)TfLiteRound(value / scale)`` in float32."""
    return zp + int(fp.round_half_away(float(np.float32(value) / np.float32(scale))))


def activation_range(ctx, fused, out_v):
    """``CalculateActivationRangeQuantized``: clamp bounds for a fused
    activation on the output's integer grid (``TANH``/``SIGN_BIT`` rejected)."""
    lo, hi = qrange(out_v.dtype)
    s, z = scale_zp(ctx, out_v, "output")
    if fused in (None, "NONE"):
        return lo, hi
    if fused == "RELU":
        return max(lo, quantize_f32(0.0, s, z)), hi
    if fused == "RELU6":
        return max(lo, quantize_f32(0.0, s, z)), min(hi, quantize_f32(6.0, s, z))
    if fused == "RELU_N1_TO_1":
        return max(lo, quantize_f32(-1.0, s, z)), min(hi, quantize_f32(1.0, s, z))
    raise ctx.error(f"fused activation {fused} is not supported on quantized tensors")


def lookup(table, x, lo=0):
    """``table[x - lo]`` for a load-time numpy ``table`` and indices in range
    by construction (gather clamping is then never used, so
    ``mode="clip"``: one gather, no negative-index fix-up). ``x`` of an
    8-bit or 16-bit type whose codes cover the table exactly (``lo`` its
    minimum, ``table`` one entry per code) indexes through its unsigned
    reinterpretation, the table rotated to match: no arithmetic on ``x``.
    Other ``x``: int32 ``x - lo``."""
    table = np.asarray(table)
    x = jnp.asarray(x)
    dt = np.dtype(x.dtype)
    if dt.kind in "iu" and dt.itemsize <= 2 and table.size == 1 << (8 * dt.itemsize) and lo == np.iinfo(dt).min:
        if dt.kind == "i":
            table = table[np.arange(table.size) ^ (table.size >> 1)]  # code c sits at c mod 2^bits
            x = jax.lax.bitcast_convert_type(x, np.dtype(f"uint{8 * dt.itemsize}"))
    else:
        if dt != np.int32:
            x = jax.lax.convert_element_type(x, np.int32)
        if lo:
            x = jax.lax.sub(x, np.int32(lo))
    dn = jax.lax.GatherDimensionNumbers(offset_dims=(), collapsed_slice_dims=(0,), start_index_map=(0,))
    return jax.lax.gather(jnp.asarray(table), jax.lax.expand_dims(x, (x.ndim,)), dn, slice_sizes=(1,),
                          mode=jax.lax.GatherScatterMode.CLIP)


def as_i32(x):
    x = jnp.asarray(x)
    return x if x.dtype == np.int32 else jax.lax.convert_element_type(x, np.int32)


def clamp_cast(x, lo, hi, dtype):
    """Clamp int32 ``x`` to ``[lo, hi]`` and cast to ``dtype``."""
    return jnp.clip(x, jnp.int32(lo), jnp.int32(hi)).astype(np.dtype(dtype))


def out_dtype(ctx, i=0):
    return np.dtype(ctx.outputs[i].dtype)


def require_x64(ctx, what):
    """16x8 kernels accumulate in int64 like TFLite; that needs x64 tracing."""
    if not jax.config.jax_enable_x64:
        raise ctx.error(
            f"{what} with int16 activations accumulates in int64; call the model through fbjax.Model "
            "(which enables x64 for models with int64 tensors) or enable jax_enable_x64"
        )


def mbqm64(x, multiplier, shift):
    """``MultiplyByQuantizedMultiplier(int64 x, M, shift)`` (TFLite
    ``common.h``, the int64 overload used by the 16x8 kernels): the
    multiplier is reduced to 15 bits, ``(x * M15 + 2^(s-1)) >> s`` with
    ``s = 15 - shift``."""
    m = np.asarray(multiplier, np.int64)
    reduced = np.where(m < 0x7FFF0000, (m + (1 << 15)) >> 16, 0x7FFF).astype(np.int64)
    total = (15 - np.asarray(shift, np.int64)).astype(np.int64)
    rnd = (np.int64(1) << (total - 1)).astype(np.int64)
    x = jnp.asarray(x, jnp.int64)
    y = x * jnp.asarray(reduced) + jnp.asarray(rnd)
    return jax.lax.shift_right_arithmetic(y, jnp.broadcast_to(jnp.asarray(total), y.shape)).astype(jnp.int32)


def round_half_away(x):
    """float32 round half away from zero, exact (``std::round``)."""
    t = jnp.trunc(x)
    frac = x - t
    return t + jnp.where(jnp.abs(frac) >= 0.5, jnp.sign(x), 0).astype(x.dtype)


def conv_multipliers(ctx, in_v, w_v, out_v, n_channels, *, float_product=False):
    """Per-output-channel ``QuantizeMultiplier(s_in * s_w[c] / s_out)``.

    ``float_product``: the product ``s_in * s_w`` is taken in float32 first
    (TFLite ``GetQuantizedConvolutionMultipler``, per-tensor FULLY_CONNECTED);
    else in double (``PopulateConvolutionQuantizationParams``).
    """
    s_in, _ = scale_zp(ctx, in_v, "input")
    s_out, _ = scale_zp(ctx, out_v, "output")
    s_w, _ = qparams(ctx, w_v, "weights")
    if s_w.size not in (1, n_channels):
        raise ctx.error(f"{s_w.size} weight scales for {n_channels} output channels")
    s_w = np.broadcast_to(s_w, (n_channels,))
    if float_product:
        reals = [float(np.float32(s_in) * np.float32(w)) / float(s_out) for w in s_w]
    else:
        reals = [float(s_in) * float(w) / float(s_out) for w in s_w]
    return fp.quantize_multipliers(reals)

